"""The built-in non-IID job: the example CNN on each peer's own digits (data_mode = "local").

Each peer's training digits are in `<ctx.data_root>/digits/train.npz`
(peerd.examples.noniid writes them, a few classes per peer); the test set is
the package's 1,000 test digits of all 10 classes, so every peer's accuracy
says how well its model knows the classes it never saw.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch.utils.data import TensorDataset

from peerd.examples.mnist import make_model
from peerd.examples.noniid import FILE, TEST_SIZE, bundled

__all__ = ["make_model", "make_datasets"]  # the job module's callables (make_model: the example's CNN)


def _tensors(images: np.ndarray, labels: np.ndarray) -> TensorDataset:
    x = torch.from_numpy(images).float().div_(255.0).sub_(0.1307).div_(0.3081).unsqueeze(1)
    return TensorDataset(x, torch.from_numpy(labels.astype(np.int64)))


def make_datasets(ctx) -> tuple[TensorDataset, TensorDataset]:
    path = Path(ctx.data_root) / FILE
    if not path.exists():
        raise FileNotFoundError(f"no {FILE} under this peer's data root {ctx.data_root} "
                                "(peerd cluster --job digits-noniid writes one per peer)")
    with np.load(path) as own:
        train = _tensors(own["images"], own["labels"])
    images, labels = bundled()
    return train, _tensors(images[:TEST_SIZE], labels[:TEST_SIZE])
