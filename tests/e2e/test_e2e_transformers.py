"""End to end: a Hugging Face Trainer script under peerd.transformers
(docs/operations.md, "Hugging Face Trainer"). Two real daemons train a tiny
GPT-2 whose LM head is tied to its embedding, with gradient accumulation and
bf16; each peer trains its half of the data, the Trainer's state and LR
schedule follow the job, and both end with the same model, saved by peerd and
with save_pretrained, the head still tied. A Trainer whose epochs are not the
job's is refused with the fix in the job's message."""

from __future__ import annotations

import hashlib
import json
import math
import textwrap
from pathlib import Path

import pytest

from conftest import all_finished, wait_for, wait_for_discovery

pytestmark = pytest.mark.e2e

JOBCODE = Path(__file__).parents[1] / "jobcode"
EPOCHS, SAMPLES, STEP = 2, 1024, 32  # the job's; the script's windows and samples per optimizer step (16 × 2)
PRETRAINED = ("config.json", "generation_config.json", "model.safetensors")  # what save_pretrained writes


def trainer_job(name: str, trainer_epochs: int, peers: int) -> str:
    return textwrap.dedent(f"""
        [job]
        name = "{name}"
        script = "hf_trainer_script.py"
        args = ["{trainer_epochs}"]
        epochs = {EPOCHS}
        min_peers = {peers}
        metric = "eval_loss"
        eval_every_rounds = 8
        [gossip]
        period_steps = 2
    """)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_trainer_script_trains_a_tied_gpt2_on_two_peers_and_a_length_mismatch_is_refused(local_cluster,
                                                                                          monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the daemons' workers inherit it: nothing from the hub
    cluster = local_cluster(2)
    wait_for_discovery(cluster)
    for peer in cluster.peers:
        cluster.client(peer).join(trainer_job("hf", EPOCHS, 2), str(JOBCODE))
    cluster.client(cluster.peers[0]).join(trainer_job("hf-mismatch", 3, 1), str(JOBCODE))

    def settled():
        jobs = {(p.peer_id, j.name): j for p in cluster.peers for j in cluster.client(p).status().jobs}
        wrong = jobs.get(("peer-0", "hf-mismatch"))
        done = all_finished(j for (_, name), j in jobs.items() if name == "hf")
        return done and len(done) == 2 and wrong is not None and wrong.state == "failed" and jobs

    jobs = wait_for(settled, 300, "the Trainer job to finish on both peers and the mismatch to fail")
    wrong = jobs[("peer-0", "hf-mismatch")]
    assert "TrainingArguments(num_train_epochs=3) and the job's [job] epochs = 2 differ" in wrong.message, wrong.message
    assert wrong.restarts == 0  # it would fail the same way again

    dirs = [p.dir / "state" / "jobs" / "hf" for p in cluster.peers]
    summaries = [json.loads((d / "summary.json").read_text()) for d in dirs]
    for s, peer in zip(summaries, cluster.peers):
        progress = jobs[(peer.peer_id, "hf")].progress
        assert s["micro"] == 2 * s["steps"] > 0, s  # two micro-batches per optimizer step
        assert s["dtypes"] == ["torch.bfloat16"], s  # bf16 autocast in training
        # peer.step() counted each optimizer step's samples: peerd's global batch is both peers' 16 × 2.
        assert progress.samples == s["samples"] and progress.global_batch == 2 * STEP, progress
        assert 0 < progress.loss < math.log(96), progress  # the training loss reached peerd
        # The Trainer's state and its linear schedule followed the job, not this peer's half of the steps.
        total = EPOCHS * SAMPLES // STEP
        assert s["global_step"] == s["max_steps"] == s["scheduler_steps"] == total > s["steps"], s
        assert s["epoch"] == EPOCHS and s["last_lr"] == [0.0, 0.0], s
        positions = s["positions"]
        assert positions == sorted(set(positions)) and positions[-1] == total, positions
        # eval_steps=25: when the job's position passed 25 and 50 (not a multiple with two peers); then
        # the Trainer's own evaluation at the end, where its version has one.
        evaluated = s["evaluated_at"]
        assert evaluated[:2] == [next(g for g in positions if g >= n) for n in (25, 50)], s
        assert evaluated[2:] in ([], [total]), s
        assert s["peerd_evaluations"] >= 1, s  # trainer.evaluate() as peerd's evaluation, between steps
        assert all(0 < loss < math.log(96) for loss in s["logged_losses"]), s
    # peerd's sampler split the data: every sample trained once per epoch, by one peer or the other.
    assert sum(s["samples"] for s in summaries) == EPOCHS * SAMPLES, summaries
    assert all(s["steps"] > 0 for s in summaries)

    assert len({digest(d / "model.pt") for d in dirs}) == 1
    for name in PRETRAINED:
        assert len({digest(d / name) for d in dirs}) == 1, name
    import torch
    from transformers import GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    state = torch.load(dirs[0] / "model.pt", weights_only=True)
    assert torch.equal(state["lm_head.weight"], state["transformer.wte.weight"])  # tied through every average
    hf_logging.disable_progress_bar()  # its bar's monitor thread would outlive the test
    try:
        loaded = GPT2LMHeadModel.from_pretrained(dirs[0])
    finally:
        hf_logging.enable_progress_bar()
    assert loaded.lm_head.weight.data_ptr() == loaded.transformer.wte.weight.data_ptr()
    assert torch.equal(loaded.lm_head.weight, state["lm_head.weight"])
    for d in dirs:  # a uniform guess over the 96 characters scores ln 96 = 4.56
        metrics = json.loads((d / "model.json").read_text())["metrics"]
        assert metrics["consensus_eval_loss"] < math.log(96) and metrics["consensus_peers"] == 2, metrics
