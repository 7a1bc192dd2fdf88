"""bench/dbs.py's job module: the built-in MNIST job, whose evaluation is a
snapshot scored out of band.

peerd calls `evaluate` every `eval_every_rounds` rounds (and once at the end);
here it only saves the peer's model, with the time it was taken, under
$PEERD_BENCH_SNAPSHOTS/<peer>/, and returns a placeholder accuracy of 0. The
bench scores the snapshots once the training is over, as it scores the DDP
baseline's, so neither side spends training time on evaluations, and a
crossing of the target is timed at the moment the model was taken. `loss`
records the time of the peer's first step. Times are time.monotonic(), one
clock for every process of the machine (CLOCK_MONOTONIC on Linux).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

from peerd.examples.mnist import make_datasets, make_model
from peerd.worker.train.jobmodule import default_loss

__all__ = ["make_model", "make_datasets", "loss", "evaluate"]  # the job module's callables

ENV = "PEERD_BENCH_SNAPSHOTS"
_started = False
_taken = 0


def _peer_dir() -> Path:
    """This worker's folder: named by its --peer-id (the worker's command line)."""
    argv = sys.argv
    peer = argv[argv.index("--peer-id") + 1] if "--peer-id" in argv else str(os.getpid())
    path = Path(os.environ[ENV]) / peer
    path.mkdir(parents=True, exist_ok=True)
    return path


def loss(model, batch):
    global _started
    if not _started:
        _started = True
        (_peer_dir() / "first-step.json").write_text(json.dumps({"t": time.monotonic()}))
    return default_loss(model, batch)


def evaluate(model, batches) -> dict[str, float]:
    global _taken
    taken = time.monotonic()
    state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    torch.save({"t": taken, "state": state}, _peer_dir() / f"snap-{_taken:05d}.pt")
    _taken += 1
    return {"accuracy": 0.0}
