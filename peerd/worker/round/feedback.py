"""Error feedback for the int8 wire (docs/algorithms.md, "Error feedback").

Before a round publishes the model x, the peer quantises x + e (e: what it
still owes the others), takes the quantised value q as its model for the round
and keeps e ← x + e − q. The round itself then works on values every reader
receives exactly, so it keeps the sum of the models as on fp32, and
Σ (x + e) over the peers is kept: what one round's quantisation leaves out is
sent in the next. An owner that rounds a value its group adopts (a
hierarchical round's stages 1 and 2) owes the difference for every member
that adopts it (`owe`).
"""

from __future__ import annotations

import torch

from peerd.core.segments import Span
from peerd.worker.wire.quant import round_trip_


class ErrorFeedback:
    """One peer's residual, in the model's dtype and device; zero until the
    first round (a joiner starts from zero)."""

    def __init__(self, layout: list[Span]) -> None:
        self.layout = layout
        self.residual: torch.Tensor | None = None

    def quantise_(self, vector: torch.Tensor) -> None:
        """x ← Q(x + e), e ← x + e − Q(x + e), segment by segment (a reader's
        blocks start at each segment's start). NonFiniteValues (nothing changed
        then) if x + e holds a NaN or an infinity."""
        if self.residual is None:
            self.residual = torch.zeros_like(vector)
        self.residual = self.residual.to(vector.device)  # owe() may have begun it on the CPU
        owed = self.residual.add(vector)
        for span in self.layout:
            round_trip_(owed[span.start : span.stop])
        self.residual.add_(vector).sub_(owed)  # before the copy: x + e − q
        vector.copy_(owed)

    def round_(self, values: torch.Tensor, span: Span, members: int) -> None:
        """Round `values` (the segment at `span`, a value `members` peers adopt)
        to the wire in place, and owe what the rounding left out."""
        before = values.clone()
        round_trip_(values)
        self.owe(span, before.sub_(values).mul_(members))

    def owe(self, span: Span, amount: torch.Tensor) -> None:
        if self.residual is None:
            self.residual = torch.zeros(self.layout[-1].stop if self.layout else 0, dtype=amount.dtype,
                                        device=amount.device)
        self.residual[span.start : span.stop].add_(amount.to(self.residual.device))

    def settle_(self, vector: torch.Tensor) -> None:
        """Give the residual back to the model (x ← x + e, e ← 0): before the
        exact average at the job's end, which averages the models alone."""
        if self.residual is not None:
            vector.add_(self.residual.to(vector.device))
            self.residual.zero_()

    def norm(self) -> float:
        return 0.0 if self.residual is None else float(self.residual.norm())
