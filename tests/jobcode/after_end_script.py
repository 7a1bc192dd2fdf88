"""A plain script that ends the job in place (peer.close()) after its loop,
then saves the model it holds as after.pt in its working directory: the job's
model, also on a machine that came after the job's end and trained nothing."""

import torch
from torch import nn

import peerd
from peerd.examples.mnist import make_datasets


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 32), nn.ReLU(), nn.Linear(32, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    train_set, _ = make_datasets()
    peer = peerd.attach(model, optimizer)
    for x, y in peer.loader(train_set):
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        peer.step(loss=loss)
    peer.close()
    torch.save(model.state_dict(), "after.pt")


if __name__ == "__main__":
    main()
