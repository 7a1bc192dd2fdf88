"""Hierarchical crossover: locality groups, segment owners, gossip across groups
(docs/algorithms.md §1.3; Crossover-SGD's hierarchical variant).

Each round the members are cut into groups of at most `size`, innermost
locality first (peers of one host, then of one rack label), the remainder at
random with a seed shared by the job and the round. Inside a group segment s is
owned by member s mod |G|: the owner averages s over the group
(reduce-scatter), mixes it with the owner of s in the partner group that a
derangement over groups assigns for (round, s), and the members take the
result from the owner (all-gather).

With groups of unequal size a plain ½ mix would not keep the average: group G
mixes with weight w_G = ½·min|H|/|G|, which makes every segment's mixing matrix
doubly stochastic (the column of a peer in H sums to (1 − w_H) + |F|·w_F/|H| =
1 for the group F that mixes with H, because |F|·w_F = |H|·w_H).

Every stage reads only earlier stages of other peers (snapshots, then in-group
averages, then mixed values), so no two peers can wait on each other, whatever
their views.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from peerd.core.rng import SeededStream, derive_seed
from peerd.core.segments import split_even
from peerd.core.topology import derangement

Locality = tuple[str, ...]  # outermost first, e.g. (rack, host); equal paths share a host


def form_groups(job: str, round_: int, localities: Mapping[str, Locality], size: int) -> tuple[tuple[str, ...], ...]:
    """Every peer in exactly one group of at most `size` members.

    Innermost pools first: a pool (the peers under one locality path) gives
    away full groups and hands its leftovers to its parent path as one block;
    blocks are never split, so peers of one path (the workers of one daemon,
    of one host) that fit in a group stay in one group. The root pool is cut
    into groups of near-equal size.
    """
    if size < 1:
        raise ValueError(f"group size must be ≥ 1, got {size}")
    pools: dict[Locality, list[tuple[str, ...]]] = {}
    for peer in sorted(localities):
        pools.setdefault(tuple(localities[peer]), []).append((peer,))
    groups: list[tuple[str, ...]] = []
    while any(pools):
        depth = max(len(path) for path in pools)
        if depth == 0:
            break
        for path in sorted(p for p in pools if len(p) == depth):
            blocks = pools.pop(path)
            SeededStream(derive_seed(job, round_, "pool", list(path))).shuffle(blocks)
            bins = _first_fit(blocks, size)
            groups += [tuple(sorted(b)) for b in bins if len(b) == size]
            pools.setdefault(path[:-1], []).extend(tuple(b) for b in bins if len(b) < size)
    rest = pools.get((), [])
    if rest:
        SeededStream(derive_seed(job, round_, "rest")).shuffle(rest)
        groups += _even_split(rest, size)
    return tuple(sorted(groups))


def _first_fit(blocks: list[tuple[str, ...]], size: int) -> list[list[str]]:
    """Blocks, largest first, each into the first bin it fits (single peers
    in their given order fill bins one after another)."""
    bins: list[list[str]] = []
    for block in sorted(blocks, key=len, reverse=True):  # stable: the shuffled order breaks ties
        target = next((b for b in bins if len(b) + len(block) <= size), None)
        if target is None:
            bins.append(list(block))
        else:
            target.extend(block)
    return bins


def _even_split(blocks: list[tuple[str, ...]], size: int) -> list[tuple[str, ...]]:
    """The root pool in ⌈n/size⌉ groups of near-equal size when its blocks allow;
    a block that fits no group's even share goes where it fits, or alone."""
    peers = [p for block in blocks for p in block]
    count = -(-len(peers) // size)
    spans = split_even(len(peers), count)
    if all(len(block) == 1 for block in blocks):
        return [tuple(sorted(peers[span.start : span.stop])) for span in spans]
    bins: list[list[str]] = [[] for _ in spans]
    room = [span.stop - span.start for span in spans]
    for block in sorted(blocks, key=len, reverse=True):
        k = max(range(len(bins)), key=lambda i: (room[i], -i))
        if room[k] < len(block):
            k = next((i for i, b in enumerate(bins) if len(b) + len(block) <= size), len(bins))
            if k == len(bins):
                bins.append([])
                room.append(size)
        bins[k].extend(block)
        room[k] -= len(block)
    return [tuple(sorted(b)) for b in bins if b]


@dataclass(frozen=True)
class GroupPlan:
    """One peer's part in a hierarchical round."""

    round: int
    groups: tuple[tuple[str, ...], ...]
    group: tuple[str, ...]  # this peer's group, sorted
    owners: tuple[str, ...]  # owners[s]: the member of this group that owns segment s
    sources: tuple[str | None, ...]  # sources[s]: owner of s in the partner group; None with one group
    weight: float  # w of this group: x ← (1 − w)·x_group + w·x_partner

    def owned_by(self, peer: str) -> list[int]:
        return [s for s, owner in enumerate(self.owners) if owner == peer]


def partner_groups(job: str, round_: int, groups: int, segment: int) -> list[int]:
    """partner[g]: the group whose owner of `segment` group g's owner fetches from."""
    return derangement(groups, derive_seed(job, round_, "cross", segment))


def plan_hierarchical(
    job: str, round_: int, localities: Mapping[str, Locality], me: str, segments: int, size: int
) -> GroupPlan:
    if me not in localities:
        raise ValueError(f"{me!r} is not in its own view")
    if segments < 1:
        raise ValueError(f"need at least one segment, got {segments}")
    groups = form_groups(job, round_, localities, size)
    mine = next(k for k, g in enumerate(groups) if me in g)
    group = groups[mine]
    owners = tuple(group[s % len(group)] for s in range(segments))
    if len(groups) == 1:
        return GroupPlan(round_, groups, group, owners, (None,) * segments, 0.0)
    sources = []
    for s in range(segments):
        partner = groups[partner_groups(job, round_, len(groups), s)[mine]]
        sources.append(partner[s % len(partner)])
    weight = 0.5 * min(len(g) for g in groups) / len(group)
    return GroupPlan(round_, groups, group, owners, tuple(sources), weight)
