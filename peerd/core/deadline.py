"""Exchange deadlines from measured transfer times (docs/algorithms.md §1.4).

The deadline is a multiple of a slow-tail estimate of recent exchange times,
clamped to [floor, ceiling], instead of one fixed constant.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class DeadlineEstimator:
    floor_s: float
    ceiling_s: float
    factor: float = 4.0
    alpha: float = 0.2
    _ema: float | None = field(default=None, init=False)
    _count: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if not (self.factor > 0 and 0 < self.alpha <= 1):
            raise ValueError(f"need factor > 0 and 0 < alpha ≤ 1, got {self.factor}, {self.alpha}")
        if not 0 < self.floor_s <= self.ceiling_s:
            raise ValueError(f"need 0 < floor ≤ ceiling, got {self.floor_s}, {self.ceiling_s}")

    @property
    def measured(self) -> int:
        """How many exchange times have been observed."""
        return self._count

    def observe(self, seconds: float) -> None:
        if not math.isfinite(seconds) or seconds < 0:
            return  # a broken clock reading must not pin the deadline
        self._count += 1
        # Rise at once on a slow exchange, decay slowly: a deadline that is too
        # short drops good partners, one that is too long only costs a wait.
        if self._ema is None or seconds > self._ema:
            self._ema = seconds
        else:
            self._ema += self.alpha * (seconds - self._ema)

    def deadline(self) -> float:
        if self._ema is None:
            return self.ceiling_s
        return min(self.ceiling_s, max(self.floor_s, self.factor * self._ema))
