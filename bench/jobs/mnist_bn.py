"""The built-in MNIST example with BatchNorm after each convolution, for
bench/optins.py (the [gossip] average_* opt-ins)."""

from torch import nn

from peerd.examples.mnist import make_datasets  # noqa: F401 (the job's data)


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 5, padding=2), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 5), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 5 * 5, 120), nn.ReLU(),
        nn.Linear(120, 84), nn.ReLU(),
        nn.Linear(84, 10),
    )
