"""Dynamic batch size (DBS, DESIGN §1.5): local batches in proportion to speed.

From the job's target global batch B and the measured speeds v_i (samples/s) of
the members, member i trains on b_i ≈ v_i/Σv · B samples per step, so that every
member takes one step in about the same wall time and nobody waits on the
others. Its part of each chunk of an epoch's data is b_i / Σb, so every member
also reaches the end of its part after the same number of steps.

Pure and deterministic: the same members, speeds and settings give the same
plan on every peer (ids sorted, integer largest-remainder rounding, ties to the
lower id), whatever the order of the inputs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


def apportion(total: int, weights: Sequence[float]) -> list[int]:
    """Non-negative integers proportional to `weights` that sum to `total`.

    Largest remainder (Hamilton): floor of each exact quota, then one more to
    the largest remainders, ties to the lower index. Zero weights get zero,
    unless every weight is zero, which counts as all equal."""
    if total < 0:
        raise ValueError(f"total must be ≥ 0, got {total}")
    if not weights:
        if total:
            raise ValueError("cannot apportion a positive total among no one")
        return []
    if any(not math.isfinite(w) or w < 0 for w in weights):
        raise ValueError(f"weights must be finite and ≥ 0, got {list(weights)}")
    s = math.fsum(weights)
    if s == 0:
        weights, s = [1.0] * len(weights), float(len(weights))
    quotas = [total * w / s for w in weights]
    out = [math.floor(q) for q in quotas]
    left = total - sum(out)
    by_remainder = sorted(range(len(out)), key=lambda k: (-(quotas[k] - out[k]), k))
    for k in by_remainder[:left]:
        out[k] += 1
    return out


def fill_unknown(speeds: Mapping[str, float], members: Iterable[str]) -> dict[str, float]:
    """Each member's speed; a member with no measurement yet (missing, NaN or
    ≤ 0) gets the mean of the measured ones, or 1.0 when none is measured (an
    equal share)."""
    ids = sorted(set(members))
    known = {p: speeds[p] for p in ids if p in speeds and math.isfinite(speeds[p]) and speeds[p] > 0}
    default = math.fsum(known.values()) / len(known) if known else 1.0
    return {p: known.get(p, default) for p in ids}


@dataclass(frozen=True)
class BatchPlan:
    """Each member's local batch, in sorted-id order."""

    batches: tuple[tuple[str, int], ...]

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(p for p, _ in self.batches)

    @property
    def total(self) -> int:
        """Σ b_i: the global batch one round of steps adds up to."""
        return sum(b for _, b in self.batches)

    @property
    def mean(self) -> float:
        return self.total / len(self.batches)

    def batch(self, peer: str) -> int:
        return dict(self.batches)[peer]

    def shares(self) -> dict[str, float]:
        """b_i / Σb: each member's part of the data."""
        total = self.total
        return {p: b / total for p, b in self.batches}

    def lr_scale(self, peer: str) -> float:
        """b_i / mean(b). With unweighted averaging, the mean model then moves by
        lr · Σ b_i·g_i / Σ b_i: one step of batch Σb on the union of the samples."""
        return self.batch(peer) / self.mean


def plan_batches(global_batch: int, speeds: Mapping[str, float], members: Iterable[str],
                 min_local_batch: int = 1) -> BatchPlan:
    """b_i = round(v_i/Σv · B), at least `min_local_batch`, summing to B when
    B ≥ members × min_local_batch (the minimum wins otherwise)."""
    if global_batch < 1 or min_local_batch < 1:
        raise ValueError("global_batch and min_local_batch must be ≥ 1")
    filled = fill_unknown(speeds, members)
    if not filled:
        raise ValueError("a plan needs at least one member")
    ids = list(filled)
    pinned: dict[str, int] = {}  # members raised to the minimum
    while True:
        free = [p for p in ids if p not in pinned]
        left = global_batch - min_local_batch * len(pinned)
        if not free or left < min_local_batch * len(free):
            pinned.update({p: min_local_batch for p in free})
            break
        sizes = dict(zip(free, apportion(left, [filled[p] for p in free])))
        low = [p for p in free if sizes[p] < min_local_batch]
        if not low:
            pinned.update(sizes)
            break
        pinned.update({p: min_local_batch for p in low})
    return BatchPlan(tuple((p, pinned[p]) for p in ids))


def equal_plan(local_batch: int, members: Iterable[str]) -> BatchPlan:
    """Every member at the job's fixed local batch (DBS off)."""
    return BatchPlan(tuple((p, local_batch) for p in sorted(set(members))))


def step_time(plan: BatchPlan, speeds: Mapping[str, float]) -> float:
    """Predicted seconds of one step of all members: the slowest, max_i b_i / v_i
    (members with no measurement count at the mean speed, as in the plan)."""
    filled = fill_unknown(speeds, plan.ids)
    return max(b / filled[p] for p, b in plan.batches)


@dataclass
class Rebalancer:
    """The plan in force, re-evaluated every `every_rounds` rounds with hysteresis.

    A new plan is taken at once when the members change (the shares must cover
    exactly the members); otherwise only at rounds that are multiples of
    `every_rounds` (the same rounds on every peer), and only if it would make a
    step of all members (the slowest one, `step_time`) faster by more than
    `threshold` (relative), so measurement noise does not flap the batches. The
    criterion is the time the plan costs, not how much a batch moves: ±2 samples
    on a batch of 10 is 20 % but costs nothing when that peer is not the slowest."""

    global_batch: int
    min_local_batch: int = 1
    every_rounds: int = 10
    threshold: float = 0.1
    plan: BatchPlan | None = None

    def __post_init__(self) -> None:
        if self.every_rounds < 1 or self.threshold < 0:
            raise ValueError("every_rounds must be ≥ 1 and threshold ≥ 0")

    def update(self, round_: int, members: Iterable[str], speeds: Mapping[str, float]) -> bool:
        """Feed the view at `round_`; True if the plan changed."""
        ids = tuple(sorted(set(members)))
        if self.plan is not None and ids == self.plan.ids and round_ % self.every_rounds:
            return False
        candidate = plan_batches(self.global_batch, speeds, ids, self.min_local_batch)
        if self.plan is not None and ids == self.plan.ids and \
                step_time(self.plan, speeds) <= (1 + self.threshold) * step_time(candidate, speeds):
            return False
        changed = candidate != self.plan
        self.plan = candidate
        return changed
