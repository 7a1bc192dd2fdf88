"""A tiny job for trainer tests: linear model, 6 samples."""

import torch
from torch import nn
from torch.utils.data import TensorDataset


def make_model() -> nn.Module:
    return nn.Linear(4, 3)


def make_data():
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(6, 4, generator=gen), torch.tensor([0, 1, 2, 0, 1, 2])
    return TensorDataset(x, y), TensorDataset(x, y)


def broken_model() -> nn.Module:
    raise RuntimeError("no GPU of that kind here")


def no_params_model() -> nn.Module:
    return nn.Identity()


def small_model() -> nn.Module:
    """Non-linear, for the large-batch equivalence test."""
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))


def small_data():
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(240, 4, generator=gen, dtype=torch.float64).float(), torch.arange(240) % 3
    return TensorDataset(x, y), TensorDataset(x[:30], y[:30])
