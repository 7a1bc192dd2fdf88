"""A job module whose samples cost real work to prepare (~2 ms of CPU each):
what decoding and augmenting an image file costs. For bench/loader.py."""

import time

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

PREPARE_S = 0.002


class SlowSamples(Dataset):
    """MNIST-sized samples, each computed by a CPU-bound transform that takes
    PREPARE_S (numpy work, not a sleep: it holds a core like a real decoder)."""

    def __init__(self, n: int, seed: int) -> None:
        self.n = n
        self.seed = seed

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        rng = np.random.default_rng(self.seed * 1_000_003 + i)
        image = rng.standard_normal((28, 28)).astype(np.float32)
        deadline = time.perf_counter() + PREPARE_S
        while time.perf_counter() < deadline:  # "decode and augment"
            image = np.tanh(image @ np.eye(28, dtype=np.float32) * 1.0001)
        label = int(i % 10)
        image[label, :] += 2.0  # learnable
        return torch.from_numpy(image).unsqueeze(0), label


def make_model() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 64), nn.ReLU(), nn.Linear(64, 10))


def make_datasets():
    return SlowSamples(4000, 0), SlowSamples(200, 1)
