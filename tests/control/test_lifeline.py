"""A worker dies with its daemon through the kernel's parent-death signal
(peerd.control.lifeline), not only through the heartbeat's fallback: a bare
process with no heartbeat at all, killed parent, must go."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import wait_for

# The child asks for the signal, says so, then would sleep for longer than any test.
CHILD = textwrap.dedent("""
    import sys, time
    from peerd.control.lifeline import die_with_parent
    die_with_parent()
    open(sys.argv[1], "w").close()
    time.sleep(600)
""")
# The parent starts the child with its own pid in the environment, as a daemon does.
PARENT = textwrap.dedent("""
    import subprocess, sys, time
    from peerd.control.lifeline import parent_env
    child = subprocess.Popen([sys.executable, "-c", sys.argv[2], sys.argv[1]], env=parent_env())
    print(child.pid, flush=True)
    time.sleep(600)
""")


def alive(pid: int) -> bool:
    """Running, not a zombie left for a reaper that may never come (a container's pid 1)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def orphan(tmp_path: Path) -> int:
    """Start parent and child, wait until the child asked for the signal, kill -9
    the parent; the child's pid."""
    ready = tmp_path / "ready"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(ready), CHILD],
                              stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        wait_for(ready.exists, 60, "the child to start")
    finally:
        parent.kill()
        parent.wait()
        parent.stdout.close()
    return child


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_process_started_by_a_daemon_dies_when_the_daemon_is_killed(tmp_path):
    child = orphan(tmp_path)
    try:
        wait_for(lambda: not alive(child), 30, f"process {child} to die with its parent")
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)
