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
