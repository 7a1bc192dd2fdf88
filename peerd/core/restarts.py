"""What the daemon does when a worker process exits: restart it (when), or not.

The core decides; WorkerProcess._supervise (peerd.daemon.jobs) carries it out.
A crash is restarted with exponential backoff; a worker that finished, cannot
load its job (ExitCode.CONFIG), or was asked to stop is not.
"""

from __future__ import annotations

from dataclasses import dataclass

from peerd.core.codes import ExitCode, WorkerState


@dataclass(frozen=True)
class Backoff:
    """Delay before the first restart, doubling up to max_s."""

    first_s: float
    max_s: float

    def __post_init__(self) -> None:
        if not 0 < self.first_s <= self.max_s:
            raise ValueError(f"need 0 < first_s <= max_s, got {self.first_s}, {self.max_s}")


@dataclass(frozen=True)
class RestartHistory:
    """What the policy remembers of one worker's exits."""

    restarts: int = 0  # crashes restarted so far
    last_delay_s: float = 0.0  # the delay before the latest restart; 0: none yet


@dataclass(frozen=True)
class ExitAction:
    """The decision: the worker's new state, and when it restarts (RESTARTING only)."""

    state: WorkerState  # FINISHED, FAILED, STOPPED (not restarted) or RESTARTING
    history: RestartHistory
    restart_at: float | None = None  # on the caller's clock
    delay_s: float = 0.0

    @property
    def restarts(self) -> bool:
        return self.state == WorkerState.RESTARTING


def after_exit(code: int, stop_requested: bool, history: RestartHistory, backoff: Backoff,
               now: float) -> ExitAction:
    """The action for a worker that exited with `code` at `now`. `stop_requested`:
    the daemon asked it to stop or leave, so whatever the code, it stays stopped."""
    if stop_requested:
        return ExitAction(WorkerState.STOPPED, history)
    if code == ExitCode.FINISHED:
        return ExitAction(WorkerState.FINISHED, history)
    if code == ExitCode.CONFIG:
        return ExitAction(WorkerState.FAILED, history)
    delay = backoff.first_s if history.restarts == 0 else min(2 * history.last_delay_s, backoff.max_s)
    return ExitAction(WorkerState.RESTARTING, RestartHistory(history.restarts + 1, delay), now + delay, delay)
