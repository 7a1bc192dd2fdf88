"""End to end: a script's per-epoch schedule keeps its meaning under peerd
(docs/operations.md, "Script jobs": schedulers). Two real daemons train a
StepLR script stepped once per epoch; every optimizer step uses the LR the same
script alone uses in that epoch of the job. Declared in the wrong unit, the
script is stopped with the fix in its message."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from conftest import all_finished, wait_for, wait_for_discovery
from e2e_helpers import script_job

pytestmark = pytest.mark.e2e

JOBCODE = Path(__file__).parents[1] / "jobcode"
EPOCHS, LR, GAMMA = 3, 0.1, 0.3  # the script's


def steplr_job(name: str, interval: str, peers: int) -> str:
    return script_job(name, "steplr_script.py", [interval], EPOCHS, peers, local_batch=32)


def test_a_per_epoch_steplr_uses_the_lr_of_the_jobs_epoch_and_a_wrong_unit_is_refused(local_cluster):
    cluster = local_cluster(2)
    wait_for_discovery(cluster)
    for peer in cluster.peers:
        cluster.client(peer).join(steplr_job("steplr", "epoch", 2), str(JOBCODE))
    cluster.client(cluster.peers[0]).join(steplr_job("wrong-unit", "step", 1), str(JOBCODE))

    def settled():
        jobs = {(p.peer_id, j.name): j for p in cluster.peers for j in cluster.client(p).status().jobs}
        wrong = jobs.get(("peer-0", "wrong-unit"))
        done = all_finished(j for (_, name), j in jobs.items() if name == "steplr")
        return done and len(done) == 2 and wrong is not None and wrong.state == "failed" and jobs

    jobs = wait_for(settled, 300, "the StepLR job to finish on both peers and the wrong unit to fail")
    dirs = [p.dir / "state" / "jobs" / "steplr" for p in cluster.peers]
    for d in dirs:
        summary = json.loads((d / "summary.json").read_text())
        used = {epoch: lr for epoch, lr in summary["used"]}
        # One LR per epoch, each the one the script alone uses then: LR × GAMMA^epoch.
        assert len(summary["used"]) == len(used) and sorted(used) == list(range(EPOCHS)), summary["used"]
        for epoch, lr in used.items():
            assert lr == pytest.approx(LR * GAMMA ** epoch, rel=1e-12), (epoch, lr)
    assert len({hashlib.sha256((d / "model.pt").read_bytes()).hexdigest() for d in dirs}) == 1
    for d in dirs:  # chance is 0.1; this MLP reaches ~0.9 on the digits in three epochs
        assert json.loads((d / "model.json").read_text())["metrics"]["consensus_accuracy"] > 0.8

    wrong = jobs[("peer-0", "wrong-unit")]
    assert 'does not call scheduler.step() after its optimizer step' in wrong.message, wrong.message
    assert 'attach it with scheduler_interval="epoch"' in wrong.message, wrong.message
    assert wrong.restarts == 0  # it would fail the same way again
