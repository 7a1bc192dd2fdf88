"""How long a simulated peer's local step takes.

A peer at speed 1 processes one sample in `sample_time` seconds; base speeds
are spread log-normally (`spread` = σ of log speed, 0 for identical peers) and
changed by the schedule ("speed" events). On top, each step is slowed by
`jitter_factor` with probability `jitter_prob` (the DBS paper's harness slows a
worker at random). Draws are seeded, so a run is reproducible.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class SpeedModel:
    sample_time: float = 2e-3
    step_overhead: float = 1e-3
    spread: float = 0.0
    jitter_prob: float = 0.0
    jitter_factor: float = 3.0
    seed: int = 0
    _base: dict[int, float] = field(default_factory=dict)
    _factor: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.sample_time <= 0 or self.step_overhead < 0 or self.spread < 0:
            raise ValueError("need sample_time > 0, step_overhead ≥ 0, spread ≥ 0")
        if not 0 <= self.jitter_prob <= 1 or self.jitter_factor < 1:
            raise ValueError("need 0 ≤ jitter_prob ≤ 1 and jitter_factor ≥ 1")
        self._jitter = np.random.default_rng([self.seed, 1])

    def speed(self, slot: int) -> float:
        if slot not in self._base:
            rng = np.random.default_rng([self.seed, 2, slot])
            self._base[slot] = float(np.exp(self.spread * rng.standard_normal()))
        return self._base[slot] * self._factor.get(slot, 1.0)

    def set_factor(self, slot: int, factor: float) -> None:
        if factor <= 0:
            raise ValueError(f"a speed factor must be positive, got {factor}")
        self._factor[slot] = factor

    def step_times(self, slots: np.ndarray, batches: np.ndarray) -> np.ndarray:
        """Seconds each peer in `slots` takes for a step on `batches[k]` samples."""
        speeds = np.array([self.speed(int(s)) for s in slots])
        times = batches * self.sample_time / speeds + self.step_overhead
        if self.jitter_prob > 0:
            slow = self._jitter.random(len(slots)) < self.jitter_prob
            times = np.where(slow, times * self.jitter_factor, times)
        return times
