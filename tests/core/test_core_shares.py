"""peerd.core.shares (DBS batch plan) and the share-weighted data partition."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peerd.core.partition import epoch_permutation, my_shard
from peerd.core.shares import BatchPlan, Rebalancer, apportion, fill_unknown, plan_batches, step_time

FAST = settings(max_examples=80, deadline=None)
peer_ids = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=8)
speed_st = st.one_of(st.floats(min_value=0.01, max_value=1e5), st.just(math.nan), st.just(0.0))
speeds_st = st.dictionaries(peer_ids, speed_st, min_size=1, max_size=12)


@given(st.integers(0, 5000), st.lists(st.floats(0, 1e6), min_size=1, max_size=20))
@FAST
def test_apportion_sums_and_stays_within_one_of_the_quota(total, weights):
    out = apportion(total, weights)
    assert sum(out) == total and all(x >= 0 for x in out)
    s = math.fsum(weights) or None
    for x, w in zip(out, weights):
        quota = total * w / s if s else total / len(weights)
        assert abs(x - quota) < 1 + 1e-9


def test_apportion_golden_and_ties_to_the_lower_index():
    assert apportion(10, [1, 1, 1]) == [4, 3, 3]
    assert apportion(128, [4, 4, 2, 1]) == [47, 46, 23, 12]
    assert apportion(5, [0, 0]) == [3, 2]
    with pytest.raises(ValueError):
        apportion(3, [1, -1])


def test_unknown_speeds_get_the_mean_of_the_measured_or_an_equal_share():
    assert fill_unknown({"a": 10.0, "b": 30.0, "c": math.nan}, ["a", "b", "c", "d"]) == \
        {"a": 10.0, "b": 30.0, "c": 20.0, "d": 20.0}
    assert fill_unknown({}, ["b", "a"]) == {"a": 1.0, "b": 1.0}


def test_batches_follow_speed_and_sum_to_the_global_batch():
    plan = plan_batches(128, {"p0": 400.0, "p1": 400.0, "p2": 200.0, "p3": 100.0}, ["p3", "p2", "p1", "p0"])
    assert plan.batches == (("p0", 47), ("p1", 46), ("p2", 23), ("p3", 12))
    assert plan.total == 128 and plan.lr_scale("p3") == pytest.approx(12 / 32)
    assert plan.shares()["p0"] == pytest.approx(47 / 128)


def test_the_minimum_is_honoured_and_the_rest_reapportioned():
    plan = plan_batches(100, {"a": 1000.0, "b": 1.0, "c": 1.0}, ["a", "b", "c"], min_local_batch=8)
    assert plan.batches == (("a", 84), ("b", 8), ("c", 8))
    # A global batch below members × minimum: the minimum wins.
    assert plan_batches(10, {}, ["a", "b", "c"], min_local_batch=4).batches == (("a", 4), ("b", 4), ("c", 4))


@given(speeds_st, st.integers(1, 4096), st.integers(1, 64), st.randoms(use_true_random=False))
@FAST
def test_plan_is_the_same_whatever_the_input_order(speeds, batch, minimum, rnd):
    members = list(speeds)
    plan = plan_batches(batch, speeds, members, minimum)
    shuffled = list(speeds.items())
    rnd.shuffle(shuffled)
    rnd.shuffle(members)
    assert plan_batches(batch, dict(shuffled), members + members[:1], minimum) == plan
    assert list(plan.ids) == sorted(speeds)
    assert all(b >= minimum for _, b in plan.batches)
    if batch >= minimum * len(members):
        assert plan.total == batch
    # Faster never gets a smaller batch than slower (both measured, both above the minimum).
    filled = fill_unknown(speeds, members)
    for p, bp in plan.batches:
        for q, bq in plan.batches:
            if filled[p] > filled[q]:
                assert bp >= bq


def test_rebalancer_keeps_the_plan_within_the_threshold_and_between_evaluations():
    r = Rebalancer(global_batch=100, every_rounds=5, threshold=0.1)
    members = ["a", "b"]
    assert r.update(0, members, {"a": 100.0, "b": 100.0})
    assert r.plan.batches == (("a", 50), ("b", 50))
    # Between evaluation rounds nothing changes, however the speeds move.
    assert not r.update(3, members, {"a": 300.0, "b": 100.0})
    # At an evaluation round, noise under the threshold is ignored...
    assert not r.update(5, members, {"a": 104.0, "b": 96.0})
    assert r.plan.batches == (("a", 50), ("b", 50))
    # ... a real slowdown is not, and a recovery gives the share back.
    assert r.update(10, members, {"a": 100.0, "b": 25.0})
    assert r.plan.batches == (("a", 80), ("b", 20))
    assert r.update(15, members, {"a": 100.0, "b": 100.0})
    assert r.plan.batches == (("a", 50), ("b", 50))


def test_a_rebalancer_that_steps_over_its_evaluation_rounds_evaluates_at_the_next_update():
    # A slow member steps up to the others' round: 8 → 36 crosses 10 … 35.
    r = Rebalancer(global_batch=100, every_rounds=5, threshold=0.1)
    members = ["a", "b"]
    assert r.update(8, members, {"a": 100.0, "b": 100.0})  # its first plan
    assert r.update(36, members, {"a": 100.0, "b": 25.0})
    assert r.plan.batches == (("a", 80), ("b", 20))
    assert not r.update(37, members, {"a": 25.0, "b": 100.0})  # and not again until 40
    assert r.update(40, members, {"a": 25.0, "b": 100.0})


def test_rebalancer_replans_at_once_when_members_change():
    r = Rebalancer(global_batch=90, every_rounds=100)
    r.update(1, ["a", "b"], {"a": 1.0, "b": 1.0})
    assert r.update(2, ["a", "b", "c"], {"a": 1.0, "b": 1.0})  # c unmeasured: the mean
    assert r.plan.batches == (("a", 30), ("b", 30), ("c", 30))



def test_step_time_is_the_slowest_member():
    plan = BatchPlan((("a", 40), ("b", 10)))
    assert step_time(plan, {"a": 100.0, "b": 10.0}) == pytest.approx(1.0)
    assert step_time(plan, {"a": 100.0}) == pytest.approx(0.4)  # b unmeasured: at a's speed


def test_noise_on_a_small_batch_does_not_flap_the_plan():
    r = Rebalancer(global_batch=100, every_rounds=1, threshold=0.1)
    r.update(0, ["a", "b", "c"], {"a": 400.0, "b": 400.0, "c": 100.0})
    assert r.plan.batches == (("a", 45), ("b", 44), ("c", 11))
    # c measured 20 % faster: its batch would move by 2 (18 %), but a step gets only 2 % faster.
    assert not r.update(1, ["a", "b", "c"], {"a": 400.0, "b": 400.0, "c": 120.0})


@given(st.data(), st.integers(0, 1000))
@FAST
def test_shards_in_proportion_to_shares_partition_the_indices(data, epoch):
    speeds = data.draw(speeds_st)
    members = list(speeds)
    n = data.draw(st.integers(0, 2000))
    plan = plan_batches(data.draw(st.integers(1, 512)), speeds, members)
    shares = plan.shares()
    shards = {m: my_shard(n, "job", epoch, members, m, shares) for m in members}
    assert Counter(i for s in shards.values() for i in s) == Counter(range(n))
    for m, shard in shards.items():
        assert abs(len(shard) - n * shares[m]) < 1 + 1e-9
    # Laid out in sorted-id order along the epoch's permutation, like equal shards.
    assert [i for m in sorted(members) for i in shards[m]] == epoch_permutation(n, "job", epoch)


def test_equal_shares_split_like_the_equal_partition():
    members = ["a", "b", "c"]
    weighted = [len(my_shard(10, "j", 0, members, m, {p: 1.0 for p in members})) for m in members]
    assert sorted(weighted) == sorted(len(my_shard(10, "j", 0, members, m)) for m in members)


def test_a_member_without_a_share_is_refused():
    with pytest.raises(ValueError, match="no share for b"):
        my_shard(10, "j", 0, ["a", "b"], "a", {"a": 1.0})


def test_peers_that_disagree_slightly_on_shares_overlap_only_at_the_boundaries():
    """Views may lag: two peers holding plans that differ by δ in a share misread
    at most ⌈δ·n⌉ + 1 samples at each boundary, not a whole shard."""
    n, members = 1000, ["a", "b", "c"]
    old = {"a": 0.5, "b": 0.3, "c": 0.2}
    new = {"a": 0.48, "b": 0.32, "c": 0.2}
    union = Counter(my_shard(n, "j", 0, members, "a", old)) + Counter(my_shard(n, "j", 0, members, "b", new)) \
        + Counter(my_shard(n, "j", 0, members, "c", new))
    missing = n - len(union)
    doubled = sum(1 for c in union.values() if c > 1)
    assert missing + doubled <= math.ceil(0.02 * n) + 1
