"""A ~12M-parameter MLP on the example's MNIST digits, for the capped-link benchmark
(bench/bandwidth.py): 784 → 3072 → 3072 → 10. Its test set is the first 500 of the
example's 1,000 test digits, so an evaluation costs about one training step."""

from __future__ import annotations

from torch import nn

from peerd.examples.mnist import make_datasets as _digits

WIDTH = 3072
TEST_DIGITS = 500


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(28 * 28, WIDTH), nn.ReLU(),
        nn.Linear(WIDTH, WIDTH), nn.ReLU(),
        nn.Linear(WIDTH, 10),
    )


def make_datasets():
    train, test = _digits()
    x, y = test.tensors
    return train, type(test)(x[:TEST_DIGITS], y[:TEST_DIGITS])
