"""What the daemon does when a worker process exits: restart it (when), or not.

The core decides; WorkerProcess._supervise (peerd.daemon.jobs) carries it out.
A crash is restarted with exponential backoff; a worker that finished, cannot
load its job (ExitCode.CONFIG), or was asked to stop is not. Nor is a worker
that crashed `CrashLimit.max_crashes` times within `CrashLimit.window_s`: it
fails (docs/operations.md, "When a worker crashes").

Every crash counts towards the limit, whatever the worker said: an error line
is no reliable identity (messages carry sizes, addresses, rounds; a kill by the
OOM killer or a segfault leaves none), so counting only "the same" error could
restart a broken job for ever, and a worker crashing in different ways five
times in ten minutes is no better off. The window keeps a rare crash in a long
run from ever adding up to the limit.
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
class CrashLimit:
    """The `max_crashes`-th crash within `window_s` seconds is not restarted;
    max_crashes = 0: no limit (every crash is restarted)."""

    max_crashes: int
    window_s: float

    def __post_init__(self) -> None:
        if self.max_crashes < 0 or not self.window_s > 0:
            raise ValueError(f"need max_crashes >= 0 and window_s > 0, got {self.max_crashes}, {self.window_s}")

    def recent(self, crashes: tuple[float, ...], now: float) -> tuple[float, ...]:
        """The crash times that still count at `now`: within the window."""
        return tuple(t for t in crashes if now - t <= self.window_s)


NO_LIMIT = CrashLimit(0, 1.0)


@dataclass(frozen=True)
class RestartHistory:
    """What the policy remembers of one worker's exits."""

    restarts: int = 0  # crashes restarted so far
    last_delay_s: float = 0.0  # the delay before the latest restart; 0: none yet
    crashes: tuple[float, ...] = ()  # when it crashed, oldest first: those within the limit's window


@dataclass(frozen=True)
class ExitAction:
    """The decision: the worker's new state, and when it restarts (RESTARTING only)."""

    state: WorkerState  # FINISHED, FAILED, STOPPED (not restarted) or RESTARTING
    history: RestartHistory
    restart_at: float | None = None  # on the caller's clock
    delay_s: float = 0.0
    gave_up: bool = False  # FAILED because it crashed too often (len(history.crashes) times in the window)

    @property
    def restarts(self) -> bool:
        return self.state == WorkerState.RESTARTING


def after_exit(code: int, stop_requested: bool, history: RestartHistory, backoff: Backoff,
               now: float, limit: CrashLimit = NO_LIMIT) -> ExitAction:
    """The action for a worker that exited with `code` at `now`. `stop_requested`:
    the daemon asked it to stop or leave, so whatever the code, it stays stopped.
    Any other exit than FINISHED or CONFIG is a crash: restarted after the
    backoff, unless it is the limit's max_crashes-th within its window."""
    if stop_requested:
        return ExitAction(WorkerState.STOPPED, history)
    if code == ExitCode.FINISHED:
        return ExitAction(WorkerState.FINISHED, history)
    if code == ExitCode.CONFIG:
        return ExitAction(WorkerState.FAILED, history)
    crashes = (*limit.recent(history.crashes, now), now) if limit.max_crashes else ()
    if limit.max_crashes and len(crashes) >= limit.max_crashes:
        return ExitAction(WorkerState.FAILED, RestartHistory(history.restarts, history.last_delay_s, crashes),
                          gave_up=True)
    delay = backoff.first_s if history.restarts == 0 else min(2 * history.last_delay_s, backoff.max_s)
    return ExitAction(WorkerState.RESTARTING, RestartHistory(history.restarts + 1, delay, crashes),
                      now + delay, delay)
