"""A plain script with a per-epoch schedule, as most PyTorch scripts step one:
StepLR, `scheduler.step()` once after each epoch, an MLP with dropout. Under
peerd the schedule is attached with the unit given as the first argument.

It writes, to summary.json in its working directory, the LR each optimizer step
used (read inside optimizer.step(), after peerd's own hooks) with the job's
epoch of that step."""

import json
import sys

import torch
from torch import nn

import peerd
from peerd.examples.mnist import make_datasets

EPOCHS, LR, GAMMA = 3, 0.1, 0.3


def make_model() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Dropout(0.1), nn.Linear(128, 10))


@torch.no_grad()
def evaluate(model, test_set) -> float:
    model.eval()
    x, y = test_set.tensors
    return float((model(x).argmax(1) == y).float().mean())


def main(interval: str) -> None:
    torch.manual_seed(0)
    model = make_model()
    train_set, test_set = make_datasets()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=GAMMA)
    peer = peerd.attach(model, optimizer, scheduler=scheduler, scheduler_interval=interval,
                        evaluate=lambda: {"accuracy": evaluate(model, test_set)})
    used = []
    optimizer.register_step_pre_hook(lambda opt, args, kwargs: used.append((peer.epoch, opt.param_groups[0]["lr"])))
    for epoch in range(EPOCHS):
        for x, y in peer.loader(train_set):
            model.train()
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            peer.step(loss=loss)
        scheduler.step()  # after each epoch, as alone: peerd's loader ran the whole job in the first pass
    with open("summary.json", "w") as f:
        json.dump({"used": sorted(set(used)), "steps": len(used)}, f)


if __name__ == "__main__":
    main(sys.argv[1])
