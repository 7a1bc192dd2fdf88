"""An overlapped round's effect on the model, one round stale (docs/algorithms.md §1.10).

A round mixes the snapshot x_r the worker published at its start; meanwhile
the worker keeps training, so when the round completes the model is x_r + u
(u: the local updates since). The round's effect is applied as a correction,

    x ← x + (mix(x_r) − x_r),

which leaves x = mix(x_r) + u: the mixing of the snapshot, with the local
updates carried on top (docs/algorithms.md, "Overlapped rounds", derives what
this does to the mean and the consensus). No asyncio here: the runner that
drives the exchange is peerd.worker.round.overlap.
"""

from __future__ import annotations

import torch


def apply_correction(vector: torch.Tensor, snapshot: torch.Tensor, mixed: torch.Tensor) -> None:
    """vector += mixed − snapshot, in place. `mixed` is consumed: it holds the
    correction on return (saves a temporary as large as the model). `vector`
    may live on another device (a GPU): the correction is copied there once."""
    if not (vector.shape == snapshot.shape == mixed.shape):
        raise ValueError(f"shapes differ: {vector.shape}, {snapshot.shape}, {mixed.shape}")
    correction = mixed.sub_(snapshot)
    # A blocking copy: `mixed` is reused for the next round as soon as this returns.
    vector.add_(correction.to(vector.device) if vector.device != correction.device else correction)


class PendingRound:
    """One round in flight: the snapshot it mixes, and the buffer its mixed
    values are written into. `apply` adds the correction to the current model
    once the round has completed; it can be applied once."""

    def __init__(self, round_: int, snapshot: torch.Tensor, mixed: torch.Tensor) -> None:
        if snapshot.shape != mixed.shape or snapshot.device != mixed.device:
            raise ValueError("snapshot and mixed buffer must match in shape and device")
        self.round = round_
        self.snapshot = snapshot
        self.mixed = mixed
        self.applied = False

    def apply(self, vector: torch.Tensor) -> None:
        """Add mix(snapshot) − snapshot to `vector` (the model now, on any device)."""
        if self.applied:
            raise RuntimeError(f"round {self.round}'s correction was already applied")
        apply_correction(vector, self.snapshot, self.mixed)
        self.applied = True
