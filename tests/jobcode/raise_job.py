"""A job module whose training raises at its third step, for the end-to-end test
of where a failed worker's reason shows (docs/operations.md, "When a worker crashes")."""

import torch
from torch import nn
from torch.utils.data import TensorDataset

MESSAGE = "boom at step 3"
_steps = 0


def make_model() -> nn.Module:
    return nn.Linear(4, 3)


def make_datasets():
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 4, generator=gen), torch.arange(64) % 3
    return TensorDataset(x, y), TensorDataset(x[:16], y[:16])


def loss(model, batch):
    """Counts training steps only: peerd calls it once in eval mode at join, to check it."""
    global _steps
    _steps += model.training
    if _steps == 3:
        raise RuntimeError(MESSAGE)
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)
