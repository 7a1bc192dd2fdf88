"""Whose data counts how much when each peer trains on its own (docs/algorithms.md §1.5, local mode).

In `data_mode = "local"` peer i holds n_i samples and minimises its own mean
loss f_i. Gossip averages the models with a doubly stochastic mixing matrix, so
the mean model moves by the mean of the peers' updates:

    x̄ ← x̄ − (1/m) Σ_i η_i g_i,      E[g_i] = ∇f_i  (whatever i's batch b_i is)

The objective over the union of the data is F = Σ_i (n_i / N) f_i (N = Σ n_i):
every sample counts once. Taking η_i = η · n_i / n̄ (n̄ = N / m) gives
(1/m) Σ η n_i/n̄ ∇f_i = η Σ (n_i/N) ∇f_i = η ∇F. The batch b_i that DBS gives a
peer only sets how noisy g_i is, not its mean, so it must not enter the weight
(scaling by b_i, as the shared mode does, would weight peers by speed). With
`uniform` every η_i = η and the mean model follows the mean of the peers'
objectives, (1/m) Σ f_i. Derivation and its limits: docs/algorithms.md.

Pure: no torch, no clock; the same sizes and peers give the same weights on
every peer.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

WEIGHTINGS = ("samples", "uniform")


@dataclass(frozen=True)
class Weights:
    """Each peer's LR multiplier (mean 1 over the peers) and the size of the union."""

    lr: dict[str, float]
    union: float  # Σ n_i over the peers (an unknown n_i counted as the mean of the known)

    def of(self, peer: str) -> float:
        return self.lr[peer]


def known_sizes(sizes: Mapping[str, int], peers: Iterable[str]) -> dict[str, float]:
    """Each peer's data set size; a peer that has not published one (missing or
    0) counts as the mean of those that have, or 1 when none has."""
    ids = sorted(set(peers))
    known = {p: float(sizes[p]) for p in ids if sizes.get(p, 0) > 0}
    default = math.fsum(known.values()) / len(known) if known else 1.0
    return {p: known.get(p, default) for p in ids}


def weigh(sizes: Mapping[str, int], peers: Iterable[str], weighting: str) -> Weights:
    """The LR multipliers that make gossip's mean model follow the job's objective:
    "samples": w_i = n_i / mean(n) (the mean loss over the union of the data);
    "uniform": w_i = 1 (the mean of the peers' own mean losses)."""
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
    n = known_sizes(sizes, peers)
    if not n:
        raise ValueError("no peers to weigh")
    union = math.fsum(n.values())
    if weighting == "uniform":
        return Weights({p: 1.0 for p in n}, union)
    mean = union / len(n)
    return Weights({p: v / mean for p, v in n.items()}, union)


def union_epochs(global_samples: float, union: float) -> float:
    """Epochs of the union that `global_samples` (Σ over peers of samples trained on) make."""
    if union <= 0:
        raise ValueError(f"the union must hold samples, got {union}")
    return global_samples / union
