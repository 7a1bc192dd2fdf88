"""A ~10M-parameter MLP on the example's MNIST digits, for the join benchmark."""

from torch import nn

from peerd.examples.mnist import make_datasets  # noqa: F401  (the job's data entry point)


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(28 * 28, 3000), nn.ReLU(),
        nn.Linear(3000, 2500), nn.ReLU(),
        nn.Linear(2500, 10),
    )
