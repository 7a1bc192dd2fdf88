"""When a worker writes its next checkpoint ([checkpoint] every_rounds and
every_s; docs/operations.md, Checkpoints)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LastCheckpoint:
    round: int  # of the last checkpoint written or resumed from
    at: float  # ... and when (a monotonic clock)
    written: int  # checkpoints this process wrote


def checkpoint_due(every_rounds: int, every_s: float, last: LastCheckpoint, round_: int, now: float) -> bool:
    """After round `round_`: every `every_rounds` rounds and/or every `every_s`
    seconds (0: not by that measure; both 0: never). Also at a process's first
    round, so that a crash soon after a (re)start resumes from there, not from
    round 0."""
    if every_rounds <= 0 and every_s <= 0:
        return False
    return (last.written == 0 or (every_rounds > 0 and round_ - last.round >= every_rounds)
            or (every_s > 0 and now - last.at >= every_s))
