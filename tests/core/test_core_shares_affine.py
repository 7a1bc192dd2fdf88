"""peerd.core.shares with fixed per-step costs: the affine step model
t_i(b) = a_i + b/w_i and the plan that equalises the members' step times."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from peerd.core.shares import (
    BatchPlan, Rebalancer, StepCost, equal_time_quotas, fill_costs, plan_batches, published_costs, round_quotas,
    step_time,
)

FAST = settings(max_examples=120, deadline=None)
ids_st = st.lists(st.text(alphabet="abcdefghij0123456789", min_size=1, max_size=6), min_size=1, max_size=10,
                  unique=True)
speed_st = st.floats(min_value=1.0, max_value=1e4)
fixed_st = st.floats(min_value=0.0, max_value=2.0)


@st.composite
def members_st(draw):
    """(speeds, fixed costs) of 1-10 measured members."""
    ids = draw(ids_st)
    return ({p: draw(speed_st) for p in ids}, {p: draw(fixed_st) for p in ids})


def test_golden_a_member_with_a_fixed_cost_gets_the_batch_that_equalises_the_times():
    # Equal speeds of 100 samples/s; c pays 0.2 s per step whatever its batch.
    # T = (120 + 0.2·100) / 300 = 0.4667 s: a and b get 46.67, c 26.67 samples
    # (equal remainders: the extra samples to the lower ids).
    plan = plan_batches(120, {"a": 100.0, "b": 100.0, "c": 100.0}, ["a", "b", "c"], fixed={"c": 0.2})
    assert plan.batches == (("a", 47), ("b", 47), ("c", 26))
    assert plan_batches(120, {"a": 100.0, "b": 100.0, "c": 100.0}, ["a", "b", "c"]).batches == \
        (("a", 40), ("b", 40), ("c", 40))
    times = [0.47, 0.47, 0.2 + 0.26]
    assert step_time(plan, {"a": 100.0, "b": 100.0, "c": 100.0}, {"c": 0.2}) == pytest.approx(max(times))


def test_a_member_whose_fixed_cost_exceeds_the_step_is_held_at_the_minimum_and_the_rest_resolved():
    speeds = {"a": 100.0, "b": 100.0, "c": 100.0}
    plan = plan_batches(60, speeds, ["a", "b", "c"], min_local_batch=4, fixed={"c": 1.0})
    # c alone would take 1.04 s at 4 samples; a and b share the other 56 equally.
    assert plan.batches == (("a", 28), ("b", 28), ("c", 4))


def test_unmeasured_members_get_the_mean_fixed_cost_and_old_peers_none():
    costs = fill_costs({"a": 10.0, "b": 30.0, "old": 20.0}, ["a", "b", "old", "new"], {"a": 0.1, "b": 0.3})
    assert costs["old"].fixed_s == 0.0  # measured, publishes no fixed cost: proportional
    assert costs["new"].fixed_s == pytest.approx(0.4 / 3)  # not measured: the mean of the measured ones
    assert costs["new"].speed == pytest.approx(20.0)


def test_published_values_map_to_the_planners_speeds_and_fixed_costs():
    speeds, fixed = published_costs({"new": 50.0, "old": 40.0, "script": 30.0, "starting": math.nan},
                                    {"new": 0.5, "old": 0.0, "script": math.nan, "starting": math.nan},
                                    {"new": 0.01, "old": 0.0, "script": math.nan, "starting": math.nan})
    assert (speeds["new"], speeds["old"], speeds["script"]) == (100.0, 40.0, 30.0)
    assert math.isnan(speeds["starting"])  # not measured yet: the plan gives it the mean
    assert fixed == {"new": 0.5}


@given(members_st(), st.integers(1, 4096), st.integers(1, 32))
@FAST
def test_affine_plan_sums_to_the_global_batch_and_respects_the_minimum(costs, batch, minimum):
    speeds, fixed = costs
    plan = plan_batches(batch, speeds, list(speeds), minimum, fixed)
    assert all(b >= minimum for _, b in plan.batches)
    if batch >= minimum * len(speeds):
        assert plan.total == batch


# A member whose own quota rounds down to exactly the minimum is not pinned: it is
# within one of its samples of T like the others, not above T.
@example(costs=({**dict.fromkeys(["0", "1", "2", "4", "5", "6", "00", "000"], 1.0), "3": 1665.0, "0000": 7585.0},
                {"3": 0.011285240553648991, "0000": 0.18811058451656854}), batch=562, minimum=29)
@given(members_st(), st.integers(1, 4096), st.integers(1, 32))
@FAST
def test_members_above_the_minimum_take_equal_times_up_to_one_sample(costs, batch, minimum):
    speeds, fixed = costs
    plan = plan_batches(batch, speeds, list(speeds), minimum, fixed)
    c = fill_costs(speeds, plan.ids, fixed)
    free = [(p, b) for p, b in plan.batches if b > minimum]
    for p, bp in free:
        for q, bq in free:
            # each within one sample of the common T
            assert abs(c[p].time(bp) - c[q].time(bq)) <= 1 / c[p].speed + 1 / c[q].speed + 1e-9
    # and a member at the minimum is never faster than the common T by more than one
    # of its samples (T is at least each free member's time less one of its samples)
    for p, b in plan.batches:
        if b == minimum and free:
            common = max(c[q].time(bq) - 1 / c[q].speed for q, bq in free)
            assert c[p].time(b) + 1 / c[p].speed >= common - 1e-9


@given(st.dictionaries(st.text("abcdef", min_size=1, max_size=3), speed_st, min_size=1, max_size=8),
       st.integers(1, 4096), st.integers(1, 32))
@FAST
def test_with_no_fixed_costs_it_is_exactly_the_proportional_plan(speeds, batch, minimum):
    members = list(speeds)
    zeros = {p: 0.0 for p in members}
    assert plan_batches(batch, speeds, members, minimum, zeros) == plan_batches(batch, speeds, members, minimum)
    plan = plan_batches(batch, speeds, members, minimum)
    assert step_time(plan, speeds, zeros) == step_time(plan, speeds)


@given(members_st(), st.integers(1, 2048), st.integers(1, 16), st.randoms(use_true_random=False))
@FAST
def test_affine_plan_is_the_same_whatever_the_input_order(costs, batch, minimum, rnd):
    speeds, fixed = costs
    members = list(speeds)
    plan = plan_batches(batch, speeds, members, minimum, fixed)
    items, fitems = list(speeds.items()), list(fixed.items())
    rnd.shuffle(items)
    rnd.shuffle(fitems)
    rnd.shuffle(members)
    assert plan_batches(batch, dict(items), members + members[:1], minimum, dict(fitems)) == plan
    assert list(plan.ids) == sorted(speeds)


@given(members_st(), st.integers(64, 4096), st.sampled_from([0, 1, 2]))
@FAST
def test_the_largest_fixed_cost_gets_a_smaller_batch_than_the_proportional_plan(costs, batch, pick):
    speeds, fixed = costs
    assume(len(speeds) >= 2)
    members = sorted(speeds)
    heavy = members[pick % len(members)]
    fixed = {p: (0.0 if p != heavy else fixed[heavy] + 0.5) for p in members}
    # The real quotas: the heavy member's below its proportional one, every other above.
    costs = [StepCost(speeds[p], fixed[p]) for p in members]
    quotas = dict(zip(members, equal_time_quotas(batch, costs)))
    shares = dict(zip(members, equal_time_quotas(batch, [StepCost(speeds[p]) for p in members])))
    assert quotas[heavy] < shares[heavy]
    assert all(quotas[p] > shares[p] for p in members if p != heavy)
    # The integer plans follow, up to one sample of rounding (found by hypothesis:
    # speeds 1, 21, 1 at B = 215 round a light member's 9.37 down where its 9.35 rounded up).
    affine = plan_batches(batch, speeds, members, 1, fixed)
    proportional = plan_batches(batch, speeds, members, 1)
    assert affine.batch(heavy) <= proportional.batch(heavy) + 1
    assert all(affine.batch(p) >= proportional.batch(p) - 1 for p in members if p != heavy)


def test_round_quotas_keeps_the_sum_exact_whatever_the_float_error():
    assert round_quotas(10, [3.3333333, 3.3333333, 3.3333334]) == [3, 3, 4]
    assert sum(round_quotas(6, [2.0000000001, 2.0000000001, 2.0000000001])) == 6
    assert sum(round_quotas(6, [1.9999999999, 1.9999999999, 1.9999999999])) == 6
    assert round_quotas(5, [-1.5, 6.5]) == [-1, 6]  # equal remainders: the lower index


def test_rebalancer_moves_batch_off_a_member_whose_fixed_cost_grew():
    r = Rebalancer(global_batch=120, every_rounds=1, threshold=0.1)
    speeds = {"a": 100.0, "b": 100.0, "c": 100.0}
    assert r.update(0, list(speeds), speeds)
    assert r.plan.batches == (("a", 40), ("b", 40), ("c", 40))
    # c now pays 0.2 s a step: the equal plan's step is 0.6 s, the affine one's 0.47 s.
    assert r.update(1, list(speeds), speeds, {"c": 0.2})
    assert r.plan.batch("c") == 26
    # A small change of the fixed cost is under the threshold: no flap.
    assert not r.update(2, list(speeds), speeds, {"c": 0.21})


def test_step_time_adds_the_fixed_cost():
    plan = BatchPlan((("a", 40), ("b", 10)))
    assert step_time(plan, {"a": 100.0, "b": 10.0}, {"a": 0.7}) == pytest.approx(1.1)
