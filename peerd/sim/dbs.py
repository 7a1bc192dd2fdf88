"""Fewer local steps per round for the slow peers, as peerd's DBS plans them
(docs/algorithms.md, "Fewer steps for a member slower than the others at the
minimum"). The simulator's local batches are equal, so every member sits at the
minimum batch and peerd.core.shares.plan_batches_and_steps changes only the
steps: the fastest peer's H steps set the round, a slower one takes the most of
its own steps that fit in that time (at least one).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from peerd.core.shares import plan_batches_and_steps
from peerd.sim.compute import SpeedModel


def round_steps(speed: SpeedModel, slots: np.ndarray, names: Sequence[str], batch: int, period: int) -> dict[int, int]:
    """Each live peer's local steps in a round of `period` steps, by slot."""
    samples_per_s = {n: speed.speed(int(s)) / speed.sample_time for s, n in zip(slots, names)}
    fixed = {n: speed.step_overhead for n in names}
    plan = plan_batches_and_steps(batch * len(names), samples_per_s, names, batch, fixed, period)
    return {int(s): plan.round_steps(n, period) for s, n in zip(slots, names)}
