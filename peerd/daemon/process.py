"""What every worker process the daemon starts has in common."""

from __future__ import annotations

import ctypes
import signal

_PR_SET_PDEATHSIG = 1
RELAY_LINE_LIMIT = 1 << 20  # the longest output line relayed whole from a worker


def die_with_parent() -> None:
    """preexec_fn, Linux: the worker gets SIGTERM when the daemon dies, even by kill -9."""
    try:
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass
