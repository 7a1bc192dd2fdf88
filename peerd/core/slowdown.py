"""The testing knob that emulates a slower device: after each step a worker
sleeps (factor − 1) × that step's time, read on one of two clocks.

- "wall": the step's wall time. On a shared CPU that time includes waiting for
  the other processes, so a slow worker is slowed by more than its factor, and
  more so the busier the machine (a synchronous job, whose fast ranks then wait
  for it, pays that twice).
- "cpu": the CPU time the step's thread used: what the step cost this device,
  whatever the other processes do. The shell (peerd.worker.train.slowdown) reads it.

A second knob, `overhead_s`, adds a fixed sleep to every step whatever its batch:
it emulates a step with a large fixed cost (the optimizer update of a big model,
per-step launch overhead), which DBS's affine step model is for (peerd.core.shares).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

CLOCKS = ("wall", "cpu")


@dataclass(frozen=True)
class Slowdown:
    factor: float = 1.0  # 1: full speed
    clock: str = "wall"  # one of CLOCKS
    overhead_s: float = 0.0  # seconds slept after every step, whatever its batch

    def __post_init__(self) -> None:
        if not (math.isfinite(self.factor) and self.factor >= 1.0):
            raise ValueError(f"slowdown must be a number ≥ 1, got {self.factor}")
        if self.clock not in CLOCKS:
            raise ValueError(f"slowdown clock must be one of {', '.join(CLOCKS)}, got {self.clock!r}")
        if not (math.isfinite(self.overhead_s) and self.overhead_s >= 0.0):
            raise ValueError(f"step overhead must be a number of seconds ≥ 0, got {self.overhead_s}")

    def sleep_s(self, wall_s: float, cpu_s: float) -> float:
        """How long to sleep after a step that took wall_s seconds and cpu_s of CPU."""
        if self.factor == 1.0:
            return self.overhead_s
        spent = cpu_s if self.clock == "cpu" else wall_s
        return (self.factor - 1.0) * max(0.0, spent) + self.overhead_s
