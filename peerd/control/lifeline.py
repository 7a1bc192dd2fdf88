"""Workers die with their daemon (Linux), set up by the worker itself.

The daemon names itself in PEERD_DAEMON_PID; the worker's first act is
prctl(PR_SET_PDEATHSIG, SIGTERM), so the kernel signals it when the daemon dies,
even by kill -9. Not a preexec_fn in the daemon: that makes Python fork() a
process full of grpc threads and sockets rather than vfork() it.
"""

from __future__ import annotations

import ctypes
import os
import signal

PARENT_ENV = "PEERD_DAEMON_PID"
_PR_SET_PDEATHSIG = 1


def parent_env() -> dict[str, str]:
    """The environment for a worker this process starts."""
    return {**os.environ, PARENT_ENV: str(os.getpid())}


def die_with_parent() -> None:
    """If started by a daemon, get SIGTERM when it dies; exit now if it already has."""
    parent = os.environ.get(PARENT_ENV, "")
    if not parent.isdigit():
        return
    try:
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        return  # not Linux: the heartbeat guard still stops an orphan (docs/architecture.md)
    if os.getppid() != int(parent):  # it died before we asked
        raise SystemExit(143)
