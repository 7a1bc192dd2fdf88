"""Which training samples each simulated peer reads (peerd.core.partition).

Every epoch the core's permutation of (job, epoch) is cut among the live
members in sorted-id order, exactly as `my_shard` cuts it (a test checks the
two agree); the permutation is drawn once per epoch instead of once per peer,
which at 1,024 peers is the difference between milliseconds and seconds.
A peer reads its shard in order, wrapping around, its local batch at a time.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from peerd.core.partition import epoch_permutation


def shards(n_samples: int, job: str, epoch: int, members: Sequence[str]) -> dict[str, np.ndarray]:
    ordered = sorted(set(members))
    perm = np.array(epoch_permutation(n_samples, job, epoch))
    m = len(ordered)
    return {p: perm[n_samples * k // m : n_samples * (k + 1) // m] for k, p in enumerate(ordered)}


class Reader:
    """Batches for the live members; re-cut when the epoch or the members change."""

    def __init__(self, n_samples: int, job: str) -> None:
        self.n_samples, self.job = n_samples, job
        self._seen = 0
        self._key: tuple[int, tuple[str, ...]] | None = None
        self._shards: dict[str, np.ndarray] = {}
        self._offset: dict[str, int] = {}

    @property
    def epoch(self) -> int:
        return self._seen // self.n_samples

    def batches(self, names: Sequence[str], sizes: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """(indices (P, max b), mask (P, max b)) of this round's samples."""
        key = (self.epoch, tuple(names))
        if key != self._key:
            self._key, self._shards = key, shards(self.n_samples, self.job, self.epoch, names)
            self._offset = {p: 0 for p in names}
        width = max(sizes)
        idx = np.zeros((len(names), width), dtype=np.int64)
        mask = np.zeros((len(names), width), dtype=np.float32)
        for k, (p, b) in enumerate(zip(names, sizes)):
            shard = self._shards[p]
            if len(shard) == 0 or b == 0:
                continue
            at = self._offset[p]
            idx[k, :b] = shard[np.arange(at, at + b) % len(shard)]
            mask[k, :b] = 1.0
            self._offset[p] = at + b
        self._seen += int(sum(sizes))
        return idx, mask
