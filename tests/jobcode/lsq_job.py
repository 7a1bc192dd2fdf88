"""Least squares on each peer's own data (data_mode = "local"), for the weighting tests.

Peer data lives in `<ctx.data_root>/lsq.pt` as (A, y); the model is x in R^d
(a bias-free linear layer, starting at 0) and the loss is ½·mean((A x − y)²).
"""

from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

FILE = "lsq.pt"


def make_model() -> nn.Module:
    model = nn.Linear(3, 1, bias=False)
    nn.init.zeros_(model.weight)
    return model


def make_datasets(ctx):
    path = Path(ctx.data_root) / FILE
    if not path.exists():
        raise FileNotFoundError(f"no {FILE} in this peer's data root {ctx.data_root!r}")
    a, y = torch.load(path)
    return TensorDataset(a, y), TensorDataset(a, y)


def loss(model, batch):
    a, y = batch
    return 0.5 * ((model(a).squeeze(1) - y) ** 2).mean()


def evaluate(model, batches):
    total = seen = 0.0
    for a, y in batches:
        total += float(0.5 * ((model(a).squeeze(1) - y) ** 2).sum())
        seen += len(y)
    return {"loss": total / seen}
