"""A worker's life in its job: its stages, and the one way it ends.

    JOINING     serve, hear from the daemon, the start gate, take the state
    TRAINING    rounds: each after the local steps of a round
    LEFT        drained or signalled: at the end of its round, announced and checkpointed
    CONCLUDING  every epoch trained: the round in flight applied, the final consensus
    FINISHED    the model file written, the last report sent, the final model served
    CLOSED      serving nothing

A stage is entered once, in this order; a worker may skip stages but never goes
back, and one that left only closes. Whatever the outcome, a worker ends the
one way its engine's `end` takes: FINISHED goes through CONCLUDING and
FINISHED, LEFT has been entered at its round already, and every path ends CLOSED.
"""

from __future__ import annotations

import enum


class Stage(enum.Enum):
    JOINING = "joining"
    TRAINING = "training"
    LEFT = "left"
    CONCLUDING = "concluding"
    FINISHED = "finished"
    CLOSED = "closed"

    def may_enter(self, stage: Stage) -> bool:
        """Forward only, and each stage once."""
        order = list(Stage)
        return order.index(stage) > order.index(self) and not (self == Stage.LEFT and stage != Stage.CLOSED)


class Outcome(enum.StrEnum):
    """How a worker's part in its job ended (the worker's exit code follows from it)."""

    FINISHED = "finished"  # every epoch trained here: the final consensus and model.pt
    LEFT = "left"  # the operator asked (peerctl leave --drain)
    STOPPED = "stopped"  # a signal, or a failure


def outcome_of(trained_out: bool, left: bool, asked_to_leave: bool) -> Outcome:
    """`trained_out`: the job's epochs are done here; `left`: the worker left at
    a round (drained or signalled); `asked_to_leave`: the operator asked."""
    if trained_out and not left:
        return Outcome.FINISHED
    return Outcome.LEFT if asked_to_leave else Outcome.STOPPED
