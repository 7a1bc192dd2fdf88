"""End to end: a Hugging Face Trainer script under peerd.transformers
(docs/operations.md, "Hugging Face Trainer"). Three real daemons train a tiny
GPT-2 whose LM head is tied to its embedding, with gradient accumulation and
bf16; two start the job, the third joins in its first epoch. Each peer trains
its part of the data, the Trainer's state and LR schedule follow the job, and
all end with the same model, saved by peerd and with save_pretrained, the head
still tied, as good as the same script alone at the job's global batch (what
DDP over three processes trains). A Trainer whose epochs are not the job's is
refused with the fix in the job's message."""

from __future__ import annotations

import hashlib
import json
import math
import textwrap
from pathlib import Path

import pytest

from e2e_helpers import Alone, trained_with_a_late_join

pytestmark = pytest.mark.e2e

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


def test_a_trainer_script_trains_a_tied_gpt2_on_three_peers_one_joining_late_as_ddp_would(local_cluster, tmp_path,
                                                                                           monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the daemons' workers and the script alone inherit it
    alone = Alone("hf_trainer_script.py", tmp_path / "alone", ("plain", "3"))
    try:
        cluster = local_cluster(3)
        # peer-2 joins half way through the first epoch.
        jobs = trained_with_a_late_join(cluster, "hf", trainer_job("hf", EPOCHS, 2), trainer_job("other-epochs", 3, 1),
                                        0.5)
        by_itself = alone.summary()
    finally:
        alone.close()
    wrong = jobs[("peer-0", "other-epochs")]
    assert "TrainingArguments(num_train_epochs=3) and the job's [job] epochs = 2 differ" in wrong.message, wrong.message
    assert wrong.restarts == 0  # it would fail the same way again

    dirs = [p.dir / "state" / "jobs" / "hf" for p in cluster.peers]
    summaries = [json.loads((d / "summary.json").read_text()) for d in dirs]
    total = EPOCHS * SAMPLES // STEP  # the optimizer steps of one process over the job
    for s, peer, d in zip(summaries, cluster.peers, dirs):
        progress = jobs[(peer.peer_id, "hf")].progress
        assert s["micro"] == 2 * s["steps"] > 0, s  # two micro-batches per optimizer step
        assert s["dtypes"] == ["torch.bfloat16"], s  # bf16 autocast in training
        # peer.step() counted each optimizer step's samples: peerd's global batch is the three peers' 16 × 2.
        assert progress.samples == s["samples"] and progress.global_batch == 3 * STEP, progress
        assert 0 < progress.loss < math.log(96), progress  # the training loss reached peerd
        # The Trainer's state and its linear schedule followed the job, not this peer's share of the steps;
        # a member behind the one that ended the job stops where it is (docs/algorithms.md, "One agreed end").
        assert s["max_steps"] == total and s["scheduler_steps"] == s["global_step"] <= total, s
        assert s["steps"] < s["global_step"], s
        positions = s["positions"]
        assert positions == sorted(set(positions)) and positions[-1] == s["global_step"], positions
        # eval_steps=25: the Trainer evaluates when the job's position passes a multiple of 25 (not a multiple
        # with several peers), then at the end where its version does.
        passed = [next(g for g in positions if g >= n) for n in (25, 50) if positions[0] < n <= positions[-1]]
        assert s["evaluated_at"][:len(passed)] == passed and s["evaluated_at"][len(passed):] in ([], [total]), s
        assert all(0 < loss < math.log(96) for loss in s["logged_losses"]), s
        log = (d / "worker.log").read_text()
        assert "Writing model shards" not in log and "it/s]" not in log  # no progress bar in a log file
    ended = [s for s in summaries if s["global_step"] == total]
    assert ended and all(s["epoch"] == EPOCHS and s["last_lr"] == [0.0, 0.0] for s in ended), summaries
    for s in summaries[:2]:  # the two that started it: peerd's evaluations on the way (trainer.evaluate())
        assert s["positions"][0] <= 2 and s["peerd_evaluations"] >= 1, s
    # The newcomer joined half way through the first epoch, at the job's position.
    assert summaries[2]["positions"][0] > total // (2 * EPOCHS), summaries[2]["positions"][:3]
    # peerd's sampler split the data: each sample trained once per epoch by one peer or another, but for
    # what a join and the end move (docs/algorithms.md, "Data partition": the joiner's part of a chunk the
    # others started read twice; a member behind the end leaves the rest of its chunk unread).
    chunk = SAMPLES // 8  # [job] epoch_chunks = 8
    assert -2 * chunk <= sum(s["samples"] for s in summaries) - EPOCHS * SAMPLES <= chunk, summaries

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
    for d, s in zip(dirs, summaries):
        metrics = json.loads((d / "model.json").read_text())["metrics"]
        assert metrics["consensus_peers"] == 3, metrics
        # The Trainer's own evaluate() after train() scores the job's model: the consensus.
        assert s["eval_loss"] == pytest.approx(metrics["consensus_eval_loss"], rel=1e-4), (s, metrics)
        # The script alone with the batch of the three peers (one optimizer step on their 3 × 32 samples,
        # as DDP over three processes) takes fewer steps than the job, whose first part ran on two peers:
        # the job's model is at least as good, within 1 %. A uniform guess scores ln 96 = 4.56.
        assert metrics["consensus_eval_loss"] <= 1.01 * by_itself["eval_loss"] < math.log(96), (metrics, by_itself)
