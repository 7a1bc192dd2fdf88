"""A worker's life in its job: one transition table (stage × event → next
stage, and whose model the worker ends with).

    JOINING     serve, hear from the daemon, the start gate, take the state
    TRAINING    rounds: each after the local steps of a round
    LEFT        drained, signalled or without its daemon: at the end of its round, announced and checkpointed
    CONCLUDING  every epoch trained: the round in flight applied, the final consensus
    TAKING      the job ended on its members while this worker was away: it trains
                nothing and takes the model they saved (docs/operations.md,
                "When a member comes back after the end")
    FINISHED    the model file written (or none, said why), the last report sent
    CLOSED      serving nothing

Stages only move forward and each is entered once; every event has an outcome
in every stage (`step`): a move, or "no move" for an event that does not apply
there (a stop that comes during the end, say). A worker ends FINISHED with a
model only through its job's agreed end (its consensus, `AGREED`), or with the
job's model taken from a member that finished (`TAKEN`); a lone model that is
not the job's is never one (tests/core/test_core_lifecycle.py walks every path).
The engine (peerd.worker.engine) is the only one that moves its worker through
this table; what a status shows (`phase`) is derived for display only.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Stage(enum.Enum):
    JOINING = "joining"
    TRAINING = "training"
    LEFT = "left"
    CONCLUDING = "concluding"
    TAKING = "taking"
    FINISHED = "finished"
    CLOSED = "closed"

    def may_enter(self, stage: Stage) -> bool:
        """Forward only, each stage once, and as the table allows."""
        return any(t.to == stage for (s, _), t in TABLE.items() if s == self)

    @property
    def shown(self) -> str:
        """What a status shows in this stage (`phase`) while the worker waits for nothing within it."""
        return _SHOWN.get(self, self.value)


_SHOWN = {Stage.LEFT: "draining", Stage.CONCLUDING: "consensus", Stage.TAKING: "taking the job's model"}


class Event(enum.Enum):
    BEGIN = "begin"  # the state to train from is held: train
    ENDED_ELSEWHERE = "ended elsewhere"  # the job ended on its members meanwhile: nothing left to train
    STOP = "stop"  # a signal, a drain, the owner, the daemon lost: leave at this round
    TRAINED_OUT = "trained out"  # every epoch is trained here: the end
    AGREED = "agreed"  # the end consensus is this worker's model (its own, when nobody else's arrived)
    TAKEN = "taken"  # the job's model, from a member that finished first (verified)
    NONE_TAKEN = "none taken"  # no member's daemon sent the job's model: no model here
    NO_STEP = "no step"  # nothing trained here and nobody's model arrived: no model here
    CLOSE = "close"  # stop serving (the end of every path, a failure's too)


class Model(enum.Enum):
    """What the worker's model.pt is when it finished."""

    CONSENSUS = "consensus"  # its end: the average over its consensus set (its own alone)
    JOBS = "job's"  # taken from a member that finished
    NONE = "none"  # no model.pt, with a line that says where the job's is


@dataclass(frozen=True)
class Transition:
    to: Stage
    model: Model | None = None  # set on the moves into FINISHED


_T = Transition
TABLE: dict[tuple[Stage, Event], Transition] = {
    (Stage.JOINING, Event.BEGIN): _T(Stage.TRAINING),
    (Stage.JOINING, Event.ENDED_ELSEWHERE): _T(Stage.TAKING),
    (Stage.TRAINING, Event.STOP): _T(Stage.LEFT),
    (Stage.TRAINING, Event.TRAINED_OUT): _T(Stage.CONCLUDING),
    (Stage.CONCLUDING, Event.AGREED): _T(Stage.FINISHED, Model.CONSENSUS),
    (Stage.CONCLUDING, Event.TAKEN): _T(Stage.FINISHED, Model.JOBS),
    (Stage.CONCLUDING, Event.NO_STEP): _T(Stage.FINISHED, Model.NONE),
    (Stage.TAKING, Event.TAKEN): _T(Stage.FINISHED, Model.JOBS),
    (Stage.TAKING, Event.NONE_TAKEN): _T(Stage.FINISHED, Model.NONE),
    **{(s, Event.CLOSE): _T(Stage.CLOSED) for s in Stage if s != Stage.CLOSED},
}


def step(stage: Stage, event: Event) -> Transition | None:
    """The move `event` makes in `stage`; None: it does not apply there, the worker stays."""
    return TABLE.get((stage, event))


class Outcome(enum.StrEnum):
    """How a worker's part in its job ended (the worker's exit code follows from it)."""

    FINISHED = "finished"  # every epoch trained here (or taken): the job's model, or none said why
    LEFT = "left"  # the operator asked (peerctl leave --drain)
    STOPPED = "stopped"  # a signal, or a failure


def outcome_of(trained_out: bool, left: bool, asked_to_leave: bool) -> Outcome:
    """`trained_out`: the job's epochs are done here; `left`: the worker left at
    a round (drained or signalled); `asked_to_leave`: the operator asked."""
    if trained_out and not left:
        return Outcome.FINISHED
    return Outcome.LEFT if asked_to_leave else Outcome.STOPPED
