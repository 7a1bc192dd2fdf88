"""data_mode = "local": each peer trains on its own data set, which never leaves it.

`LocalCursor` stands where `DataCursor` stands in the shared mode (the same
calls, so peerd's sampler and DataLoader serve both): each peer reads its whole
data set in its own order, a fresh permutation every local epoch, and the job's
progress counts epochs of the union of every peer's data as the peers' reads
add up (peerd.core.unionclock), so every peer agrees on how far the job is (the
LR schedule, the end) whatever it holds. `LocalData` keeps the members' data set
sizes and turns them, through peerd.core.weighting, into this peer's LR weight.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence

from peerd.core.partition import epoch_permutation
from peerd.core.shares import BatchPlan
from peerd.core.unionclock import UnionClock
from peerd.core.weighting import weigh
from peerd.settings.jobspec import JobSpec

log = logging.getLogger("peerd.worker")


class LocalCursor:
    """Where this peer is in its own data, and how far the job is (union epochs)."""

    def __init__(self, spec: JobSpec, peer_id: str, samples: int) -> None:
        if samples <= 0:
            raise ValueError("a local data set must hold samples")
        self.spec = spec
        self.peer_id = peer_id
        self.samples = samples
        self.clock = UnionClock(peer_id)  # the job's clock: epochs of the union the peers' steps read
        self.union = float(samples)  # the union's size as this peer sees it (set per step)
        self.global_batch = 0  # the step's global batch (set per step)
        # The others' terms are a Hello old. Between them this peer counts what the
        # whole global batch adds at each of its steps (gossip keeps the members'
        # steps in step), so its schedule does not stall and fall back with the
        # Hellos; the job's position is the larger of that and the clock. Never
        # published: the clock's terms are.
        self._estimate = 0.0
        self.local_epoch = 0  # passes over this peer's own data
        self._order: list[int] = []
        self.pos = 0
        self._salt = 0  # a resumed peer reads in a new order, not its first epoch's again
        self.share = math.nan  # local data is not split among the members

    @property
    def progress(self) -> float:
        """Epochs of the union done (the job's clock, the others' steps since
        their last terms estimated)."""
        return max(self.clock.epochs, self._estimate)

    @property
    def epoch(self) -> int:
        return int(self.progress)

    @property
    def done(self) -> bool:
        return self.progress >= self.spec.epochs

    def take(self, size: int, members: Sequence[str], plan: BatchPlan | None) -> list[int]:
        """One step's `size` indices of this peer's data, in its order, across
        local epochs; this peer's term of the job's clock grows by them."""
        if self.done:
            return []
        batch: list[int] = []
        while len(batch) < size:
            if self.pos >= len(self._order):
                self._next_order()
            taken = self._order[self.pos : self.pos + size - len(batch)]
            self.pos += len(taken)
            batch += taken
        self._estimate = max(self._estimate, self.clock.epochs) + max(self.global_batch, len(batch)) / self.union
        self.clock.add(len(batch), self.union)
        return batch

    def heard(self, terms: Mapping[str, float]) -> None:
        """The others' terms as the daemons relay them."""
        self.clock.merge(terms)

    def _next_order(self) -> None:
        if self._order:
            self.local_epoch += 1
        self._order = epoch_permutation(self.samples, f"{self.spec.name}/{self.peer_id}/{self._salt}",
                                        self.local_epoch)
        self.pos = 0

    def seek(self, progress: float) -> None:
        """Go on from the job's `progress` (a donor's, or a checkpoint's: its
        clock came with the state). This peer's own position is its own
        business: a new order of its data."""
        self._estimate = progress  # a job that ended while this peer was away may set it past the clock
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

    def observe(self, terms: Mapping[str, float]) -> float:
        """The others' terms of the job's clock (published, a Hello old); returns
        the job's progress now."""
        self.cursor.heard(terms)
        return self.cursor.progress

    def plan_step(self, members: Sequence[str], global_batch: int) -> None:
        """Before a step: this peer's weight, the union its samples count in and
        the step's global batch."""
        peers = [*(members if self.sizes is None else self.sizes), self.peer_id]
        weights = weigh({**(self.sizes or {}), self.peer_id: self.samples}, peers, self.spec.weighting)
        if abs(weights.of(self.peer_id) - self.weight) > 1e-3 * self.weight or weights.union != self.union:
            log.info("local data: LR weight %.3f (%s weighting; %d samples here, %.0f in the union of %d peers)",
                     weights.of(self.peer_id), self.spec.weighting, self.samples, weights.union, len(weights.lr))
        self.weight, self.union = weights.of(self.peer_id), weights.union
        self.cursor.union, self.cursor.global_batch = weights.union, global_batch
