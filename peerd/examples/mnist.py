"""The built-in example job: a LeNet-sized CNN on 5,000 MNIST digits.

The digits ship inside the package (data/README.md gives their source and
licence), so the example needs no download. 4,000 are for training, 1,000 for
testing, split by a fixed seed.
"""

from __future__ import annotations

from importlib import resources

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

TEST_SIZE = 1000


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 5 * 5, 120), nn.ReLU(),
        nn.Linear(120, 84), nn.ReLU(),
        nn.Linear(84, 10),
    )


def make_datasets() -> tuple[TensorDataset, TensorDataset]:
    with resources.files("peerd.examples").joinpath("data/mnist_5k.npz").open("rb") as f:
        archive = np.load(f)
        images, labels = archive["images"], archive["labels"]
    order = np.random.default_rng(12345).permutation(len(labels))
    x = torch.from_numpy(images[order]).float().div_(255.0).sub_(0.1307).div_(0.3081).unsqueeze(1)
    y = torch.from_numpy(labels[order].astype(np.int64))
    return (
        TensorDataset(x[TEST_SIZE:], y[TEST_SIZE:]),
        TensorDataset(x[:TEST_SIZE], y[:TEST_SIZE]),
    )
