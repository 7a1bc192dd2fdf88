"""End to end: an unchanged LightningModule trains under peerd with one extra
Trainer callback (docs/operations.md, "Lightning"). Three real daemons train
tests/jobcode/lightning_bn_script.py (BatchNorm, AdamW, an ExponentialLR
stepped per epoch, two batches per optimizer step, bf16 autocast), the third
joining in the middle, while the same script trains alone in one process: all
three finish with one model, BatchNorm's running statistics in it, within a
point of alone's accuracy; every optimizer step at the LR the script alone
uses in that epoch, the Trainer's counters at the job's position. A Trainer
whose max_epochs is not the job's epochs is refused before it joins. A
newcomer to a running job of tests/jobcode/lightning_script.py (SGD, a StepLR)
starts in the job's epoch, at its step, with its LR."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
import torch

from conftest import wait_for
from e2e_helpers import Alone, join_held, release, script_job, trained_with_a_late_join
from peerd.peer import total_steps

pytest.importorskip("lightning")

pytestmark = pytest.mark.e2e

JOBCODE = Path(__file__).parents[1] / "jobcode"
EPOCHS, LR, GAMMA, TRAIN, STEP_BATCH = 3, 0.2, 0.5, 1024, 32  # lightning_script.py's; a step is 16 × 2 samples
BN_TRAIN, BN_SHIFT = 6144, 5.0  # lightning_bn_script.py's samples and its inputs' offset; its steps are 16 × 2


def lightning_job(name: str, max_epochs: int, peers: int, script: str = "lightning_script.py",
                  chance: float = 0.25, epochs: int = EPOCHS) -> str:
    return script_job(name, script, [str(max_epochs)], epochs, peers, metric="val_acc", chance=chance)


def bn_job(name: str, max_epochs: int, peers: int) -> str:
    return lightning_job(name, max_epochs, peers, "lightning_bn_script.py", 1 / 6)


def test_a_batchnorm_adamw_module_on_three_peers_one_joining_late_ends_as_alone(local_cluster, tmp_path):
    alone = Alone("lightning_bn_script.py", tmp_path / "alone", ("plain",))
    try:
        cluster = local_cluster(3)
        # peer-2 joins in the job's second epoch.
        jobs = trained_with_a_late_join(cluster, "bn", bn_job("bn", EPOCHS, 2), bn_job("other-epochs", EPOCHS + 1, 1), 1)
        by_itself = alone.summary()
    finally:
        alone.close()
    dirs = [p.dir / "state" / "jobs" / "bn" for p in cluster.peers]
    assert len({hashlib.sha256((d / "model.pt").read_bytes()).hexdigest() for d in dirs}) == 1
    per_epoch = dict(map(tuple, by_itself["used"]))  # alone: one LR per epoch, LR × GAMMA^epoch
    assert sorted(per_epoch) == list(range(EPOCHS)) and len(set(per_epoch.values())) == EPOCHS, per_epoch
    job_steps = total_steps(BN_TRAIN, STEP_BATCH, EPOCHS)
    assert by_itself["global_step"] == job_steps
    ends = {}  # each peer's global_step after fit: its current_epoch
    for d in dirs:
        summary = json.loads((d / "summary.json").read_text())
        # Each optimizer step at the LR the script alone uses in that epoch; the newcomer's from its first.
        assert summary["used"] and len(summary["used"]) == summary["steps"], summary
        for epoch, lr in summary["used"]:
            assert lr == pytest.approx(per_epoch[epoch], rel=1e-12), (d, epoch, lr)
        # The Trainer's counters are the job's position: one process's steps, not this peer's share. The
        # first member at the end ends the job for all; one behind it stops where it is (docs/algorithms.md,
        # "One agreed end"): behind by a join's offset, or more when the machine starved it.
        assert 0 < summary["steps"] < summary["global_step"] <= job_steps, summary
        ends[summary["global_step"]] = summary["current_epoch"]
        metrics = json.loads((d / "model.json").read_text())["metrics"]
        # Chance is 1/6; the blobs overlap, alone reaches about 0.97: the job's model within a point of it.
        assert abs(metrics["consensus_val_acc"] - by_itself["val_acc"]) <= 0.01, (metrics, by_itself)
        assert summary["val_acc"] == pytest.approx(metrics["consensus_val_acc"], abs=1e-6), (summary, metrics)
    assert ends.get(job_steps) == EPOCHS, ends  # the one that ended the job: at its end
    # peer-2 started in the job's second epoch, at its step; its steps above at that epoch's LR.
    epoch, step = json.loads((dirs[2] / "summary.json").read_text())["start"]
    assert epoch >= 1 and step >= job_steps // EPOCHS, (epoch, step)
    model, own = torch.load(dirs[0] / "model.pt"), torch.load(tmp_path / "alone" / "alone.pt")
    # BatchNorm's running statistics are in the model: those of the raw inputs (offset 5, spread ~3 × 1.9),
    # as alone's, within what the last batches' running average moves them; not the initial 0 and 1.
    assert model["net.0.num_batches_tracked"] > 0 and model["net.2.num_batches_tracked"] > 0
    assert torch.allclose(model["net.0.running_mean"], own["net.0.running_mean"], atol=1.5)
    assert model["net.0.running_mean"].mean() == pytest.approx(BN_SHIFT, abs=1.0)
    assert torch.allclose(model["net.0.running_var"], own["net.0.running_var"], rtol=0.5)

    wrong = jobs[("peer-0", "other-epochs")]
    assert f"Trainer(max_epochs={EPOCHS + 1}) must be the job's [job] epochs = {EPOCHS}" in wrong.message, \
        wrong.message
    assert wrong.restarts == 0  # it would fail the same way again


def test_a_newcomer_to_a_running_lightning_job_starts_at_its_epoch_step_and_lr(local_cluster):
    """peer-1 joins once peer-0 has trained past epoch 1 of a job too long to end
    meanwhile (its worker started with peer-0's, held before fit()); then
    peer-1 drains and peer-0 is stopped by SIGTERM (the first test sees jobs to
    their end)."""
    cluster = local_cluster(2)
    first, late = cluster.peers
    long = lightning_job("long", 1000, 1, epochs=1000)
    cluster.client(first).join(long, str(JOBCODE))

    def job_of(peer):
        jobs = [j for j in cluster.client(peer).status().jobs if j.name == "long"]
        return jobs[0] if jobs else None

    held = join_held(cluster, late, "long")
    wait_for(lambda: (j := job_of(first)) and j.progress.epoch >= 2, 120, "peer-0 to train two epochs alone")
    release(held)
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
