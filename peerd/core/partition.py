"""Data partition among the current members (DESIGN §1.5).

Each epoch the sample indices are permuted by a seed of (job, epoch) and cut
among the members in sorted-id order, so all peers agree on who reads what
without talking.
"""

from __future__ import annotations

from collections.abc import Sequence

from peerd.core.rng import SeededStream, derive_seed


def epoch_permutation(n_samples: int, job: str, epoch: int) -> list[int]:
    order = list(range(n_samples))
    SeededStream(derive_seed(job, "epoch", epoch)).shuffle(order)
    return order


def my_shard(n_samples: int, job: str, epoch: int, members: Sequence[str], me: str) -> list[int]:
    """The sample indices `me` reads in `epoch`; the shards of all members
    partition range(n_samples)."""
    ordered = sorted(set(members))
    if me not in ordered:
        raise ValueError(f"{me!r} is not among the members")
    k, m = ordered.index(me), len(ordered)
    # Boundaries as in split_even, but a shard may be empty when members outnumber samples.
    start, stop = n_samples * k // m, n_samples * (k + 1) // m
    return epoch_permutation(n_samples, job, epoch)[start:stop]
