"""data_mode = "local": each peer trains on its own data set, which never leaves it.

`LocalCursor` stands where `DataCursor` stands in the shared mode (the same
calls, so peerd's sampler and DataLoader serve both): each peer reads its whole
data set in its own order, a fresh permutation every local epoch, and the job's
progress counts epochs of the union of every peer's data (global samples
trained on / Σ n_i), so every peer agrees on how far the job is (the LR
schedule, the end) whatever it holds. `LocalData` keeps the members' data set
sizes and turns them, through peerd.core.weighting, into this peer's LR weight.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence

from peerd.core.partition import epoch_permutation
from peerd.core.shares import BatchPlan
from peerd.core.weighting import weigh
from peerd.jobspec import JobSpec

log = logging.getLogger("peerd.worker")


class LocalCursor:
    """Where this peer is in its own data, and how far the job is (union epochs)."""

    def __init__(self, spec: JobSpec, peer_id: str, samples: int) -> None:
        if samples <= 0:
            raise ValueError("a local data set must hold samples")
        self.spec = spec
        self.peer_id = peer_id
        self.samples = samples
        self.progress = 0.0  # epochs of the union done (the job's clock)
        self.fraction = 0.0  # what one step adds to it: global batch / union size (set per step)
        self.local_epoch = 0  # passes over this peer's own data
        self._order: list[int] = []
        self.pos = 0
        self._salt = 0  # a resumed peer reads in a new order, not its first epoch's again
        self.share = math.nan  # local data is not split among the members

    @property
    def epoch(self) -> int:
        return int(self.progress)

    @property
    def done(self) -> bool:
        return self.progress >= self.spec.epochs

    def take(self, size: int, members: Sequence[str], plan: BatchPlan | None) -> list[int]:
        """One step's `size` indices of this peer's data, in its order, across
        local epochs; the job's progress moves on by one step's worth."""
        if self.done:
            return []
        batch: list[int] = []
        while len(batch) < size:
            if self.pos >= len(self._order):
                self._next_order()
            taken = self._order[self.pos : self.pos + size - len(batch)]
            self.pos += len(taken)
            batch += taken
        self.progress += self.fraction
        return batch

    def _next_order(self) -> None:
        if self._order:
            self.local_epoch += 1
        self._order = epoch_permutation(self.samples, f"{self.spec.name}/{self.peer_id}/{self._salt}",
                                        self.local_epoch)
        self.pos = 0

    def seek(self, progress: float) -> None:
        """Go on from the job's `progress` (a donor's, or a checkpoint's). This
        peer's own position is its own business: a new order of its data."""
        self.progress = progress
        self._salt = round(progress * 1e6)
        self._order, self.pos, self.local_epoch = [], 0, 0


class LocalData:
    """This peer's data set size, the members' sizes and the LR weight they give."""

    def __init__(self, spec: JobSpec, peer_id: str, samples: int) -> None:
        self.spec = spec
        self.peer_id = peer_id
        self.samples = samples
        self.cursor = LocalCursor(spec, peer_id, samples)
        # The peers it averages with (the serving view), by their published data set
        # size (0: not known yet); None until told: every member then.
        self.sizes: dict[str, int] | None = None
        self.weight = 1.0  # this peer's LR multiplier (peerd.core.weighting)
        self.union = float(samples)

    def set_sizes(self, sizes: Mapping[str, int]) -> None:
        """The peers this one averages with now and their data set sizes. Weights
        and the union are over these (the peers that train), not over members
        still starting: those would shift the union, and with it each peer's
        count of the job's progress, differently on different peers."""
        self.sizes = {p: n for p, n in sizes.items() if p != self.peer_id}

    def keep_up(self, progresses: Mapping[str, float], trained: float) -> float:
        """The job's clock is the furthest count of the peers it averages with
        (published, so a second or two old): views that differed for a while
        (a peer counted in one union and not in another) made the counts drift,
        and a peer that lags would train alone, toward its own data, after the
        others finished. Returns this peer's progress (`trained`, or the new count)."""
        ahead = max(progresses.values(), default=0.0)
        if ahead <= self.cursor.progress:
            return trained
        if ahead - self.cursor.progress > 0.01 * self.spec.epochs:
            log.info("local data: the job is at epoch %.2f among the peers, this peer at %.2f: keeping up",
                     ahead, self.cursor.progress)
        self.cursor.progress = ahead
        return max(trained, ahead)

    def plan_step(self, members: Sequence[str], global_batch: int) -> None:
        """Before a step: this peer's weight and what the step adds to the job's progress."""
        peers = [*(members if self.sizes is None else self.sizes), self.peer_id]
        weights = weigh({**(self.sizes or {}), self.peer_id: self.samples}, peers, self.spec.weighting)
        if abs(weights.of(self.peer_id) - self.weight) > 1e-3 * self.weight or weights.union != self.union:
            log.info("local data: LR weight %.3f (%s weighting; %d samples here, %.0f in the union of %d peers)",
                     weights.of(self.peer_id), self.spec.weighting, self.samples, weights.union, len(weights.lr))
        self.weight, self.union = weights.of(self.peer_id), weights.union
        self.cursor.fraction = global_batch / weights.union
