"""A local-data job whose samples carry a marker, for the end-to-end tests.

Each peer's samples are in `<ctx.data_root>/samples.pt`: rows of 8 float32
features, the first 4 a fixed marker (MARKER) that no model, message or log of
peerd should ever contain, the last 4 the regressors of a least-squares problem
(y = A·x_peer + noise) whose target differs between peers (non-IID). The model
sees only the regressors. `write_peer_data` makes a peer's file.
"""

from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

FILE = "samples.pt"
MARKER = (1234.5677490234375, -8765.431640625, 31415926.0, 2.7182817459106445e-07)


def make_model() -> nn.Module:
    model = nn.Linear(4, 1, bias=False)
    nn.init.zeros_(model.weight)
    return model


def make_datasets(ctx):
    path = Path(ctx.data_root) / FILE
    if not path.exists():
        raise FileNotFoundError(f"no {FILE} in this peer's data root {ctx.data_root}")
    rows, y = torch.load(path)
    return TensorDataset(rows, y), TensorDataset(rows, y)


def loss(model, batch):
    rows, y = batch
    return 0.5 * ((model(rows[:, 4:]).squeeze(1) - y) ** 2).mean()


def evaluate(model, batches):
    total = seen = 0.0
    for rows, y in batches:
        total += float(0.5 * ((model(rows[:, 4:]).squeeze(1) - y) ** 2).sum())
        seen += len(y)
    return {"loss": total / seen}


def write_peer_data(root: Path, n: int, truth: tuple[float, ...], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n marked samples in root/samples.pt; returns (rows, y) as written."""
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(n, 4, generator=gen)
    y = a @ torch.tensor(truth) + 0.1 * torch.randn(n, generator=gen)
    rows = torch.cat([torch.tensor(MARKER).expand(n, 4), a], dim=1).contiguous()
    root.mkdir(parents=True, exist_ok=True)
    torch.save((rows, y), root / FILE)
    return rows, y
