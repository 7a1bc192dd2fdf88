"""What every kind of round shares (flat: peerd.worker.round.crossover and
pair; hierarchical: hierarchy and peerd.worker.intrahost.round): its result,
how a failed fetch counts in it, and the steps on one segment (the clip of a
pull, the gap to a partner's values, the pairwise average, a missed segment
keeping its own values).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from peerd.core.robust import PullClipper
from peerd.core.segments import Span
from peerd.errors import NonFiniteAverage, PeerdError, PeerUnavailable, RoundMismatch
from peerd.worker.wire.codec import finite_by_sum
from peerd.worker.round.reduce import BLOCK


@dataclass
class RoundResult:
    round: int
    planned: frozenset[str]
    reached: set[str] = field(default_factory=set)
    misses: int = 0
    disagreement: float = float("nan")
    seconds: float = 0.0
    ahead_round: int = -1  # highest round a partner said it was in, if ahead of us
    ahead_peer: str = ""  # the partner that said so
    errors: dict[str, str] = field(default_factory=dict)
    unreachable: set[str] = field(default_factory=set)  # no answer in time: counts toward suspicion
    clipped: int = 0  # segments whose pull was clipped (peerd.core.robust)
    non_finite: dict[str, str] = field(default_factory=dict)  # source -> why the round refused its values


DISAGREEMENT_SAMPLE = 64  # the metric reads 1/64 of every segment: the full norm cost as much as averaging


def record_failure(result: RoundResult, source: str, round_: int, exc: BaseException) -> None:
    """Count a fetch that failed; re-raise what is a bug rather than a partner's fault."""
    if not isinstance(exc, (PeerdError, TimeoutError)):
        raise exc
    result.misses += 1
    if isinstance(exc, RoundMismatch) and exc.current_round > max(round_, result.ahead_round):
        result.ahead_round, result.ahead_peer = exc.current_round, source
    if isinstance(exc, NonFiniteAverage):  # the transport counts its own refusals; these are the round's
        result.non_finite[source] = str(exc)
    if isinstance(exc, (PeerUnavailable, TimeoutError)):
        result.unreachable.add(source)
    result.errors[source] = str(exc) or type(exc).__name__


def clip_pull(own: torch.Tensor, theirs: torch.Tensor, clipper: PullClipper | None) -> float:
    """Scale `theirs` towards `own` in place if its pull is too large; returns the scale."""
    if clipper is None or not clipper.enabled:
        return 1.0
    pull = float(torch.linalg.vector_norm(theirs - own)) / math.sqrt(max(1, own.numel()))
    scale = clipper.scale(pull) if math.isfinite(pull) else 0.0
    if scale < 1.0:
        theirs.sub_(own).mul_(scale).add_(own)
    return scale


def keep_own(out: torch.Tensor, vector: torch.Tensor, layout: list[Span], written: set[int]) -> None:
    """A round that writes into `out`: every segment it did not write (missed,
    or cut half-way by its deadline) keeps this peer's own value."""
    for s in set(range(len(layout))) - written:
        out[layout[s].start : layout[s].stop].copy_(vector[layout[s].start : layout[s].stop])


def segment_gap(own: torch.Tensor, theirs: torch.Tensor) -> float:
    """A segment's gap to a partner's in a round, ||own − theirs|| / ||own||,
    estimated on a contiguous sample of the segment (the round's `disagreement`)."""
    n = max(1, own.numel() // DISAGREEMENT_SAMPLE)
    a, b = own[:n], theirs[:n]
    return float(torch.dist(a, b)) / (float(torch.linalg.vector_norm(a)) + 1e-12)


def average_pair(own: torch.Tensor, theirs: torch.Tensor, into: torch.Tensor, own_first: bool) -> bool:
    """into ← ½(own + theirs) in one pass over the values, checked afterwards: a
    non-finite value in `theirs` makes the average non-finite, and then `into`
    gets `own` back and this returns False. `into` may be `own` itself (then
    `theirs` is checked first, as `own` cannot be restored).

    lerp(a, b, ½) reads both and writes once, where add-then-halve writes twice;
    it is not symmetric in a and b, so the operands go in an order both peers of
    a pair agree on (`own_first`: this peer's id sorts first), and the two end
    with bit-identical values, as (a + b)·½ gave them."""
    a, b = (own, theirs) if own_first else (theirs, own)
    if into.data_ptr() == own.data_ptr():
        if not finite_by_sum(theirs):
            return False
        torch.lerp(a, b, 0.5, out=into)
        return True
    # Block by block, each checked while it is still in the cache (32 MiB: 9.5
    # ms against 10.9 for one pass of each); lerp's bits do not depend on it.
    finite = True
    for start in range(0, into.numel(), BLOCK):
        block = into[start : start + BLOCK]
        torch.lerp(a[start : start + BLOCK], b[start : start + BLOCK], 0.5, out=block)
        finite = finite_by_sum(block) and finite
    if finite:
        return True
    into.copy_(own)
    return False
