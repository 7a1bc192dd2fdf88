"""End to end: a script whose first step is slow (docs/operations.md, `[job]
first_step_warning_s`). The warning and the phase shown change nothing else: a
SIGTERM before the first step still leaves after that step (the round of 4
steps it begins is not waited for) with a checkpoint of it, as it would later in
the job."""

from __future__ import annotations

import os
import signal
import textwrap
from pathlib import Path

import pytest

from conftest import wait_for

pytestmark = pytest.mark.e2e

JOBCODE = Path(__file__).parents[1] / "jobcode"


def test_a_sigterm_before_a_slow_first_step_leaves_after_it_with_a_checkpoint(local_cluster):
    cluster = local_cluster(1)
    [peer] = cluster.peers
    job = textwrap.dedent("""
        [job]
        name = "slow-start"
        script = "slow_first_step.py"
        epochs = 50
        local_batch = 16
        first_step_warning_s = 0.5
        [gossip]
        period_steps = 4
    """)
    cluster.client(peer).join(job, str(JOBCODE))
    job_dir = peer.dir / "state" / "jobs" / "slow-start"
    log = job_dir / "worker.log"
    wait_for(lambda: log.exists() and "no peer.step() in 0.5 s since peerd.attach()" in log.read_text(), 120,
             "the no-step warning")
    [status] = cluster.client(peer).status().jobs
    assert status.progress.phase == "waiting for peer.step()" and status.progress.training, status.progress
    pid = status.worker_pid
    os.kill(pid, signal.SIGTERM)  # handled before the script's next look for the go file
    (job_dir / "go").touch()
    wait_for(lambda: "written (stopped by signal)" in log.read_text(), 120, "the checkpoint of the first step")
    text = log.read_text()
    assert "round 0: stopped by signal after 1 local step(s) of the round; no exchange for it" in text, text[-3000:]
    assert "leaving at round 0: stopped by signal" in text, text[-3000:]
    assert "checkpoint of round 0 written (stopped by signal)" in text, text[-3000:]
    assert "KeyboardInterrupt" not in text, text[-3000:]
