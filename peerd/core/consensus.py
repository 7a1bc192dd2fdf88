"""One model at the end: the decisions of the final exact average.

When a peer's job is done, it publishes its final model and pulls the final
models of the peers still in its view; the consensus is the exact mean over
the peers whose whole model arrived, itself included. This module decides who
is in that set, in which order the sum runs and with which weights, and how
long the exchange may take. The averaging itself is in peerd.worker.state.consensus.

Why uniform weights whatever the job's `weighting`: peerd carries a peer's
weight (its data set size in local mode, its DBS batch in shared mode) in its
learning rate, and gossip mixes with a doubly stochastic matrix, so the model
that follows the job's objective is the plain mean x̄ = (1/m) Σ x_i
(peerd.core.weighting). Weighting the final average again would count a
peer's weight twice. `plan_consensus` still takes weights, for a caller that
averages models trained without that LR scaling.

Pure: no torch, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class ConsensusPlan:
    """The agreed set, sorted: the order every peer sums in, so that peers that
    averaged over the same set hold bit-identical models."""

    members: tuple[str, ...]
    weights: tuple[float, ...]  # one per member, in the same order

    @property
    def size(self) -> int:
        return len(self.members)

    @property
    def uniform(self) -> bool:
        return len(set(self.weights)) <= 1

    @property
    def alone(self) -> bool:
        """Nobody else's model arrived: the peer keeps its own."""
        return len(self.members) == 1


def plan_consensus(me: str, reached: Iterable[str], weights: Mapping[str, float] | None = None) -> ConsensusPlan:
    """The set this peer averages over: itself and every peer whose whole final
    model it received, in sorted order; weights normalised to sum to 1 (equal
    when `weights` is None)."""
    members = tuple(sorted({me, *reached}))
    if weights is None:
        return ConsensusPlan(members, tuple(1.0 / len(members) for _ in members))
    raw = [float(weights.get(p, 0.0)) for p in members]
    if any(not math.isfinite(w) or w < 0 for w in raw) or math.fsum(raw) <= 0:
        raise ValueError(f"consensus weights must be finite, non-negative and not all 0: {dict(zip(members, raw))}")
    total = math.fsum(raw)
    return ConsensusPlan(members, tuple(w / total for w in raw))


def consensus_timeout(wait_s: float, transfer_s: float, others: int) -> float:
    """How long the final exchange may take: `wait_s` for the last peer to reach
    the end (the job's deadline ceiling, the longest a round waits for a
    partner), plus one model transfer (`transfer_s`, the round deadline) per
    other peer, as every model comes over this peer's one link."""
    if others <= 0:
        return 0.0
    return max(wait_s, 0.0) + max(transfer_s, 0.0) * others


# The longest a peer at the end waits for a member that its daemon still lists
# in the job but whose final model has not come (still training: a newcomer
# that started from a stale state, a slower machine). Leaving such a member out
# would end the job with a different model on each peer.
END_PATIENCE_S = 300.0


def end_patience_s(timeout: float) -> float:
    """How long the final exchange may wait in all for members still in the job."""
    return max(timeout, END_PATIENCE_S)


def describe(plan: ConsensusPlan, left_out: Iterable[str]) -> str:
    """A log line's account of the set: who was averaged and who was not."""
    out = sorted(left_out)
    text = f"{plan.size} peer(s): {', '.join(plan.members)}"
    return text + (f"; left out: {', '.join(out)}" if out else "")
