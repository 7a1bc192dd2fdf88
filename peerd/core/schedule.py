"""The job's LR schedule: warm-up, then constant, cosine or linear decay.

A factor in [0, 1] on the job's base LR, from the position in the job (its
fraction done) and the step count; the scaling with the global batch and its
ramp (peerd.core.lr) multiply on top.
"""

from __future__ import annotations

import math

SCHEDULES = ("constant", "cosine", "linear")


def decay(kind: str, fraction: float) -> float:
    """From 1 at the start of the job to 0 at its end (1 throughout for constant)."""
    fraction = min(1.0, max(0.0, fraction))
    if kind == "constant":
        return 1.0
    if kind == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * fraction))
    if kind == "linear":
        return 1.0 - fraction
    raise ValueError(f"unknown schedule {kind!r}: one of {', '.join(SCHEDULES)}")


def warmup(step: int, steps: int) -> float:
    """Linear warm-up: (step + 1) / steps for the first `steps` steps, then 1."""
    if steps <= 0:
        return 1.0
    return min(1.0, (max(step, 0) + 1) / steps)


def schedule_factor(kind: str, fraction: float, step: int, warmup_steps: int) -> float:
    return warmup(step, warmup_steps) * decay(kind, fraction)
