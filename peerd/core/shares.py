"""Dynamic batch size (DBS, docs/algorithms.md §1.5): local batches that take every member
the same time.

Member i's step is modelled as t_i(b) = a_i + c_i·b: a fixed part a_i ≥ 0 that no
batch changes (the optimizer update, per-step overhead) and c_i > 0 seconds per
sample (forward and backward); its speed is w_i = 1/c_i samples/s of that part.
From the job's target global batch B, member i trains on b_i samples so that every
member takes one step in the same time T and Σb = B:

    T = (B + Σ a_j·w_j) / Σ w_j,    b_i = (T − a_i)·w_i

With every a_i = 0 this is b_i = w_i/Σw · B, the plan in proportion to speed.
Members that would fall under the minimum batch are held at it and T is solved
again over the others. A held member whose step is still slower than T takes
fewer of the round's S local steps (S = [gossip] period_steps):
s_i = max(1, floor(S·T / t_i(b_i))), so that its round takes no longer than the
others' S·T (plan_batches_and_steps). Its part of each chunk of an epoch's data is
s_i·b_i / Σ s_j·b_j, so every member also reaches the end of its part after the
same number of rounds.

Pure and deterministic: the same members, speeds, fixed costs and settings give
the same plan on every peer (ids sorted, integer largest-remainder rounding, ties
to the lower id), whatever the order of the inputs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


def round_quotas(total: int, quotas: Sequence[float]) -> list[int]:
    """Integers within one of `quotas` (which sum to `total`) that sum to `total`.

    Largest remainder (Hamilton): floor of each quota, then one more to the
    largest remainders, ties to the lower index. Float error can leave the floors
    a sample too many or too few of `total`; that is taken from the smallest
    remainders or given in turn, so the sum is always exact."""
    out = [math.floor(q) for q in quotas]
    left = total - sum(out)
    by_remainder = sorted(range(len(out)), key=lambda k: (-(quotas[k] - out[k]), k))
    for n in range(max(left, 0)):
        out[by_remainder[n % len(out)]] += 1
    for n in range(max(-left, 0)):
        out[by_remainder[-1 - n % len(out)]] -= 1
    return out


def apportion(total: int, weights: Sequence[float]) -> list[int]:
    """Non-negative integers proportional to `weights` that sum to `total`.

    Largest remainder (round_quotas). Zero weights get zero, unless every weight
    is zero, which counts as all equal."""
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
    return round_quotas(total, [total * w / s for w in weights])


def fill_unknown(speeds: Mapping[str, float], members: Iterable[str]) -> dict[str, float]:
    """Each member's speed; a member with no measurement yet (missing, NaN or
    ≤ 0) gets the mean of the measured ones, or 1.0 when none is measured (an
    equal share)."""
    ids = sorted(set(members))
    known = {p: speeds[p] for p in ids if _measured(speeds, p)}
    default = math.fsum(known.values()) / len(known) if known else 1.0
    return {p: known.get(p, default) for p in ids}


@dataclass(frozen=True)
class StepCost:
    """One member's step time model: t(b) = fixed_s + b / speed."""

    speed: float  # w = 1/c: samples/s of the part of a step that grows with the batch
    fixed_s: float = 0.0  # a: seconds of a step whatever its batch

    def time(self, batch: int) -> float:
        return self.fixed_s + batch / self.speed


def fill_costs(speeds: Mapping[str, float], members: Iterable[str],
               fixed: Mapping[str, float] | None = None) -> dict[str, StepCost]:
    """Each member's step cost. Speeds as fill_unknown. A measured member's fixed
    cost is its entry in `fixed`, 0 when it has none or it is not a number ≥ 0 (a
    peer that does not measure it is planned in proportion to its speed); an
    unmeasured member gets the mean fixed cost of the measured ones."""
    filled = fill_unknown(speeds, members)
    fixed = fixed or {}
    known = {p: _fixed(fixed.get(p, 0.0)) for p in filled if _measured(speeds, p)}
    default = math.fsum(known.values()) / len(known) if known else 0.0
    return {p: StepCost(v, known.get(p, default)) for p, v in filled.items()}


def equal_time_quotas(total: int, costs: Sequence[StepCost]) -> list[float]:
    """Real batches b_i that sum to `total` and give every member the same step
    time T: b_i = (T − a_i)·w_i with T = (total + Σ a_j·w_j) / Σ w_j. Written as
    (total + Σ a·w)·w_i/Σw − a_i·w_i so that with every a_i = 0 it is exactly
    apportion's total·w_i/Σw (the same floats, so the same plan). A member whose
    fixed cost alone exceeds T gets a negative quota."""
    w_sum = math.fsum(c.speed for c in costs)
    lifted = total + math.fsum(c.fixed_s * c.speed for c in costs)
    return [lifted * c.speed / w_sum - c.fixed_s * c.speed for c in costs]


@dataclass(frozen=True)
class BatchPlan:
    """Each member's local batch, in sorted-id order; and, when they differ, each
    member's local steps per round (`steps`, same order). Empty `steps`: every
    member takes the job's period_steps (the plan of every member unpinned)."""

    batches: tuple[tuple[str, int], ...]
    steps: tuple[tuple[str, int], ...] = ()

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

    def round_steps(self, peer: str, period: int) -> int:
        """Member `peer`'s local steps per round: `period` unless the plan gives it fewer."""
        return dict(self.steps).get(peer, period)

    def shares(self) -> dict[str, float]:
        """s_i·b_i / Σ s_j·b_j: each member's part of the data is what it reads in
        a round (b_i / Σb when every member takes the same steps)."""
        steps = dict(self.steps)
        read = {p: steps.get(p, 1) * b for p, b in self.batches}
        total = sum(read.values())
        return {p: r / total for p, r in read.items()}

    def lr_scale(self, peer: str) -> float:
        """b_i / mean(b). With unweighted averaging, the mean model then moves by
        lr · Σ b_i·g_i / Σ b_i: one step of batch Σb on the union of the samples."""
        return self.batch(peer) / self.mean


def plan_batches(global_batch: int, speeds: Mapping[str, float], members: Iterable[str],
                 min_local_batch: int = 1, fixed: Mapping[str, float] | None = None) -> BatchPlan:
    """Batches of equal predicted step time (equal_time_quotas), rounded by largest
    remainder, at least `min_local_batch`, summing to B when B ≥ members × minimum
    (the minimum wins otherwise). `fixed`: each member's fixed seconds per step
    (fill_costs); without it, b_i = round(v_i/Σv · B)."""
    if global_batch < 1 or min_local_batch < 1:
        raise ValueError("global_batch and min_local_batch must be ≥ 1")
    costs = fill_costs(speeds, members, fixed)
    if not costs:
        raise ValueError("a plan needs at least one member")
    ids = list(costs)
    pinned: dict[str, int] = {}  # members raised to the minimum
    while True:
        free = [p for p in ids if p not in pinned]
        left = global_batch - min_local_batch * len(pinned)
        if not free or left < min_local_batch * len(free):
            pinned.update({p: min_local_batch for p in free})
            break
        quotas = equal_time_quotas(left, [costs[p] for p in free])
        sizes = dict(zip(free, round_quotas(left, quotas)))
        low = [p for p in free if sizes[p] < min_local_batch]
        if not low:
            pinned.update(sizes)
            break
        pinned.update({p: min_local_batch for p in low})
    return BatchPlan(tuple((p, pinned[p]) for p in ids))


def plan_batches_and_steps(global_batch: int, speeds: Mapping[str, float], members: Iterable[str],
                           min_local_batch: int = 1, fixed: Mapping[str, float] | None = None,
                           period: int = 1) -> BatchPlan:
    """plan_batches, then each member's local steps per round out of `period` (S).

    T is the step time of the members above the minimum batch (the slowest of
    them, with the rounded batches; with every member at the minimum, the fastest
    member's). A member whose step is slower, t_i(b_i) > T (one at the minimum),
    takes s_i = max(1, floor(S·T / t_i(b_i))) steps, the most that fit in the
    others' round S·T; every other member takes S.
    When no member is slower than T (in particular when none is pinned) or S = 1,
    `steps` stays empty and the plan is plan_batches'."""
    if period < 1:
        raise ValueError(f"period must be ≥ 1, got {period}")
    plan = plan_batches(global_batch, speeds, members, min_local_batch, fixed)
    if period == 1:
        return plan
    costs = fill_costs(speeds, plan.ids, fixed)
    times = {p: costs[p].time(b) for p, b in plan.batches}
    unpinned = [times[p] for p, b in plan.batches if b > min_local_batch]
    common = max(unpinned) if unpinned else min(times.values())
    steps = {p: period if t <= common else min(period, max(1, math.floor(period * common / t)))
             for p, t in times.items()}
    if all(s == period for s in steps.values()):
        return plan
    return BatchPlan(plan.batches, tuple((p, steps[p]) for p in plan.ids))


def equal_plan(local_batch: int, members: Iterable[str]) -> BatchPlan:
    """Every member at the job's fixed local batch (DBS off)."""
    return BatchPlan(tuple((p, local_batch) for p in sorted(set(members))))


def step_time(plan: BatchPlan, speeds: Mapping[str, float], fixed: Mapping[str, float] | None = None) -> float:
    """Predicted seconds of one step of all members: the slowest, max_i a_i + b_i/v_i
    (members with no measurement count at the mean, as in the plan)."""
    costs = fill_costs(speeds, plan.ids, fixed)
    return max(costs[p].time(b) for p, b in plan.batches)


def round_time(plan: BatchPlan, speeds: Mapping[str, float], fixed: Mapping[str, float] | None = None,
               period: int = 1) -> float:
    """Predicted seconds of one round of all members: max_i s_i·(a_i + b_i/v_i),
    s_i the member's steps per round (`period` unless the plan gives fewer).
    With every s_i = period it is period × step_time."""
    costs = fill_costs(speeds, plan.ids, fixed)
    return max(plan.round_steps(p, period) * costs[p].time(b) for p, b in plan.batches)


def published_costs(samples_per_s: Mapping[str, float], fixed_s: Mapping[str, float],
                    per_sample_s: Mapping[str, float]) -> tuple[dict[str, float], dict[str, float]]:
    """The planner's speeds and fixed costs from what the members publish: the
    whole step's speed (samples/s), and from workers that split their step, its
    fixed seconds a and seconds per sample c. A member that publishes c > 0 (and
    a ≥ 0) is planned with speed 1/c and fixed cost a; any other (an older peer,
    a script job, which sees only whole steps) with its whole-step speed and no
    fixed cost: in proportion to its speed, as before."""
    speeds: dict[str, float] = {}
    fixed: dict[str, float] = {}
    for p in sorted(set(samples_per_s) | set(per_sample_s)):
        c, a = per_sample_s.get(p, math.nan), fixed_s.get(p, math.nan)
        if math.isfinite(c) and c > 0 and math.isfinite(a) and a >= 0:
            speeds[p], fixed[p] = 1.0 / c, a
        elif p in samples_per_s:
            speeds[p] = samples_per_s[p]
    return speeds, fixed


@dataclass
class Rebalancer:
    """The plan in force, re-evaluated every `every_rounds` rounds with hysteresis.

    A new plan is taken at once when the members change (the shares must cover
    exactly the members); otherwise only at rounds that are multiples of
    `every_rounds` (the same rounds on every peer), and only if it would make a
    round of all members (the slowest one, `round_time`) faster by more than
    `threshold` (relative), so measurement noise does not flap the batches. A
    member that stepped up past such a round (it joined a round ahead) evaluates
    at its next update, or it would keep a stale plan until it lands on one. The
    criterion is the time the plan costs, not how much a batch moves: ±2 samples
    on a batch of 10 is 20 % but costs nothing when that peer is not the slowest.
    `period`: the job's local steps per round (S), out of which plan_batches_and_steps gives
    slow members fewer; 1 plans the batches alone (plan_batches)."""

    global_batch: int
    min_local_batch: int = 1
    every_rounds: int = 10
    threshold: float = 0.1
    plan: BatchPlan | None = None
    period: int = 1
    last_round: int = -1  # of the last update: the evaluation rounds crossed since count

    def __post_init__(self) -> None:
        if self.every_rounds < 1 or self.threshold < 0 or self.period < 1:
            raise ValueError("every_rounds and period must be ≥ 1 and threshold ≥ 0")

    def update(self, round_: int, members: Iterable[str], speeds: Mapping[str, float],
               fixed: Mapping[str, float] | None = None) -> bool:
        """Feed the view at `round_` (speeds and fixed costs as plan_batches); True if the plan changed."""
        ids = tuple(sorted(set(members)))
        due = self.last_round < 0 or round_ // self.every_rounds != self.last_round // self.every_rounds
        self.last_round = round_
        if self.plan is not None and ids == self.plan.ids and not due:
            return False
        candidate = plan_batches_and_steps(self.global_batch, speeds, ids, self.min_local_batch, fixed, self.period)
        if self.plan is not None and ids == self.plan.ids and \
                self._pace(self.plan, speeds, fixed) <= (1 + self.threshold) * self._pace(candidate, speeds, fixed):
            return False
        changed = candidate != self.plan
        self.plan = candidate
        return changed

    def _pace(self, plan: BatchPlan, speeds: Mapping[str, float], fixed: Mapping[str, float] | None) -> float:
        """round_time / period, written so that with every s_i = period it is
        step_time's float exactly (the hysteresis then decides as it did)."""
        costs = fill_costs(speeds, plan.ids, fixed)
        return max(plan.round_steps(p, self.period) / self.period * costs[p].time(b) for p, b in plan.batches)


def _measured(speeds: Mapping[str, float], p: str) -> bool:
    return p in speeds and math.isfinite(speeds[p]) and speeds[p] > 0


def _fixed(a: float) -> float:
    return a if math.isfinite(a) and a >= 0 else 0.0
