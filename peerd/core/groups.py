"""Hierarchical crossover: locality groups, segment owners, gossip across groups
(DESIGN §1.3; Crossover-SGD's hierarchical variant).

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
    away full groups and hands its leftovers to its parent path; the root pool
    is shuffled and cut into groups of near-equal size.
    """
    if size < 1:
        raise ValueError(f"group size must be ≥ 1, got {size}")
    pools: dict[Locality, list[str]] = {}
    for peer in sorted(localities):
        pools.setdefault(tuple(localities[peer]), []).append(peer)
    groups: list[tuple[str, ...]] = []
    while any(pools):
        depth = max(len(path) for path in pools)
        if depth == 0:
            break
        for path in sorted(p for p in pools if len(p) == depth):
            members = pools.pop(path)
            SeededStream(derive_seed(job, round_, "pool", list(path))).shuffle(members)
            full = len(members) - len(members) % size
            groups += [tuple(sorted(members[k : k + size])) for k in range(0, full, size)]
            # Leftovers join the parent pool as a block, so peers of one host stay together.
            pools.setdefault(path[:-1], []).extend(members[full:])
    rest = pools.get((), [])
    if rest:
        SeededStream(derive_seed(job, round_, "rest")).shuffle(rest)
        count = -(-len(rest) // size)
        groups += [tuple(sorted(rest[span.start : span.stop])) for span in split_even(len(rest), count)]
    return tuple(sorted(groups))


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
