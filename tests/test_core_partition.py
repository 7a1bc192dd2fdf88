"""peerd.core.partition: the per-epoch data shards."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peerd.core.partition import epoch_permutation, my_shard

FAST = settings(max_examples=60, deadline=None)
peer_ids = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=10)
members_st = st.lists(peer_ids, min_size=1, max_size=20, unique=True)


@given(st.integers(min_value=0, max_value=2000), st.text(max_size=10), st.integers(min_value=0, max_value=10**6))
@FAST
def test_epoch_permutation_is_permutation(n, job, epoch):
    order = epoch_permutation(n, job, epoch)
    assert sorted(order) == list(range(n))
    assert epoch_permutation(n, job, epoch) == order


def test_epoch_permutation_golden():
    # All peers must agree on the order, across Python versions and platforms.
    assert epoch_permutation(12, "job", 2) == [10, 6, 2, 7, 4, 11, 5, 0, 3, 8, 1, 9]


def test_epoch_permutation_varies():
    orders = {tuple(epoch_permutation(100, "job", e)) for e in range(10)}
    assert len(orders) == 10
    assert epoch_permutation(100, "job-a", 0) != epoch_permutation(100, "job-b", 0)
    # It actually shuffles.
    assert epoch_permutation(100, "job", 0) != list(range(100))


@given(members_st, st.data(), st.text(max_size=10), st.integers(min_value=0, max_value=1000))
@FAST
def test_shards_partition_samples(members, data, job, epoch):
    n = data.draw(st.integers(min_value=len(members), max_value=1000))
    shards = {m: my_shard(n, job, epoch, members, m) for m in members}
    counts = Counter(i for shard in shards.values() for i in shard)
    assert counts == Counter(range(n))
    sizes = [len(s) for s in shards.values()]
    assert max(sizes) - min(sizes) <= 1
    assert all(sizes)


@given(members_st, st.data(), st.integers(min_value=0, max_value=1000))
@FAST
def test_shard_is_slice_of_epoch_permutation_in_sorted_member_order(members, data, epoch):
    n = data.draw(st.integers(min_value=len(members), max_value=500))
    joined = [i for m in sorted(members) for i in my_shard(n, "job", epoch, members, m)]
    assert joined == epoch_permutation(n, "job", epoch)


@given(members_st, st.data(), st.integers(min_value=0, max_value=1000), st.randoms(use_true_random=False))
@FAST
def test_shard_independent_of_member_order(members, data, epoch, rnd):
    n = data.draw(st.integers(min_value=len(members), max_value=300))
    shuffled = list(members)
    rnd.shuffle(shuffled)
    duplicated = shuffled + shuffled[:3]
    for m in members:
        base = my_shard(n, "job", epoch, members, m)
        assert my_shard(n, "job", epoch, shuffled, m) == base
        assert my_shard(n, "job", epoch, tuple(reversed(members)), m) == base
        assert my_shard(n, "job", epoch, duplicated, m) == base
        # Deterministic.
        assert my_shard(n, "job", epoch, members, m) == base


def test_shard_differs_between_epochs():
    members = ["a", "b", "c"]
    for m in members:
        shards = {tuple(my_shard(300, "job", e, members, m)) for e in range(5)}
        assert len(shards) == 5


def test_single_member_reads_everything():
    shard = my_shard(50, "job", 3, ["only"], "only")
    assert sorted(shard) == list(range(50))
    assert shard == epoch_permutation(50, "job", 3)


def test_shard_changes_with_membership():
    # Elasticity: a joining member takes its share, the others' shards shrink.
    before = my_shard(100, "job", 0, ["a", "b"], "a")
    after = my_shard(100, "job", 0, ["a", "b", "c"], "a")
    assert len(before) == 50 and len(after) in (33, 34)


@pytest.mark.parametrize("members", [[], ["a", "b"], ["x"]])
def test_me_not_in_members(members):
    with pytest.raises(ValueError):
        my_shard(100, "job", 0, members, "me")


def test_more_members_than_samples_still_partitions():
    members = ["a", "b", "c", "d"]
    shards = [my_shard(2, "job", 0, members, m) for m in members]
    assert sorted(i for s in shards for i in s) == [0, 1]

