"""peerd.core.partition: the per-epoch data shards."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peerd.core.partition import chunk_at, chunk_bounds, epoch_permutation, my_shard, part_bounds

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



# --- chunks: the split re-made at each chunk boundary ------------------------------------

shares_st = st.floats(min_value=0, max_value=100, allow_nan=False)


@given(st.integers(0, 600), st.integers(1, 50), st.data())
@FAST
def test_parts_partition_each_chunk_and_chunks_partition_the_epoch(n, chunks, data):
    """Whatever members and shares each chunk is split by, every position of the
    epoch falls in exactly one member's part of exactly one chunk."""
    bounds = chunk_bounds(n, chunks)
    assert len(bounds) == chunks + 1 and bounds[0] == 0 and bounds[-1] == n
    sizes = [b - a for a, b in zip(bounds, bounds[1:])]
    assert min(sizes) >= 0 and max(sizes) - min(sizes) <= 1
    covered = []
    for c in range(chunks):
        members = data.draw(members_st)
        shares = data.draw(st.none() | st.fixed_dictionaries({m: shares_st for m in members}))
        parts = {m: part_bounds(bounds[c], bounds[c + 1], members, m, shares) for m in members}
        for a, b in parts.values():
            assert bounds[c] <= a <= b <= bounds[c + 1]
            covered += range(a, b)
        # Any order of the member list gives the same parts.
        again = data.draw(st.permutations(members))
        assert {m: part_bounds(bounds[c], bounds[c + 1], again, m, shares) for m in members} == parts
    assert sorted(covered) == list(range(n))


@given(st.integers(1, 600), st.integers(1, 50), st.data())
@FAST
def test_parts_follow_the_shares(n, chunks, data):
    members = data.draw(members_st)
    shares = data.draw(st.fixed_dictionaries({m: st.floats(0.01, 100) for m in members}))
    total = sum(shares.values())
    bounds = chunk_bounds(n, chunks)
    for c in range(chunks):
        for m in members:
            a, b = part_bounds(bounds[c], bounds[c + 1], members, m, shares)
            assert abs((b - a) - (bounds[c + 1] - bounds[c]) * shares[m] / total) < 1 + 1e-9


def test_rounding_leftovers_go_round_the_members():
    """Chunks smaller than the member count (here: of one sample) give their
    samples to each member in turn, not always to the same one."""
    bounds = chunk_bounds(6, 8)
    got = Counter()
    for c in range(8):
        for m in ("a", "b"):
            a, b = part_bounds(bounds[c], bounds[c + 1], ["a", "b"], m)
            got[m] += b - a
    assert got == {"a": 3, "b": 3}


@given(st.integers(1, 100_000), st.integers(1, 64), st.integers(0, 1000), st.data())
@FAST
def test_a_position_inside_a_chunk_resumes_at_the_next_boundary(n, chunks, epoch, data):
    bounds = chunk_bounds(n, chunks)
    c = data.draw(st.sampled_from([c for c in range(chunks) if bounds[c + 1] > bounds[c]] or [0]))
    if bounds[c + 1] == bounds[c]:
        return
    x = data.draw(st.integers(bounds[c] + 1, bounds[c + 1]))  # at least one sample of chunk c read
    progress = epoch + x / n  # as a donor reports it: a float
    if x < n:  # (at n the progress is the next epoch's start: chunk 0 of it)
        assert int(progress) == epoch and chunk_at(bounds, progress - epoch) == c + 1
    # At a boundary nothing of the chunk is read yet: resume at that chunk (or an
    # empty one just before it, which holds nothing).
    start = epoch + bounds[c] / n
    assert bounds[chunk_at(bounds, start - int(start))] == bounds[c]


def test_chunk_at_the_ends():
    bounds = chunk_bounds(4000, 8)
    assert chunk_at(bounds, 0.0) == 0
    assert chunk_at(bounds, 1.0) == 8
    assert chunk_at(bounds, 0.2) == 2 and chunk_at(bounds, 0.25) == 2 and chunk_at(bounds, 0.2503) == 3


@pytest.mark.parametrize("n, chunks", [(-1, 3), (10, 0)])
def test_bad_chunks_are_refused(n, chunks):
    with pytest.raises(ValueError):
        chunk_bounds(n, chunks)
