"""Gradient accumulation as scripts do it: micro-batches of 8, one optimizer
step every 4 of them (32 samples a step), a StepLR stepped once per epoch, an
MLP on generated data (4 classes of a linear teacher on 16 inputs).

The optimizer notes the LR of every step it takes, read inside step(): after
peerd's hooks, so the LR the update used. `--alone DIR` runs it as a plain
PyTorch script in one process; without it, under peerd. Either way it writes
`summary.json` (each step's (epoch, LR) and the test accuracy) to its working
directory, or to DIR."""

import json
import os
import sys

import torch
from torch import nn
from torch.utils.data import TensorDataset

EPOCHS, MICRO, ACCUMULATE, LR, GAMMA = 6, 8, 4, 0.1, 0.5
TRAIN, TEST = 4096, 2048


class RecordingSGD(torch.optim.SGD):
    """SGD that notes (epoch, LR) at each step it takes."""

    def __init__(self, params, epoch, **options) -> None:
        super().__init__(params, **options)
        self.epoch, self.used = epoch, []

    def step(self, closure=None):
        self.used.append((self.epoch(), self.param_groups[0]["lr"]))
        return super().step(closure)


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
    y = (x @ torch.randn(16, 4, generator=gen)).argmax(1)
    return TensorDataset(x[:TRAIN], y[:TRAIN]), TensorDataset(x[TRAIN:], y[TRAIN:])


@torch.no_grad()
def evaluate(model: nn.Module, test_set: TensorDataset) -> float:
    model.eval()
    x, y = test_set.tensors
    return float((model(x).argmax(1) == y).float().mean())


def main(alone: bool, out: str) -> None:
    torch.manual_seed(0)
    train_set, test_set = make_datasets()
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    epoch = [0]
    optimizer = RecordingSGD(model.parameters(), lambda: epoch[0] if peer is None else peer.epoch,
                             lr=LR, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=GAMMA)
    peer = None
    if alone:
        loader = Shuffled(train_set, MICRO)
    else:
        import peerd
        peer = peerd.attach(model, optimizer, scheduler=scheduler, scheduler_interval="epoch",
                            evaluate=lambda: {"accuracy": evaluate(model, test_set)})
        loader = peer.loader(train_set, batch_size=MICRO)
    for epoch[0] in range(EPOCHS):
        for k, (x, y) in enumerate(loader, 1):
            model.train()
            loss = nn.functional.cross_entropy(model(x), y) / ACCUMULATE
            loss.backward()
            if k % ACCUMULATE:
                continue
            optimizer.step()
            optimizer.zero_grad()
            if peer is not None:
                peer.step(batch_size=MICRO * ACCUMULATE, loss=loss * ACCUMULATE)
        scheduler.step()  # after each epoch, as alone: under peerd the loader ran the whole job in the first pass
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump({"used": optimizer.used, "accuracy": evaluate(model, test_set)}, f)


if __name__ == "__main__":
    alone = sys.argv[1:2] == ["--alone"]
    main(alone, sys.argv[2] if alone else ".")
