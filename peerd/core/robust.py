"""A defence against poisoned updates: clip a partner's pull on a segment to a
multiple of the median pull seen lately (opt-in per job, `gossip.clip_factor`).

A pull is the root-mean-square of (theirs − own) over the segment. With k > 0, a
pull above k × median of the last `window` pulls is scaled down to that limit,
so one peer that sends huge or wild values moves its partners by no more than an
honest peer would. A clipped pull enters the median as the median itself, so a
poisoner cannot raise the limit however long it keeps sending large values. Until `warmup` pulls have
been seen nothing is clipped: there is no reference yet.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field


@dataclass
class PullClipper:
    factor: float  # k; 0 turns clipping off
    window: int = 64
    warmup: int = 8
    _recent: deque = field(default_factory=deque, init=False)

    def __post_init__(self) -> None:
        if self.factor < 0 or not math.isfinite(self.factor):
            raise ValueError(f"clip factor must be a finite number ≥ 0, got {self.factor}")
        if self.window < 1 or self.warmup < 1:
            raise ValueError("window and warmup must be ≥ 1")

    @property
    def enabled(self) -> bool:
        return self.factor > 0

    def limit(self) -> float:
        """The largest pull accepted as it is now (inf while warming up)."""
        if not self.enabled or len(self._recent) < self.warmup:
            return math.inf
        ordered = sorted(self._recent)
        mid = len(ordered) // 2
        median = ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])
        return self.factor * median

    def scale(self, pull: float) -> float:
        """The factor in (0, 1] to apply to a pull of this size, recorded as clipped."""
        if not math.isfinite(pull) or pull < 0:
            raise ValueError(f"a pull must be a finite number ≥ 0, got {pull}")
        limit = self.limit()
        s = 1.0 if pull <= limit else limit / pull
        # A clipped pull counts as the median, not the limit: recording the limit
        # would let a persistent poisoner ratchet the median up by k every window.
        self._recent.append(pull if pull <= limit else limit / self.factor)
        if len(self._recent) > self.window:
            self._recent.popleft()
        return s
