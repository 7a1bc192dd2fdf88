"""MNIST in one process (mnist_plain.py), and the same under peerd (mnist_peerd.py).

`diff mnist_plain.py mnist_peerd.py` shows the lines a script needs to train
under peerd; run the second as a script job: peerd cluster --job mnist_script.toml
"""

import peerd
import torch
from torch import nn
from torch.utils.data import DataLoader

from peerd.examples.mnist import make_datasets, make_model

EPOCHS, BATCH, LR = 4, 32, 0.05


def batches(loader, epochs):
    for _ in range(epochs):
        yield from loader


def train_step(model, optimizer, x, y) -> float:
    model.train()
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 3.0)
    optimizer.step()
    return loss.item()


@torch.no_grad()
def evaluate(model, test_set) -> float:
    model.eval()
    x, y = test_set.tensors
    return float((model(x).argmax(1) == y).float().mean())


def main() -> None:
    torch.manual_seed(0)
    model = make_model()
    train_set, test_set = make_datasets()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=EPOCHS * len(train_set) // BATCH)
    peer = peerd.attach(model, optimizer, scheduler=scheduler, scheduler_interval="step",
                        evaluate=lambda: {"accuracy": evaluate(model, test_set)})
    for x, y in peer.loader(train_set, batch_size=BATCH):
        loss = train_step(model, optimizer, x, y)
        scheduler.step()
        peer.step(batch_size=len(x), loss=loss)
        if peer.should_stop:
            break
    accuracy = evaluate(model, test_set)
    print(f"test accuracy {accuracy:.4f}")


if __name__ == "__main__":
    main()
