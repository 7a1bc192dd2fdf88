"""End to end: a script's own training keeps its meaning under peerd
(docs/operations.md, "Script jobs": what peerd changes). Two real daemons train
a script; the same script runs alone, in one plain process, in the same test:

- fine-tuning under a frozen BatchNorm backbone: every frozen tensor of every
  peer's model.pt is bit for bit the one the script started from, although the
  job averages buffers on a bf16 wire; the head learns as alone does;
- gradient accumulation (micro-batches of 8, a step every 4): every optimizer
  step uses the LR alone uses in that epoch times the law's factor, the factor
  the worker's log and `peerctl status` show.
"""

from __future__ import annotations

import hashlib
import json
import re
import textwrap
from pathlib import Path

import pytest
import torch

from conftest import all_finished, peerctl, wait_for, wait_for_discovery
from e2e_helpers import Alone

pytestmark = pytest.mark.e2e

JOBCODE = Path(__file__).parents[1] / "jobcode"


def script_job(name: str, script: str, epochs: int, optimizer: str, gossip: str = "") -> str:
    return textwrap.dedent(f"""
        [job]
        name = "{name}"
        script = "{script}"
        epochs = {epochs}
        min_peers = 2
        eval_every_rounds = 100000
        [optimizer]
        {optimizer}
        [gossip]
        {gossip}
    """)


def trained_on_two(local_cluster, text: str, name: str) -> tuple[object, list[Path]]:
    """Two daemons train the job to its end; returns the cluster and each peer's job directory."""
    cluster = local_cluster(2)
    wait_for_discovery(cluster)
    for peer in cluster.peers:
        cluster.client(peer).join(text, str(JOBCODE))
    wait_for(lambda: all_finished(j for p in cluster.peers for j in cluster.client(p).status().jobs
                                  if j.name == name), 120, f"{name} to finish on both peers")
    dirs = [p.dir / "state" / "jobs" / name for p in cluster.peers]
    assert len({hashlib.sha256((d / "model.pt").read_bytes()).hexdigest() for d in dirs}) == 1  # one model
    return cluster, dirs


def consensus_accuracy(job_dir: Path) -> float:
    return json.loads((job_dir / "model.json").read_text())["metrics"]["consensus_accuracy"]


def shown(cluster) -> list[dict]:
    """Each peer's progress as `peerctl --json status` shows it; the human status
    says the same LR law and factor under its table."""
    progress = []
    for peer in cluster.peers:
        [job] = json.loads(peerctl(peer, "status", "--json").stdout)["jobs"]
        p = job["progress"]
        human = peerctl(peer, "status").stdout
        assert f"{job['name']}/{peer.peer_id}: LR: {p['lr_law']}: factor {p['lr_scale']:.3f}" in human, human
        progress.append(p)
    return progress


def test_a_frozen_batchnorm_backbone_stays_bit_identical_and_the_head_learns_as_alone(local_cluster, tmp_path):
    alone = Alone("frozen_bn_script.py", tmp_path / "alone")
    try:
        # Buffers in the gossiped vector on a bf16 wire: an average would move them.
        text = script_job("finetune", "frozen_bn_script.py", 6, 'reference_batch = 32\nscaling = "none"',
                          'wire = "bf16"\naverage_buffers = true')
        cluster, dirs = trained_on_two(local_cluster, text, "finetune")
        by_itself = alone.summary()
    finally:
        alone.close()
    initial = torch.load(dirs[0] / "initial.pt")
    frozen = [name for name in initial if name.startswith("0.")]  # the backbone: Linear, BatchNorm and its counter
    assert "0.1.running_mean" in frozen and "0.1.num_batches_tracked" in frozen
    for d in dirs:
        model = torch.load(d / "model.pt")
        for name in frozen:
            assert torch.equal(model[name], initial[name]), (d, name)
        assert not torch.equal(model["1.weight"], initial["1.weight"])  # the head trained
    # chance is 0.25; alone reaches about 0.915
    assert abs(consensus_accuracy(dirs[0]) - by_itself["accuracy"]) <= 0.01, (consensus_accuracy(dirs[0]), by_itself)
    law = 'no scaling: the script\'s LR exactly ([optimizer] scaling = "none")'
    assert [(p["lr_law"], p["lr_scale"]) for p in shown(cluster)] == [(law, 1.0)] * 2
    logged = f"LR: {law}; global batch 64: LR scale 1.000".replace('"', '\\"')  # a logfmt msg="..."
    assert logged in (dirs[0] / "worker.log").read_text()


def test_an_accumulating_script_steps_at_its_lr_alone_times_the_logged_factor(local_cluster, tmp_path):
    alone = Alone("accumulate_script.py", tmp_path / "alone")
    try:
        # The script was tuned alone at 32 samples a step: two peers make 64, the √ law's factor √2.
        text = script_job("accumulate", "accumulate_script.py", 6, "reference_batch = 32")
        cluster, dirs = trained_on_two(local_cluster, text, "accumulate")
        by_itself = alone.summary()
    finally:
        alone.close()
    per_epoch = dict(map(tuple, by_itself["used"]))
    assert sorted(per_epoch) == list(range(6)) and len(set(per_epoch.values())) == 6  # a StepLR: one LR per epoch
    law = "sqrt law against the reference batch 32, cap 2"
    progress = shown(cluster)
    factor = progress[0]["lr_scale"]
    assert factor == pytest.approx(2 ** 0.5, rel=1e-12)
    for d, p in zip(dirs, progress):
        assert (p["lr_law"], p["lr_scale"], p["global_batch"]) == (law, factor, 64)
        assert p["samples"] == 32 * p["step"]  # each step counted as its 4 micro-batches of 8
        logged = re.findall(r"LR: (.+); global batch (\d+): LR scale ([\d.]+)", (d / "worker.log").read_text())
        assert logged == [(law, "64", f"{factor:.3f}")]  # once, at the first step: 2 × 8 × 4 samples
        used = json.loads((d / "summary.json").read_text())["used"]
        assert len(used) == p["step"] and sorted({epoch for epoch, _ in used}) == list(range(6))
        for epoch, lr in used:
            assert lr == pytest.approx(per_epoch[epoch] * factor, rel=1e-12), (epoch, lr)
    # chance is 0.25; alone reaches about 0.98
    assert abs(consensus_accuracy(dirs[0]) - by_itself["accuracy"]) <= 0.01, (consensus_accuracy(dirs[0]), by_itself)
