"""The freeze event's signals, for real: the soak harness stops a process (SIGSTOP)
and continues it (SIGCONT). The process is one this test started, standing in for
a peer's daemon (the soak's daemons under a freeze are not part of CI: the short
soak of tests/e2e/test_soak.py has none)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

from conftest import wait_for
from peerd.cli.localcluster import default_job
from peerd.soak import schedule as sch
from peerd.soak.events import Running
from peerd.soak.runner import Soak, SoakSettings

ECHO = "import sys\nfor line in sys.stdin:\n    print(line.strip(), flush=True)\n"


def test_a_freeze_stops_the_peers_process_and_continues_it(tmp_path):
    said: list[str] = []
    soak = Soak(SoakSettings(loopback=True, out=tmp_path / "soak"), default_job(), said.append)
    child = subprocess.Popen([sys.executable, "-c", ECHO], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        peer = soak.add_peer(0)
        peer.process = child  # the "daemon" a freeze of process = "daemon" stops
        # down_s far beyond the test: the process stays stopped until the test thaws the peer.
        event = sch.Event(0.0, sch.FREEZE, 0, down_s=3600.0, process="daemon")
        running = Running(event, soak.now(), soak.now() + 60.0)
        running.start(soak.carry_out)
        reports: list[int] = []

        def changed(want) -> bool:
            pid, status = os.waitpid(child.pid, os.WUNTRACED | os.WCONTINUED | os.WNOHANG)
            reports.extend([status] if pid else [])
            return any(want(s) for s in reports)

        wait_for(lambda: changed(os.WIFSTOPPED), 60, "the frozen process to stop")
        assert [os.WSTOPSIG(s) for s in reports] == [signal.SIGSTOP] and peer.frozen_pid == child.pid
        assert not running.done  # the event holds it stopped
        peer.thaw()
        wait_for(lambda: changed(os.WIFCONTINUED), 60, "the frozen process to be continued")
        running.thread.join(60)
        record = running.record(soak.now())
        assert record.ok and (record.kind, record.peer) == (sch.FREEZE, "peer-0"), record
        assert re.fullmatch(rf"daemon pid {child.pid} stopped \(SIGSTOP\) for \d+\.\ds, then continued \(SIGCONT\)",
                            record.detail), record.detail
        assert said == [f"[{record.at_s:5.0f}s] freeze peer-0 daemon for 3600s: {record.detail}"]
        child.stdin.write("still here\n")
        child.stdin.flush()
        assert child.stdout.readline() == "still here\n"  # it runs again
        assert not peer.frozen
    finally:
        errors = soak.close()  # continues a process still frozen, then stops it
        child.wait(timeout=30)
    assert errors == [] and child.returncode == -signal.SIGTERM


def test_the_soaks_teardown_continues_a_frozen_process_so_that_it_ends_on_sigterm(tmp_path):
    soak = Soak(SoakSettings(loopback=True, out=tmp_path / "soak"), default_job(), lambda line: None)
    child = subprocess.Popen([sys.executable, "-c", ECHO], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        peer = soak.add_peer(0)
        peer.process = child
        running = Running(sch.Event(0.0, sch.FREEZE, 0, down_s=3600.0, process="daemon"), 0.0, 60.0)
        running.start(soak.carry_out)
        wait_for(lambda: os.waitpid(child.pid, os.WUNTRACED | os.WNOHANG)[0], 60, "the frozen process to stop")
    finally:
        errors = soak.close()
        child.wait(timeout=60)
    running.thread.join(60)
    # Stopped, a process keeps SIGTERM pending: it ended on it, so the teardown continued it first.
    assert errors == [] and child.returncode == -signal.SIGTERM
    assert running.record(soak.now()).ok and not peer.frozen
