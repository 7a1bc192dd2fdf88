"""Job modules for the real-jobs tests: BatchNorm, a custom loss and evaluation,
batches that are dicts, and jobs that return the wrong thing."""

import math

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))


def make_datasets():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(240, 6, generator=gen)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    return TensorDataset(x[:200], y[:200]), TensorDataset(x[200:], y[200:])


class DictSet(Dataset):
    """Samples as dicts, collated by the DataLoader's default collate."""

    def __init__(self, n: int, offset: int = 0) -> None:
        gen = torch.Generator().manual_seed(5 + offset)
        self.x = torch.randn(n, 6, generator=gen)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"x": self.x[i], "target": self.x[i, :3].sum(0, keepdim=True), "index": i}


def make_regression_model() -> nn.Module:
    return nn.Linear(6, 1)


def make_dict_datasets():
    return DictSet(120), DictSet(30, offset=1)


def regression_loss(model, batch):
    error = model(batch["x"]) - batch["target"]
    return (error ** 2).mean(), {"mae": float(error.detach().abs().mean())}


def regression_evaluate(model, batches):
    total = count = 0.0
    for batch in batches:
        total += float(((model(batch["x"]) - batch["target"]) ** 2).sum())
        count += len(batch["x"])
    return {"val_loss": total / count}


NAN_AT = {"count": 0}


def nan_loss(model, batch):
    """A loss that is NaN on every third call."""
    NAN_AT["count"] += 1
    loss = nn.functional.cross_entropy(model(batch[0]), batch[1])
    return loss * math.nan if NAN_AT["count"] % 3 == 0 else loss


def loss_returns_float(model, batch):
    return 1.0


def loss_returns_vector(model, batch):
    return nn.functional.cross_entropy(model(batch[0]), batch[1], reduction="none")


def evaluate_without_metric(model, batches):
    return {"something": 1.0}


def evaluate_returns_list(model, batches):
    return [1.0]


def not_a_model():
    return "a model"


def adamw_with_groups(params, spec):
    return torch.optim.AdamW(params, lr=spec.lr, weight_decay=0.1)
