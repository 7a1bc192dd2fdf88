"""peerd.core.groups: locality groups, owners and the mixing they imply."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peerd.core.groups import form_groups, plan_hierarchical

FAST = settings(max_examples=150, deadline=None)

# A view: peer id -> (rack, host); small alphabets so that peers share hosts and racks.
views = st.dictionaries(
    st.text(alphabet="abcdefghijklmnop", min_size=1, max_size=4),
    st.tuples(st.sampled_from(["r1", "r2", "r3"]), st.sampled_from(["h1", "h2", "h3", "h4"])),
    min_size=1,
    max_size=24,
)
sizes = st.integers(min_value=1, max_value=6)


def mixing(view, round_, segments, size, segment):
    """The exact matrix one hierarchical round applies to `segment`, built from
    every peer's own plan (rows: peers after, columns: peers before)."""
    peers = sorted(view)
    plans = {p: plan_hierarchical("job", round_, view, p, segments, size) for p in peers}
    index = {p: k for k, p in enumerate(peers)}
    m = [[Fraction(0)] * len(peers) for _ in peers]
    for p in peers:
        plan = plans[p]
        owner = plan.owners[segment]
        w = Fraction(plan.weight).limit_denominator(10_000)
        own_part = (1 - w) / len(plan.group)
        for q in plan.group:  # the owner's in-group average, which every member takes
            m[index[p]][index[q]] += own_part
        source = plans[owner].sources[segment]
        if source is not None:
            partner_group = plans[source].group
            for q in partner_group:
                m[index[p]][index[q]] += w / len(partner_group)
    return m


@given(views, sizes, st.integers(0, 1000))
@FAST
def test_groups_cover_every_peer_once_and_respect_the_size(view, size, round_):
    groups = form_groups("job", round_, view, size)
    flat = [p for g in groups for p in g]
    assert sorted(flat) == sorted(view)
    assert all(1 <= len(g) <= size for g in groups)
    assert all(list(g) == sorted(g) for g in groups)


@given(views, sizes, st.integers(0, 1000))
@FAST
def test_every_peer_computes_the_same_plan(view, size, round_):
    reordered = dict(reversed(list(view.items())))
    groups = form_groups("job", round_, view, size)
    assert form_groups("job", round_, reordered, size) == groups
    for p in view:
        plan = plan_hierarchical("job", round_, view, p, 8, size)
        assert plan.groups == groups and p in plan.group


@given(views, sizes, st.integers(1, 20))
@FAST
def test_segment_owners_partition_the_segments_inside_each_group(view, size, segments):
    for p in view:
        plan = plan_hierarchical("job", 3, view, p, segments, size)
        owned = [s for q in plan.group for s in plan.owned_by(q)]
        assert sorted(owned) == list(range(segments))
        assert all(plan.owners[s] in plan.group for s in range(segments))


@given(views, sizes, st.integers(0, 50), st.integers(0, 4))
@settings(max_examples=80, deadline=None)
def test_every_segment_mixing_matrix_is_doubly_stochastic(view, size, round_, segment):
    m = mixing(view, round_, 5, size, segment)
    n = len(m)
    assert all(sum(row) == 1 for row in m)
    assert all(sum(m[i][j] for i in range(n)) == 1 for j in range(n))
    assert all(v >= 0 for row in m for v in row)


@given(views, sizes, st.integers(0, 50))
@FAST
def test_cross_group_sources_are_owners_of_another_group(view, size, round_):
    groups = form_groups("job", round_, view, size)
    for p in view:
        plan = plan_hierarchical("job", round_, view, p, 6, size)
        for s, source in enumerate(plan.sources):
            if len(groups) == 1:
                assert source is None
                continue
            assert source not in plan.group
            partner = next(g for g in groups if source in g)
            assert partner[s % len(partner)] == source
        assert 0 <= plan.weight <= 0.5


def test_peers_of_one_host_fill_groups_before_strangers():
    view = {f"a{k}": ("r1", "hostA") for k in range(4)} | {f"b{k}": ("r1", "hostB") for k in range(4)}
    view |= {f"c{k}": ("r2", "hostC") for k in range(2)} | {f"d{k}": ("r2", "hostD") for k in range(2)}
    for round_ in range(20):
        groups = form_groups("job", round_, view, 4)
        assert tuple(f"a{k}" for k in range(4)) in groups
        assert tuple(f"b{k}" for k in range(4)) in groups
        # Leftovers of one rack go together before any random mixing.
        assert ("c0", "c1", "d0", "d1") in groups


def test_remainder_is_split_at_random_per_round_and_evenly():
    view = {f"p{k:02d}": () for k in range(10)}
    seen = set()
    for round_ in range(10):
        groups = form_groups("job", round_, view, 4)
        assert sorted(len(g) for g in groups) == [3, 3, 4]
        seen.add(groups)
    assert len(seen) > 1


def test_one_group_is_a_plain_all_reduce():
    view = {p: () for p in "abc"}
    plan = plan_hierarchical("job", 0, view, "b", 4, 8)
    assert plan.group == ("a", "b", "c") and plan.weight == 0.0
    assert plan.sources == (None,) * 4
    assert plan.owners == ("a", "b", "c", "a")


def test_bad_input():
    with pytest.raises(ValueError):
        form_groups("job", 0, {"a": ()}, 0)
    with pytest.raises(ValueError):
        plan_hierarchical("job", 0, {"a": ()}, "zz", 4, 2)


# Views with several workers per daemon: (rack, host, daemon) paths.
daemon_views = st.dictionaries(
    st.text(alphabet="abcdefghijklmnop", min_size=1, max_size=4),
    st.tuples(st.sampled_from(["r1", "r2"]), st.sampled_from(["h1", "h2", "h3"]), st.sampled_from(["d1", "d2"])),
    min_size=1,
    max_size=24,
)


@given(daemon_views, sizes, st.integers(0, 1000))
@FAST
def test_peers_of_one_daemon_that_fit_a_group_share_one(view, size, round_):
    groups = form_groups("job", round_, view, size)
    assert sorted(p for g in groups for p in g) == sorted(view)
    assert all(1 <= len(g) <= size for g in groups)
    by_daemon: dict[tuple, list[str]] = {}
    for peer, path in view.items():
        by_daemon.setdefault(path, []).append(peer)
    for peers in by_daemon.values():
        if len(peers) <= size:
            assert any(set(peers) <= set(g) for g in groups), (peers, groups)


def test_two_daemons_with_two_workers_each_group_by_daemon():
    view = {"p0.0": ("", "127.0.0.1", "p0"), "p0.1": ("", "127.0.0.1", "p0"),
            "p1.0": ("", "127.0.0.1", "p1"), "p1.1": ("", "127.0.0.1", "p1")}
    for size in (2, 3):
        for round_ in range(20):
            assert form_groups("job", round_, view, size) == (("p0.0", "p0.1"), ("p1.0", "p1.1"))
