"""Whose heartbeat a daemon believes: its worker's process or a descendant of it
(peerd.daemon.process.descends_from), read from /proc."""

from __future__ import annotations

import os
import subprocess
import sys

from peerd.daemon.process import descends_from


def test_a_process_descends_from_itself_and_its_ancestors_not_from_a_stranger():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert descends_from(child.pid, child.pid)
        assert descends_from(child.pid, os.getpid())  # a script job's child reports: still ours
        assert not descends_from(os.getpid(), child.pid)  # the daemon's worker is the child, not us
        assert not descends_from(child.pid, 0)  # no worker process started: nobody's heartbeat is its
    finally:
        child.kill()
        child.wait()
    assert not descends_from(child.pid, os.getpid())  # gone: its heartbeat cannot be believed
