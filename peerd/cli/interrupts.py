"""SIGTERM as Ctrl+C, for commands that start processes (peerd cluster, peerd
soak, the bench scripts): the KeyboardInterrupt unwinds through their cleanup,
which stops every daemon and worker by PID."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager


def raise_interrupt(signum: int, frame: object) -> None:
    """A signal handler: raise KeyboardInterrupt in the main thread."""
    raise KeyboardInterrupt


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Inside, SIGTERM raises KeyboardInterrupt; the previous handler comes back after."""
    previous = signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
