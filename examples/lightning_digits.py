"""A plain PyTorch Lightning script: a small CNN on the handwritten digits that
ship with peerd (peerd/examples/data: no download), Adam with a per-epoch
cosine LR schedule, the validation accuracy logged as "val_acc".

Alone, in one process:      python examples/lightning_digits.py
Under peerd (3 local peers): peerd cluster --job examples/lightning_digits.toml

The job file passes --peerd: the Trainer then gets the one extra callback,
peerd.lightning.Peerd() (docs/operations.md, "Lightning"). --epochs must be the
job's [job] epochs, as the Trainer's max_epochs is the job's length.
"""

import argparse

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader

from peerd.examples.mnist import make_datasets

EPOCHS, BATCH, LR = 3, 32, 2e-3


class Digits(pl.LightningModule):
    def __init__(self, epochs: int = EPOCHS, lr: float = LR) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(32 * 5 * 5, 128), nn.ReLU(), nn.Linear(128, 10),
        )
        self.train_set, self.val_set = make_datasets()  # 4,000 digits to train on, 1,000 to validate on

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
        optimizer = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=self.hparams.epochs)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "epoch"}}

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=BATCH, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=500)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument("--peerd", action="store_true", help="train as a worker of a peerd job (its job file says so)")
    args = parser.parse_args()
    callbacks = []
    if args.peerd:
        import peerd.lightning

        callbacks.append(peerd.lightning.Peerd())
    torch.manual_seed(0)
    model = Digits(args.epochs)
    trainer = pl.Trainer(max_epochs=args.epochs, accelerator="cpu", devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=callbacks)
    trainer.fit(model)  # under peerd: returns with the job's final model in `model`
    accuracy = trainer.validate(model, verbose=False)[0]["val_acc"]
    print(f"validation accuracy {accuracy:.4f}")


if __name__ == "__main__":
    main()
