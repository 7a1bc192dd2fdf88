"""The bundled digits split by label into per-peer data roots (no torch needed).

Each peer gets the training digits of a few classes only, disjoint from the
others' (classes c with c · peers // 10 == k go to peer k: 4/3/3 for three
peers, 2 each for five); the test digits stay the package's, all 10 classes.
`peerd cluster --job digits-noniid` writes these and trains in local mode
(docs/operations.md, "Local data").
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import numpy as np

CLASSES = 10
TEST_SIZE = 1000  # as peerd.examples.mnist: the first 1,000 of a fixed permutation
FILE = "digits/train.npz"


def bundled() -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 [n, 28, 28], labels) in the fixed order mnist.py uses."""
    with resources.files("peerd.examples").joinpath("data/mnist_5k.npz").open("rb") as f:
        archive = np.load(f)
        images, labels = archive["images"], archive["labels"]
    order = np.random.default_rng(12345).permutation(len(labels))
    return images[order], labels[order]


def classes_of(peer: int, peers: int) -> list[int]:
    """The labels peer `peer` of `peers` holds; every label belongs to exactly one peer
    (with more than 10 peers some hold none: refused)."""
    if not 1 <= peers <= CLASSES:
        raise ValueError(f"the digits split by label among 1..{CLASSES} peers, not {peers}")
    return [c for c in range(CLASSES) if c * peers // CLASSES == peer]


def write_split(roots: list[Path], by_label: bool = True) -> list[int]:
    """Each root gets its peer's classes of the training digits (or, not by label,
    an equal random slice of all of them); returns the counts."""
    images, labels = bundled()
    images, labels = images[TEST_SIZE:], labels[TEST_SIZE:]
    slices = np.arange(len(labels)) % len(roots)  # the digits are in a random order already
    counts = []
    for k, root in enumerate(roots):
        mine = np.isin(labels, classes_of(k, len(roots))) if by_label else slices == k
        path = root / FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(path, images=images[mine], labels=labels[mine])
        counts.append(int(mine.sum()))
    return counts
