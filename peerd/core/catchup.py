"""Stepping up to a partner's round (docs/architecture.md, "The path of one
gossip round", step 10).

A partner that refused a round it no longer holds says which round it is in.
A worker behind it continues from the round before, so that its next round is
the partner's, and keeps its own model: being ahead in rounds says nothing
about being right. A peer cut off by a partition races ahead in rounds (nobody
to wait for) on a model that diverged; taking the state of whoever is ahead
after the heal spread that model to every peer and sent the job to chance
accuracy (found by peerd soak). Gossip merges the models from there on.
"""

from __future__ import annotations

from dataclasses import dataclass

STEP_UP_LOG_ROUNDS = 10  # a step up over more rounds than this is worth a line in the log


@dataclass(frozen=True)
class StepUp:
    round: int  # the round to continue from: the next one is the partner's
    logged: bool  # a step over more than STEP_UP_LOG_ROUNDS rounds


def step_up(own: int, ahead: int) -> StepUp | None:
    """`own`: this worker's round; `ahead`: the round a partner said it is in
    (below `own` when none did). None: no partner is ahead."""
    if ahead <= own:
        return None
    return StepUp(ahead - 1, ahead - own > STEP_UP_LOG_ROUNDS)
