"""A small LightningModule and its data for the tests of peerd.lightning:
two classes by the sign of a feature, each sample's index beside it."""

from __future__ import annotations

import textwrap

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from peerd.settings.jobspec import parse_job

N, BATCH, ACCUMULATE, EPOCHS, CHUNKS, LR, GAMMA = 1024, 16, 2, 3, 8, 0.2, 0.5
MEMBERS, ME = ("a", "b"), "a"
SPEC = parse_job(textwrap.dedent(f"""
    [job]
    name = "blobs"
    script = "train.py"
    epochs = {EPOCHS}
    epoch_chunks = {CHUNKS}
"""), "blobs.toml")


def data(n: int = N) -> TensorDataset:
    """Two classes by the sign of a feature; the third tensor is each sample's index."""
    x = torch.randn(n, 4, generator=torch.Generator().manual_seed(0))
    return TensorDataset(x, (x[:, 0] > 0).long(), torch.arange(n))


class Tiny(pl.LightningModule):
    def __init__(self, schedule: str = "epoch", loader: dict | None = None) -> None:
        super().__init__()
        self.net = nn.Linear(4, 2)
        self.schedule, self.loader = schedule, loader or {}
        self.estimated = None
        self.used: list[tuple[int, float]] = []

    def training_step(self, batch, batch_idx):
        return nn.functional.cross_entropy(self.net(batch[0]), batch[1])

    def validation_step(self, batch, batch_idx):
        self.log("val_acc", (self.net(batch[0]).argmax(1) == batch[1]).float().mean())

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=LR)
        if self.schedule == "epoch":
            return [optimizer], [{"scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1, GAMMA),
                                  "interval": "epoch"}]
        self.estimated = self.trainer.estimated_stepping_batches  # reads the training loader before the job
        onecycle = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=LR, total_steps=self.estimated)
        return [optimizer], [{"scheduler": onecycle, "interval": "step"}]

    def on_train_start(self) -> None:
        self.optimizers().optimizer.register_step_pre_hook(
            lambda opt, args, kwargs: self.used.append((self.current_epoch, opt.param_groups[0]["lr"])))

    def train_dataloader(self):
        return DataLoader(data(), **{"batch_size": BATCH, "shuffle": True, **self.loader})

    def val_dataloader(self):
        return DataLoader(data(256), batch_size=128)
