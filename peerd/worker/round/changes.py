"""[outer] on the int8 wire: the rounds average each member's model relative
to its anchor, θ − θ₀, not the model itself, so that a block's int8 scale fits
the change's small range, and the error feedback carries what the rounding of
the change left out to the next outer step. Averaging changes does not bring
the members' anchors together, so every ANCHORS_EVERY-th round averages the
anchors instead, without an outer step (docs/algorithms.md, "The outer step
on the int8 wire", says why, and what each costs).

The model itself stays in the state throughout (a newcomer's capture during
the round copies the model, not the change): what is published goes to a
buffer of its own. Without overlap the anchor then steps by the averaged
change (OuterStep.step_by_change) or takes the averaged anchor
(OuterStep.adopt_anchor); with overlap the correction comes from
OuterStep.on_mixed.
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

# One round in this many averages the anchors rather than the changes: what
# keeps the anchors together (docs/algorithms.md, "The outer step on the int8
# wire"). Not tuned.
ANCHORS_EVERY = 4


def anchor_rounds_note(wire: str) -> str:
    """What the worker's log adds to its outer-step line on the int8 wire: the
    rounds that take no outer step."""
    if wire != "int8":
        return ""
    return f"; on the int8 wire every {ANCHORS_EVERY}th round averages the anchors instead, with no outer step"


def anchors_round(round_: int) -> bool:
    """Whether round `round_` averages the anchors: the same answer on every
    member, which all publish the same kind of values for the same round."""
    return round_ % ANCHORS_EVERY == 0


class ChangeRounds:
    """The rounds of a worker with [outer] on the int8 wire."""

    def __init__(self, rounds: Rounds) -> None:
        self.rounds = rounds
        self._spare: torch.Tensor | None = None  # the buffer the next values go to

    def published(self, anchors: bool) -> torch.Tensor:
        """What this member publishes, in a CPU buffer: on the parameters θ − θ₀
        (a change round) or θ₀ (an anchor round), the rest as it is; rounded to
        the wire with error feedback, v ← Q(v + e), e ← v + e − Q(v + e). An
        anchor round's anchor becomes its rounded value and the model moves
        with it; a change round's model becomes θ₀ + Q(c + e): either way
        θ + e stays as it was. The model itself stays in the state,
        so a capture for a newcomer copies the model, not these values."""
        rounds, outer = self.rounds, self.rounds.outer
        spare = self._spare if self._spare is not None else torch.empty(rounds.state.gossiped)
        values = outer.anchor_of(rounds.state.flat.vector, spare) if anchors else \
            outer.change_of(rounds.state.flat.vector, spare)
        try:
            with rounds.keeping_frozen(lambda: values):
                rounds.feedback.quantise_(values)
        except NonFiniteValues:  # published as it is: partners asking are told it is unavailable
            log.warning("round %d: the model holds non-finite values: not sent on the int8 wire", rounds.round)
        with torch.no_grad(), rounds.keeping_frozen():
            if anchors:
                outer.adopt_anchor(values, rounds.state.anchor)
            else:  # the model becomes θ₀ + Q(c + e)
                anchor, model, n = rounds.state.anchor, rounds.state.flat.vector, outer.numel
                for a, b in outer.spans()[0]:
                    model[a:b].copy_(anchor[a:b].add(values[a:b].to(anchor.device)))
                model[n:].copy_(values[n:])
        self._spare = values  # free again once published (the overlapped runner copies it)
        return values

    async def run(self, view: dict[str, str], capture) -> RoundResult | None:
        """One round now: over the changes, then the anchor's step by their
        average (by this member's own change with nobody to average with); or
        over the anchors, which then take the average, the models with them."""
        rounds = self.rounds
        anchors = anchors_round(rounds.round)
        values = self.published(anchors)
        self._spare = None
        into = await rounds.store.hand_over(rounds.round, values)  # the store serves `values` itself
        await capture()
        now = time.monotonic()
        planned = rounds.round_plan(view, now)
        result = None
        if planned is not None:
            plan, addresses, deadline = planned
            buffers = RoundBuffers(values, rounds.recv, deadline, into)
            result = await run_round(rounds.context, RoundInputs(plan, addresses, buffers))
            await rounds.after_round(result, view, now)
        if result is None:
            into.copy_(values)
        with rounds.keeping_frozen():
            if anchors:
                rounds.outer.adopt_anchor(into, values)
            else:
                rounds.outer.step_by_change(into)
        rounds.outer.follow_frozen()
        self._spare = into
        return result
