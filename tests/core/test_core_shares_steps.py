"""peerd.core.shares: fewer local steps per round for a member that is slower
than the others even at the minimum batch (plan_batches_and_steps, round_time, the
Rebalancer's period)."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from peerd.core.shares import (
    BatchPlan, Rebalancer, fill_costs, plan_batches, plan_batches_and_steps, round_time, step_time,
)

FAST = settings(max_examples=150, deadline=None)
ids_st = st.lists(st.text(alphabet="abcdefghij0123456789", min_size=1, max_size=6), min_size=1, max_size=10,
                  unique=True)


@st.composite
def job_st(draw):
    """(B, speeds, fixed costs, minimum, S) of 1-10 measured members."""
    ids = draw(ids_st)
    speeds = {p: draw(st.floats(min_value=1.0, max_value=1e4)) for p in ids}
    fixed = {p: draw(st.floats(min_value=0.0, max_value=2.0)) for p in ids}
    return (draw(st.integers(1, 400)), speeds, fixed, draw(st.integers(1, 8)), draw(st.integers(1, 16)))


SPEEDS = {"a": 100.0, "b": 100.0, "c": 100.0}


def test_golden_a_pinned_slow_member_takes_the_steps_that_fit_in_the_others_round():
    # c pays 1 s per step: pinned at 4 samples (1.04 s) while a and b take 28 (0.28 s).
    # S = 8: the others' round is 2.24 s; c fits floor(8·0.28/1.04) = 2 steps (2.08 s).
    plan = plan_batches_and_steps(60, SPEEDS, ["a", "b", "c"], 4, {"c": 1.0}, period=8)
    assert plan.batches == (("a", 28), ("b", 28), ("c", 4))
    assert plan.steps == (("a", 8), ("b", 8), ("c", 2))
    assert [plan.round_steps(p, 8) for p in "abc"] == [8, 8, 2]
    # Each member's part of the data is what it reads in a round: 224, 224, 8 samples.
    assert plan.shares() == {"a": 224 / 456, "b": 224 / 456, "c": 8 / 456}
    assert plan.lr_scale("c") == 4 / 20  # unchanged: b_i / mean b
    assert plan.total == 60
    assert round_time(plan, SPEEDS, {"c": 1.0}, 8) == pytest.approx(2.24)
    # The same batches with every member at 8 steps: c's 8.32 s round sets the pace.
    assert round_time(BatchPlan(plan.batches), SPEEDS, {"c": 1.0}, 8) == pytest.approx(8.32)


def test_a_member_slower_than_a_whole_round_still_takes_one_step():
    plan = plan_batches_and_steps(60, SPEEDS, ["a", "b", "c"], 4, {"c": 5.0}, period=8)
    assert plan.round_steps("c", 8) == 1


def test_with_one_step_per_round_or_nobody_pinned_the_plan_is_plan_batches():
    assert plan_batches_and_steps(60, SPEEDS, ["a", "b", "c"], 4, {"c": 1.0}, period=1) == \
        plan_batches(60, SPEEDS, ["a", "b", "c"], 4, {"c": 1.0})
    assert plan_batches_and_steps(60, SPEEDS, ["a", "b", "c"], 4, {"c": 0.1}, period=8) == \
        plan_batches(60, SPEEDS, ["a", "b", "c"], 4, {"c": 0.1})


def test_with_every_member_at_the_minimum_the_fastest_sets_the_round():
    plan = plan_batches_and_steps(8, SPEEDS, ["a", "b", "c"], 4, {"b": 0.1, "c": 1.0}, period=8)
    assert plan.batches == (("a", 4), ("b", 4), ("c", 4))
    # a: 0.04 s; b 0.14 s → floor(8·0.04/0.14) = 2; c 1.04 s → 1 (floor 0.31, at least one).
    assert plan.steps == (("a", 8), ("b", 2), ("c", 1))


def test_period_must_be_positive():
    with pytest.raises(ValueError):
        plan_batches_and_steps(60, SPEEDS, ["a"], period=0)
    with pytest.raises(ValueError):
        Rebalancer(global_batch=60, period=0)


@FAST
@given(job_st())
def test_steps_are_between_one_and_the_period_and_the_batches_are_plan_batches(job):
    total, speeds, fixed, minimum, period = job
    plan = plan_batches_and_steps(total, speeds, list(speeds), minimum, fixed, period)
    base = plan_batches(total, speeds, list(speeds), minimum, fixed)
    assert plan.batches == base.batches
    assert all(1 <= plan.round_steps(p, period) <= period for p in plan.ids)
    assert plan.steps == () or [p for p, _ in plan.steps] == list(plan.ids)
    assert math.isclose(math.fsum(plan.shares().values()), 1.0)
    assert plan.lr_scale(plan.ids[0]) == base.lr_scale(plan.ids[0])


@FAST
@given(job_st())
def test_a_member_with_fewer_steps_fits_in_the_common_round_within_one_of_its_steps(job):
    total, speeds, fixed, minimum, period = job
    plan = plan_batches_and_steps(total, speeds, list(speeds), minimum, fixed, period)
    costs = fill_costs(speeds, plan.ids, fixed)
    times = {p: costs[p].time(b) for p, b in plan.batches}
    free = [times[p] for p, b in plan.batches if b > minimum]
    common = period * (max(free) if free else min(times.values()))
    for p in plan.ids:
        s = plan.round_steps(p, period)
        if s < period:
            assert plan.batch(p) == minimum  # only members held at the minimum lose steps
            assert s * times[p] <= common * (1 + 1e-12) or s == 1
            assert (s + 1) * times[p] > common * (1 - 1e-12)  # one more step would not fit
            assert s * times[p] <= common + times[p] * (1 + 1e-12)
    # Never a slower round than every member taking S steps.
    assert round_time(plan, speeds, fixed, period) <= period * step_time(plan, speeds, fixed) * (1 + 1e-12)


@FAST
@given(job_st())
def test_nobody_pinned_means_every_member_takes_the_period(job):
    total, speeds, fixed, minimum, period = job
    base = plan_batches(total, speeds, list(speeds), minimum, fixed)
    if all(b > minimum for _, b in base.batches):
        assert plan_batches_and_steps(total, speeds, list(speeds), minimum, fixed, period) == base


@FAST
@given(job_st(), st.randoms(use_true_random=False))
def test_the_plan_does_not_depend_on_the_order_of_the_inputs(job, rnd):
    total, speeds, fixed, minimum, period = job
    ids = list(speeds)
    shuffled = ids[:]
    rnd.shuffle(shuffled)
    assert plan_batches_and_steps(total, dict((p, speeds[p]) for p in shuffled), shuffled, minimum,
                      dict((p, fixed[p]) for p in reversed(shuffled)), period) == \
        plan_batches_and_steps(total, speeds, ids, minimum, fixed, period)


def test_the_rebalancer_compares_round_times():
    # c's fixed cost grows from 0.1 s (nobody pinned) to 1 s: with S = 8 the current plan's
    # round (c at 8 steps of its batch) is far slower than the candidate's, so it is taken.
    r = Rebalancer(global_batch=60, min_local_batch=4, every_rounds=1, threshold=0.1, period=8)
    assert r.update(0, "abc", SPEEDS, {"c": 0.1})
    assert r.plan.steps == ()
    assert r.update(1, "abc", SPEEDS, {"c": 1.0})
    assert r.plan.round_steps("c", 8) == 2
    # A small change in c's cost moves no batch and no step: kept.
    assert not r.update(2, "abc", SPEEDS, {"c": 1.02})


@FAST
@given(job_st())
def test_with_nobody_slow_a_rebalancer_over_s_steps_decides_as_with_one(job):
    total, speeds, fixed, minimum, period = job
    slower = {p: v * (0.5 if k % 2 else 1.0) for k, (p, v) in enumerate(speeds.items())}
    views = [speeds, slower, speeds]
    assume(all(plan_batches_and_steps(total, v, list(speeds), minimum, fixed, period).steps == () for v in views))
    old, new = Rebalancer(total, minimum, 1, 0.1), Rebalancer(total, minimum, 1, 0.1, period=period)
    for round_, view in enumerate(views):
        assert old.update(round_, list(speeds), view, fixed) == new.update(round_, list(speeds), view, fixed)
        assert old.plan == new.plan
