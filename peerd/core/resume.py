"""Where a worker's state comes from when it (re)joins its job (docs/architecture.md,
"A worker's start", step 4).

The running peers' state is the job's: a worker takes it whenever a peer
serves, unless its own checkpoint is further along. A pull that fails while
peers run is tried again until a deadline; a worker without a checkpoint then
gives up (a crash: restarted with backoff) rather than start from scratch
beside a running job, which would train an untrained model as the job's.
With no peer serving: its newest valid checkpoint, else the initial model,
unless members already finished the job: then there is nothing left to train,
and a fresh start would train the whole job alone and hand back a second, lone
model as the job's (with a checkpoint, the worker ends with it at once).

The engine asks `resume_action` before each move and carries the answer out.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping
from dataclasses import dataclass

Position = tuple[int, int]  # (round, step): how far a state is along the job


class Tried(enum.StrEnum):
    NOTHING = "nothing"  # no pull yet
    TOOK = "took"  # the last pull took the peers' state
    FAILED = "failed"  # the last pull failed
    WAITED = "waited"  # heard from the daemon again after a failed pull


class Resume(enum.StrEnum):
    PULL = "pull"  # take the serving peers' state
    KEEP = "keep"  # train from the peers' state just taken
    CHECKPOINT = "checkpoint"  # train from this worker's newest valid checkpoint
    WAIT = "wait"  # a heartbeat, then look at the view again
    GIVE_UP = "give_up"  # peers run, their state would not come, and no checkpoint: fail
    FRESH = "fresh"  # nobody serves and no checkpoint: the initial model
    ENDED = "ended"  # nobody serves, no checkpoint, and members finished the job: end, nothing to train


@dataclass(frozen=True)
class Attempt:
    """What a joining worker knows when it decides."""

    tried: Tried
    serving: bool  # some peer serves the job's state (there are donors)
    checkpoint: Position | None  # this worker's newest valid checkpoint
    taken: Position | None = None  # the peers' state the last pull took (tried == TOOK)
    ended: bool = False  # other members finished the job (WorkerView.finished)


def resume_action(attempt: Attempt, now: float, deadline: float) -> Resume:
    """The next move; `deadline`: when a failing pull stops being tried again."""
    checkpoint = attempt.checkpoint
    if attempt.tried == Tried.TOOK:
        ahead = checkpoint is not None and attempt.taken is not None and checkpoint > attempt.taken
        return Resume.CHECKPOINT if ahead else Resume.KEEP
    if attempt.tried == Tried.FAILED:
        if now < deadline:
            return Resume.WAIT
        return Resume.GIVE_UP if checkpoint is None else Resume.CHECKPOINT
    if attempt.serving:
        return Resume.PULL
    if checkpoint is not None:
        return Resume.CHECKPOINT
    return Resume.ENDED if attempt.ended else Resume.FRESH


def trained(speeds: Mapping[str, float], progresses: Mapping[str, float]) -> set[str]:
    """Members that published a speed or a position: they took steps."""
    return {p for p, v in speeds.items() if v > 0} | {p for p, v in progresses.items() if v > 0}


def donors(view: Mapping[str, str], me: str, trained: Collection[str]) -> dict[str, str]:
    """Who to take the state from: the serving members that trained, when any
    did (a member still waiting at the start gate holds the initial state)."""
    serving = {p: a for p, a in view.items() if p != me}
    return {p: a for p, a in serving.items() if p in trained} or serving
