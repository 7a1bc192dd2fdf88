"""Data partition among the current members (DESIGN §1.5).

Each epoch the sample indices are permuted by a seed of (job, epoch) and cut
among the members in sorted-id order, so all peers agree on who reads what
without talking.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from peerd.core.rng import SeededStream, derive_seed
from peerd.core.shares import apportion


def epoch_permutation(n_samples: int, job: str, epoch: int) -> list[int]:
    order = list(range(n_samples))
    SeededStream(derive_seed(job, "epoch", epoch)).shuffle(order)
    return order


def my_shard(n_samples: int, job: str, epoch: int, members: Sequence[str], me: str,
             shares: Mapping[str, float] | None = None) -> list[int]:
    """The sample indices `me` reads in `epoch`; the shards of all members
    partition range(n_samples). Equal shards, or shard sizes in proportion to
    `shares` (DBS: one weight per member), rounded by largest remainder."""
    ordered = sorted(set(members))
    if me not in ordered:
        raise ValueError(f"{me!r} is not among the members")
    k, m = ordered.index(me), len(ordered)
    if shares is None:
        # Boundaries as in split_even, but a shard may be empty when members outnumber samples.
        start, stop = n_samples * k // m, n_samples * (k + 1) // m
    else:
        missing = [p for p in ordered if p not in shares]
        if missing:
            raise ValueError(f"no share for {', '.join(missing)}")
        sizes = apportion(n_samples, [shares[p] for p in ordered])
        start = sum(sizes[:k])
        stop = start + sizes[k]
    return epoch_permutation(n_samples, job, epoch)[start:stop]
