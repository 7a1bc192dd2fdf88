"""End to end: an unchanged LightningModule trains under peerd with one extra
Trainer callback (docs/operations.md, "Lightning"). Two real daemons train
tests/jobcode/lightning_script.py (bf16 autocast, two batches per optimizer
step, a StepLR stepped per epoch): both finish with one model, as accurate as
the blobs allow, every optimizer step at the LR the script alone uses in that
epoch, the Trainer's counters at the job's position. A Trainer whose
max_epochs is not the job's epochs is refused before it joins. A newcomer to a
running Lightning job starts in the job's epoch, at its step, with its LR."""

from __future__ import annotations

import hashlib
import json
import re
import textwrap
from pathlib import Path

import pytest

from conftest import all_finished, wait_for
from peerd.peer import total_steps

pytest.importorskip("lightning")

pytestmark = pytest.mark.e2e

JOBCODE = Path(__file__).parents[1] / "jobcode"
EPOCHS, LR, GAMMA, TRAIN, STEP_BATCH = 3, 0.2, 0.5, 1024, 32  # the script's; a step is 16 × 2 samples


def lightning_job(name: str, max_epochs: int, peers: int) -> str:
    # No LR law (reference_batch 0): the script's LR exactly, as the default is.
    return textwrap.dedent(f"""
        [job]
        name = "{name}"
        script = "lightning_script.py"
        args = ["{max_epochs}"]
        epochs = {EPOCHS}
        min_peers = {peers}
        eval_every_rounds = 1000
        metric = "val_acc"
        chance = 0.25
        [gossip]
        period_steps = 1
    """)


def test_a_lightning_module_trains_on_two_peers_and_a_trainer_of_other_epochs_is_refused(local_cluster):
    cluster = local_cluster(2)
    wait_for(lambda: all(cluster.client(p).status().peers_known == 1 for p in cluster.peers), 30, "discovery")
    for peer in cluster.peers:
        cluster.client(peer).join(lightning_job("blobs", EPOCHS, 2), str(JOBCODE))
    cluster.client(cluster.peers[0]).join(lightning_job("other-epochs", EPOCHS + 1, 1), str(JOBCODE))

    def settled():
        jobs = {(p.peer_id, j.name): j for p in cluster.peers for j in cluster.client(p).status().jobs}
        wrong = jobs.get(("peer-0", "other-epochs"))
        done = all_finished(j for (_, name), j in jobs.items() if name == "blobs")
        return done and len(done) == 2 and wrong is not None and wrong.state == "failed" and jobs

    jobs = wait_for(settled, 300, "the Lightning job to finish on both peers and the other epochs to fail")
    dirs = [p.dir / "state" / "jobs" / "blobs" for p in cluster.peers]
    assert len({hashlib.sha256((d / "model.pt").read_bytes()).hexdigest() for d in dirs}) == 1
    job_steps = total_steps(TRAIN, STEP_BATCH, EPOCHS)
    for d in dirs:
        summary = json.loads((d / "summary.json").read_text())
        used = {epoch: lr for epoch, lr in summary["used"]}
        # One LR per epoch, each the one the script alone uses then: LR × GAMMA^epoch.
        assert len(summary["used"]) == len(used) and sorted(used) == list(range(EPOCHS)), summary["used"]
        for epoch, lr in used.items():
            assert lr == pytest.approx(LR * GAMMA ** epoch, rel=1e-12), (epoch, lr)
        # The Trainer's counters are the job's position: one process's steps, not this peer's share.
        assert summary["current_epoch"] == EPOCHS and summary["global_step"] == job_steps, summary
        assert 0 < summary["steps"] < job_steps, summary
        metrics = json.loads((d / "model.json").read_text())["metrics"]
        # Chance is 0.25 over four balanced blobs; the MLP separates them almost perfectly.
        assert metrics["consensus_val_acc"] > 0.8 and metrics["val_acc"] > 0.8, metrics

    wrong = jobs[("peer-0", "other-epochs")]
    assert f"Trainer(max_epochs={EPOCHS + 1}) must be the job's [job] epochs = {EPOCHS}" in wrong.message, \
        wrong.message
    assert wrong.restarts == 0  # it would fail the same way again


def test_a_newcomer_to_a_running_lightning_job_starts_at_its_epoch_step_and_lr(local_cluster):
    """peer-1 joins once peer-0 has trained past epoch 1 of a job too long to end
    meanwhile; then peer-1 drains and peer-0 is stopped by SIGTERM (the first
    test sees jobs to their end)."""
    cluster = local_cluster(2)
    first, late = cluster.peers
    long = lightning_job("long", 1000, 1).replace("epochs = 3", "epochs = 1000")
    cluster.client(first).join(long, str(JOBCODE))

    def job_of(peer):
        jobs = [j for j in cluster.client(peer).status().jobs if j.name == "long"]
        return jobs[0] if jobs else None

    wait_for(lambda: (j := job_of(first)) and j.progress.epoch >= 2, 120, "peer-0 to train two epochs alone")
    wait_for(lambda: any(j.name == "long" for j in cluster.client(late).jobs().jobs), 30, "peer-1 to hear of it")
    cluster.client(late).join_by_name("long", str(JOBCODE))
    wait_for(lambda: (j := job_of(late)) and j.progress.step >= 3, 120, "the newcomer to take three steps")
    cluster.client(late).leave("long", drain=True)
    cluster.client(first).leave("long")  # SIGTERM: peerd's handling, not the Trainer's, ends the round and leaves
    wait_for(lambda: job_of(first) is None and job_of(late) is None, 60, "both to leave")
    log = (first.dir / "state" / "jobs" / "long" / "worker.log").read_text()
    assert re.search(r"leaving at round \d+: stopped by signal", log) and "peerd.lightning: stopped at epoch" in log
    assert "SIGTERMException" not in log and "Traceback" not in log

    summary = json.loads((late.dir / "state" / "jobs" / "long" / "summary.json").read_text())
    epoch, step = summary["start"]
    per_epoch = TRAIN // STEP_BATCH  # one process's optimizer steps per epoch
    # The job's epoch (past those peer-0 trained alone) and step: one process's, not this peer's 0.
    assert epoch >= 2 and per_epoch * epoch <= step <= per_epoch * (epoch + 1), summary["start"]
    # The StepLR came with the job's state: the first step trains at the LR of the job's epoch.
    first_epoch, lr = summary["used"][0]
    assert first_epoch == epoch and lr == pytest.approx(LR * GAMMA ** epoch, rel=1e-12), summary["used"][:3]
    assert 0 < summary["steps"] < summary["global_step"] - step + 1, summary
