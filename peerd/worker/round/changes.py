"""[outer] on the int8 wire: the rounds average each member's model relative
to its anchor, θ − θ₀, not the model itself, so that a block's int8 scale fits
the change's small range, and the error feedback carries what the rounding of
the change left out to the next outer step. Averaging changes does not bring
the members' anchors together, so every MODELS_EVERY-th round averages the
models as on the other wires (docs/algorithms.md, "The outer step on the int8
wire", says why, and what each costs).

The model itself stays in the state throughout (a newcomer's capture during
the round copies the model, not the change): the change goes to a buffer of
its own, published as the round's snapshot. Without overlap the anchor then
steps by the averaged change (OuterStep.step_by_change); with it the snapshot
is the quantised change and the correction comes from OuterStep.on_mixed.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import torch

from peerd.worker.round.context import RoundBuffers, RoundInputs
from peerd.worker.round.dispatch import run_round
from peerd.worker.round.shared import RoundResult
from peerd.worker.wire.quant import NonFiniteValues

if TYPE_CHECKING:
    from peerd.worker.round.rounds import Rounds

log = logging.getLogger("peerd.worker")

# One round in this many averages the models (the anchors with them) rather
# than the changes: what keeps the anchors together (docs/algorithms.md, "The
# outer step on the int8 wire"). Not tuned.
MODELS_EVERY = 4


def models_round(round_: int) -> bool:
    """Whether round `round_` averages the models: the same answer on every
    member, which all publish the same kind of values for the same round."""
    return round_ % MODELS_EVERY == 0


class ChangeRounds:
    """The rounds of a worker with [outer] on the int8 wire."""

    def __init__(self, rounds: Rounds) -> None:
        self.rounds = rounds
        self._spare: torch.Tensor | None = None  # the buffer the next change goes to

    def _quantised_change(self) -> torch.Tensor:
        """θ − θ₀ (and the rest as it is) in a CPU buffer, rounded to the wire
        with error feedback: c ← Q(c + e), e ← c + e − Q(c + e)."""
        rounds = self.rounds
        spare = self._spare if self._spare is not None else torch.empty(rounds.state.gossiped)
        self._spare = None
        change = rounds.outer.change_of(rounds.state.flat.vector, spare)
        try:
            with rounds.keeping_frozen(lambda: change):
                rounds.feedback.quantise_(change)
        except NonFiniteValues:  # published as it is: partners asking are told it is unavailable
            log.warning("round %d: the model holds non-finite values: not sent on the int8 wire", rounds.round)
        return change

    async def run(self, view: dict[str, str], capture) -> RoundResult | None:
        """One round now over the changes, then the anchor's step by their
        average (by this member's own change with nobody to average with)."""
        rounds = self.rounds
        change = self._quantised_change()
        into = await rounds.store.hand_over(rounds.round, change)  # the store serves `change` itself
        await capture()
        now = time.monotonic()
        planned = rounds.round_plan(view, now)
        result = None
        if planned is not None:
            plan, addresses, deadline = planned
            buffers = RoundBuffers(change, rounds.recv, deadline, into)
            result = await run_round(rounds.context, RoundInputs(plan, addresses, buffers))
            await rounds.after_round(result, view, now)
        if result is None:
            into.copy_(change)
        with rounds.keeping_frozen():
            rounds.outer.step_by_change(into)
        self._spare = into
        return result

    def overlapped_snapshot(self) -> torch.Tensor:
        """[gossip] overlap: the quantised change to publish; the model becomes
        θ₀ + Q(c + e) on the parameters that step, so that the model plus its
        residual is what it was (docs/algorithms.md, "The int8 wire and error
        feedback"), and the correction later adds the anchor's move less
        this change."""
        rounds = self.rounds
        change = self._quantised_change()
        anchor, model = rounds.state.anchor, rounds.state.flat.vector
        live, _ = rounds.outer.spans()
        with torch.no_grad(), rounds.keeping_frozen():
            for a, b in live:
                model[a:b].copy_(anchor[a:b].add(change[a:b].to(anchor.device)))
            model[rounds.outer.numel :].copy_(change[rounds.outer.numel :])
        self._spare = change  # the runner copies it into its snapshot: free again after `start`
        return change
