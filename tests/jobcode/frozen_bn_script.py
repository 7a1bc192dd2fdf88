"""Fine-tuning as scripts do it: a feature extractor with BatchNorm, its
statistics taken from the data first (a pretrained backbone's), then frozen
(requires_grad False, eval mode) under a linear head that trains. Generated
data: 4 classes of a linear teacher on 16 inputs.

A StepLR halves the LR after each epoch. `--alone DIR` runs it as a plain
PyTorch script in one process (its own shuffled batches); without it, under
peerd (peerd.attach, peer.loader, peer.step). Either way it writes `initial.pt`
(the model before training) and `summary.json` (the test accuracy) to its
working directory, or to DIR."""

import json
import os
import sys

import torch
from torch import nn
from torch.utils.data import TensorDataset

EPOCHS, BATCH, LR, GAMMA = 6, 32, 0.3, 0.5
TRAIN, TEST = 4096, 2048


class Shuffled:
    """The plain script's batches: each pass over the data in a new random order."""

    def __init__(self, data: TensorDataset, batch: int) -> None:
        self.data, self.batch, self.gen = data, batch, torch.Generator().manual_seed(1)

    def __iter__(self):
        order = torch.randperm(len(self.data), generator=self.gen)
        for start in range(0, len(order), self.batch):
            yield self.data[order[start : start + self.batch]]


def make_datasets() -> tuple[TensorDataset, TensorDataset]:
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(TRAIN + TEST, 16, generator=gen)
    teacher = torch.randn(16, 4, generator=gen)
    y = (x @ teacher).argmax(1)
    return TensorDataset(x[:TRAIN], y[:TRAIN]), TensorDataset(x[TRAIN:], y[TRAIN:])


def make_model(train_set: TensorDataset) -> nn.Module:
    torch.manual_seed(0)
    backbone = nn.Sequential(nn.Linear(16, 128), nn.BatchNorm1d(128, momentum=None), nn.ReLU())
    with torch.no_grad():  # its statistics: one pass in train mode (a cumulative average)
        backbone(train_set.tensors[0])
    backbone.requires_grad_(False)
    backbone.eval()
    return nn.Sequential(backbone, nn.Linear(128, 4))


@torch.no_grad()
def evaluate(model: nn.Module, test_set: TensorDataset) -> float:
    model.eval()
    x, y = test_set.tensors
    return float((model(x).argmax(1) == y).float().mean())


def main(alone: bool, out: str) -> None:
    train_set, test_set = make_datasets()
    model = make_model(train_set)
    torch.save(model.state_dict(), os.path.join(out, "initial.pt"))
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LR, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=GAMMA)
    peer = None
    if alone:
        loader = Shuffled(train_set, BATCH)
    else:
        import peerd
        peer = peerd.attach(model, optimizer, scheduler=scheduler, scheduler_interval="epoch",
                            evaluate=lambda: {"accuracy": evaluate(model, test_set)})
        loader = peer.loader(train_set, batch_size=BATCH)
    for _ in range(EPOCHS):
        for x, y in loader:
            model.train()
            model[0].eval()  # the frozen backbone's statistics stay as they are
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if peer is not None:
                peer.step(batch_size=len(x), loss=loss)
        scheduler.step()  # after each epoch, as alone: under peerd the loader ran the whole job in the first pass
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump({"accuracy": evaluate(model, test_set)}, f)


if __name__ == "__main__":
    alone = sys.argv[1:2] == ["--alone"]
    main(alone, sys.argv[2] if alone else ".")
