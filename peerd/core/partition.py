"""Data partition among the current members (docs/algorithms.md §1.5).

Each epoch the sample indices are permuted by a seed of (job, epoch), and the
permutation is cut into `chunks` fixed pieces. Each chunk is split among the
members a worker sees when it starts that chunk, so a membership (or DBS plan)
change takes effect at the next chunk boundary, and what a leaver had not yet
been given is read by the others. Chunk boundaries are positions in the shared
permutation: peers agree on them without talking.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from peerd.core.rng import SeededStream, derive_seed
from peerd.core.shares import apportion


def epoch_permutation(n_samples: int, job: str, epoch: int) -> list[int]:
    order = list(range(n_samples))
    SeededStream(derive_seed(job, "epoch", epoch)).shuffle(order)
    return order


def chunk_bounds(n_samples: int, chunks: int) -> list[int]:
    """Start positions of the chunks in the epoch's permutation, and n_samples at
    the end: chunk c is [bounds[c], bounds[c + 1]). Chunks differ by at most one
    sample; some are empty when there are fewer samples than chunks."""
    if chunks < 1 or n_samples < 0:
        raise ValueError(f"need chunks ≥ 1 and n_samples ≥ 0, got {chunks}, {n_samples}")
    return [n_samples * c // chunks for c in range(chunks + 1)]


def part_bounds(start: int, stop: int, members: Sequence[str], me: str,
                shares: Mapping[str, float] | None = None) -> tuple[int, int]:
    """The positions [a, b) of `me`'s part of the chunk [start, stop).

    The members' parts partition the chunk: equal parts, or parts in proportion
    to `shares` (DBS), rounded by largest remainder. The member order is the
    sorted ids rotated by `start`, so that rounding leftovers (and the samples of
    chunks smaller than the member count) go round the members instead of
    always to the same ones."""
    ordered = sorted(set(members))
    if me not in ordered:
        raise ValueError(f"{me!r} is not among the members")
    turn = start % len(ordered)
    ordered = ordered[turn:] + ordered[:turn]
    k, m, n = ordered.index(me), len(ordered), stop - start
    if shares is None:
        return start + n * k // m, start + n * (k + 1) // m
    missing = [p for p in ordered if p not in shares]
    if missing:
        raise ValueError(f"no share for {', '.join(sorted(missing))}")
    sizes = apportion(n, [shares[p] for p in ordered])
    a = start + sum(sizes[:k])
    return a, a + sizes[k]


def chunk_at(bounds: Sequence[int], fraction: float) -> int:
    """The first chunk that starts at or after `fraction` of the epoch: where a
    worker that adopts a state at that point begins (len(bounds) − 1: the epoch
    is over). Positions of a worker that is inside a chunk lie at least one
    sample past its start, so half a sample absorbs float rounding."""
    target = fraction * bounds[-1] - 0.5
    return next((c for c, b in enumerate(bounds[:-1]) if b >= target), len(bounds) - 1)


def my_shard(n_samples: int, job: str, epoch: int, members: Sequence[str], me: str,
             shares: Mapping[str, float] | None = None) -> list[int]:
    """The sample indices `me` reads in `epoch` when one view holds for the whole
    epoch (one chunk, starting at 0: not rotated): the shards of all members partition
    range(n_samples) in sorted-id order. peerd.sim cuts its data this way."""
    start, stop = part_bounds(0, n_samples, members, me, shares)
    return epoch_permutation(n_samples, job, epoch)[start:stop]
