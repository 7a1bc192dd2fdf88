"""A plain PyTorch script converted the natural way: its epoch loop kept around
peer.loader(), a CNN with BatchNorm, a per-batch OneCycleLR as long as
peerd.total_steps() says, the loss tensor handed to peer.step(), and a
checkpoint of its own written to a relative path every epoch.

It writes what it saw to summary.json in its working directory."""

import json
import os
import sys
import warnings

import torch
from torch import nn

import peerd
from peerd.examples.mnist import make_datasets

EPOCHS, LR = 3, 0.05


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 8, 5, padding=2), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 5), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(400, 10))


@torch.no_grad()
def evaluate(model, test_set) -> float:
    model.eval()
    x, y = test_set.tensors
    return float((model(x).argmax(1) == y).float().mean())


def main() -> None:
    torch.manual_seed(0)
    model = make_model()
    train_set, test_set = make_datasets()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9, weight_decay=5e-4)
    total = peerd.total_steps(train_set)  # the job's epochs at its local_batch
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=LR, total_steps=total)
    peer = peerd.attach(model, optimizer, scheduler=scheduler, scheduler_interval="step",
                        evaluate=lambda: {"accuracy": evaluate(model, test_set)})
    passes, steps, epochs_seen = 0, 0, []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for epoch in range(EPOCHS):
            passes += 1
            for x, y in peer.loader(train_set):
                if not epochs_seen or epochs_seen[-1] != peer.epoch:
                    epochs_seen.append(peer.epoch)
                    print(f"epoch {peer.epoch} begins at step {steps}", flush=True)
                model.train()
                loss = nn.functional.cross_entropy(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                scheduler.step()
                peer.step(loss=loss)
                steps += 1
                if peer.should_stop:
                    break
            torch.save(model.state_dict(), "last.pt")
    with open("summary.json", "w") as f:
        json.dump({"passes": passes, "steps": steps, "epochs_seen": epochs_seen, "total_steps": total,
                   "last_epoch": scheduler.last_epoch, "cwd": os.getcwd(), "script": __file__,
                   "warnings": [str(w.message) for w in caught]}, f)


if __name__ == "__main__":
    if sys.argv[1:]:
        raise SystemExit(f"unexpected arguments {sys.argv[1:]}")
    main()
