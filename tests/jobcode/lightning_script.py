"""A plain PyTorch Lightning script: an MLP classifying four Gaussian blobs in
8 dimensions (generated here), StepLR stepped once per epoch
(interval "epoch"), two batches per optimizer step (accumulate_grad_batches=2),
bf16 autocast, the validation's accuracy logged. Under peerd the Trainer gets
the one extra callback; `python lightning_script.py plain` trains it alone.

The first argument is the Trainer's max_epochs (or "plain"). It writes, to
summary.json in its working directory, the LR of each optimizer step (read
inside optimizer.step(), after peerd's hooks) with the Trainer's epoch, its
own optimizer steps, the Trainer's current_epoch and global_step when training
starts, and both after fit.

A file `hold` in its working directory holds it before fit() until the file
is gone (it writes `holding` meanwhile): a test's newcomer joins the running
job when the test says, its imports done."""

import json
import sys
import time
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

EPOCHS, LR, GAMMA, BATCH, ACCUMULATE = 3, 0.2, 0.5, 16, 2
CLASSES, DIM, TRAIN, VAL = 4, 8, 1024, 256


def blobs(n: int, seed: int) -> TensorDataset:
    """`n` points of four unit-variance Gaussians around fixed, well separated centres."""
    centres = torch.randn(CLASSES, DIM, generator=torch.Generator().manual_seed(7)) * 2.5
    gen = torch.Generator().manual_seed(seed)
    y = torch.randint(0, CLASSES, (n,), generator=gen)
    return TensorDataset(centres[y] + torch.randn(n, DIM, generator=gen), y)


class Blobs(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(DIM, 32), nn.ReLU(), nn.Linear(32, CLASSES))
        self.used: list[tuple[int, float]] = []
        self.steps = 0
        self.start: tuple[int, int] | None = None

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        self.log("val_loss", nn.functional.cross_entropy(logits, y))
        self.log("val_acc", (logits.argmax(1) == y).float().mean())

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=LR, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=GAMMA)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "epoch"}}

    def on_train_start(self) -> None:
        self.start = (self.current_epoch, self.global_step)

        def seen(optimizer, args, kwargs):
            self.steps += 1
            self.used.append((self.current_epoch, optimizer.param_groups[0]["lr"]))

        self.optimizers().optimizer.register_step_pre_hook(seen)

    def train_dataloader(self):
        return DataLoader(blobs(TRAIN, 1), batch_size=BATCH, shuffle=True)

    def val_dataloader(self):
        return DataLoader(blobs(VAL, 2), batch_size=128)


def main(max_epochs: str) -> None:
    torch.manual_seed(0)
    callbacks = []
    if max_epochs != "plain":
        import peerd.lightning

        callbacks.append(peerd.lightning.Peerd())
    model = Blobs()
    trainer = pl.Trainer(max_epochs=EPOCHS if max_epochs == "plain" else int(max_epochs), accelerator="cpu",
                         devices=1, precision="bf16-mixed", accumulate_grad_batches=ACCUMULATE, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=callbacks)
    hold = Path("hold")
    if hold.exists():
        Path("holding").touch()
        while hold.exists():
            time.sleep(0.05)
    trainer.fit(model)
    with open("summary.json", "w") as f:
        json.dump({"used": sorted(set(model.used)), "steps": model.steps, "global_step": trainer.global_step,
                   "current_epoch": trainer.current_epoch, "start": model.start}, f)


if __name__ == "__main__":
    main(sys.argv[1])
