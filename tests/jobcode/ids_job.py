"""A least-squares job that logs the id of every sample it trains on, for the
tests that every sample is read once per epoch across joins and leaves: one
line per micro-batch in $PEERD_TEST_READ_LOG/<peer>-<pid>.txt. Shared data:
SAMPLES samples; local data (a data root): the ids in <root>/ids.pt, each
peer's own."""

import os
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

SAMPLES = 2400
_log = None


def make_model() -> nn.Module:
    return nn.Linear(4, 1)


def make_datasets(ctx):
    global _log
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, 4, generator=gen)
    y = x @ torch.tensor([1.0, -1.0, 2.0, 0.5]) + 0.1 * torch.randn(SAMPLES, generator=gen)
    ids = torch.arange(SAMPLES)
    if ctx.data_root:  # data_mode = "local": this peer's own samples
        ids = torch.load(Path(ctx.data_root) / "ids.pt")
        x, y = x[ids % SAMPLES], y[ids % SAMPLES]
    _log = open(Path(os.environ["PEERD_TEST_READ_LOG"]) / f"{ctx.peer_id}-{os.getpid()}.txt", "a")
    return TensorDataset(x, y, ids), TensorDataset(x[:100], y[:100], ids[:100])


def loss(model, batch):
    x, y, ids = batch
    if model.training:  # not peerd's check of the job code at load (eval mode)
        _log.write(" ".join(map(str, ids.tolist())) + "\n")
        _log.flush()
    return 0.5 * ((model(x).squeeze(1) - y) ** 2).mean()


def evaluate(model, batches):
    total = seen = 0.0
    for x, y, _ in batches:
        total += float(0.5 * ((model(x).squeeze(1) - y) ** 2).sum())
        seen += len(y)
    return {"loss": total / seen}
