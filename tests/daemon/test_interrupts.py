"""SIGTERM as Ctrl+C for the commands that start processes (peerd.cli.interrupts)."""

from __future__ import annotations

import os
import signal

import pytest

from peerd.cli.interrupts import sigterm_interrupts


def test_sigterm_raises_keyboard_interrupt_inside_and_the_old_handler_comes_back():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        with sigterm_interrupts():
            os.kill(os.getpid(), signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) is before
