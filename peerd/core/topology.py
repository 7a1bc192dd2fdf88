"""Load-balanced random topology (Crossover-SGD, Algorithm 2; docs/algorithms.md §1.2).

For round r and segment s every peer draws the same uniformly random
derangement σ of the sorted participants, from a seed shared by the job. Peer i
takes segment s from σ(i) and is asked for it by σ⁻¹(i): every peer sends and
receives exactly one copy of every segment per round, so ½(I + P) is doubly
stochastic, and different segments go to different partners.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from peerd.core.rng import SeededStream, derive_seed


def derangement(n: int, seed: bytes) -> list[int]:
    """A uniformly random permutation of range(n) with no fixed point.

    Rejection sampling: a uniform shuffle is a derangement with probability
    ~1/e, so this takes e ≈ 2.7 shuffles on average.
    """
    if n < 2:
        raise ValueError(f"a derangement needs at least 2 elements, got {n}")
    stream = SeededStream(seed)
    while True:
        perm = list(range(n))
        stream.shuffle(perm)
        if all(perm[i] != i for i in range(n)):
            return perm


@dataclass(frozen=True)
class RoundPlan:
    """Who this peer fetches each segment from in one round."""

    round: int
    sources: tuple[str, ...]  # sources[s] is the peer to fetch segment s from
    me: str = field(default="", compare=False)  # the peer the plan is for ("": unknown)

    @property
    def partners(self) -> frozenset[str]:
        return frozenset(self.sources)


def plan_round(
    job: str, round_: int, peers: Sequence[str], me: str, segments: int
) -> RoundPlan | None:
    """The sources of every segment for `me`, or None when it has no partner.

    `peers` is the membership view (any order; it is sorted here so that every
    peer with the same view draws the same σ).
    """
    ordered = sorted(set(peers))
    if me not in ordered:
        raise ValueError(f"{me!r} is not in its own view")
    if len(ordered) < 2:
        return None
    i = ordered.index(me)
    sources = tuple(
        ordered[derangement(len(ordered), derive_seed(job, round_, s))[i]]
        for s in range(segments)
    )
    return RoundPlan(round_, sources, me)
