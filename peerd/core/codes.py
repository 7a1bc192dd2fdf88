"""Values that travel between processes: a worker's exit code, a worker's state.

One home for each, so the daemon that reads a code and the worker that returns
it cannot disagree.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """How a peerd process ended. The daemon restarts a worker that exits with
    anything but FINISHED or CONFIG, or that it did not ask to stop or leave
    (a crash; peerd.core.restarts)."""

    FINISHED = 0  # trained every epoch of the job (for a CLI: success)
    ERROR = 1  # a peerd error a restart may get past
    CONFIG = 2  # the job or config cannot load here, or too few peers came to start: restarting would not help
    LEFT = 3  # left on the operator's request (drain)
    STOPPED = 143  # stopped by a signal (128 + SIGTERM)


class WorkerState(enum.StrEnum):
    """A worker's state as the daemon reports it (Status, ListJobs, Hello); a
    job's state is its most active worker's."""

    STARTING = "starting"
    RUNNING = "running"
    RESTARTING = "restarting"
    FINISHED = "finished"
    FAILED = "failed"
    STOPPED = "stopped"
    # A job's state (never a worker's) while its machine is not free for it: the
    # workers left, the daemon keeps the job and joins it again (peerd.core.availability).
    PAUSED = "paused"


# Most active first: a job with a worker in one of these states holds its name.
ACTIVE_STATES = (WorkerState.RUNNING, WorkerState.RESTARTING, WorkerState.STARTING)
ENDED_STATES = frozenset({WorkerState.FINISHED, WorkerState.FAILED, WorkerState.STOPPED})
