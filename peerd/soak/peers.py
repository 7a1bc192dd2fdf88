"""One soak peer: a real `peerd` daemon (and the worker it supervises) in the
peer's network namespace, with its own config, state directory and socket.

Only processes started here are ever signalled, by PID; a worker PID is checked
against /proc/PID/cmdline first, so a reused PID is never hit. A frozen process
(SIGSTOP) is continued (SIGCONT) before the peer is stopped, so it can end cleanly.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from peerd.control.client import ControlClient
from peerd.settings.config import parse_config
from peerd.errors import ConfigError, PeerdError
from peerd.core.codes import ACTIVE_STATES
from peerd.soak.checks import Sample
from peerd.soak.netns import PeerNet

READY_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
CLIENT_TIMEOUT_S = 5.0


def slowdown_table() -> str | None:
    """The daemon config table that takes `slowdown = F` in this build, or None."""
    for table in ("worker", "daemon"):
        try:
            parse_config({table: {"slowdown": 2.0}}, "feature probe")
            return table
        except ConfigError:
            continue
    return None


@dataclass
class SoakPeer:
    index: int
    dir: Path
    socket: Path
    net: PeerNet
    slowdown: float = 1.0
    rate_mbit: float = 0.0
    process: subprocess.Popen | None = None
    expected_up: bool = False  # false from the moment the harness kills or stops it
    linked: bool = True
    in_job: bool = False
    worker_pids: set[int] = field(default_factory=set)
    frozen_pid: int = 0  # its daemon or worker, stopped by `freeze` until `thaw`
    _thawed: threading.Event = field(default_factory=threading.Event)

    @property
    def peer_id(self) -> str:
        return f"peer-{self.index}"

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def client(self, timeout_s: float = CLIENT_TIMEOUT_S) -> ControlClient:
        return ControlClient(self.socket, timeout_s=timeout_s)

    def write_config(self, realm: str, slowdown_key: str | None, extra: str = "", *,
                     worker: dict[str, object] | None = None, discovery: dict[str, int] | None = None) -> None:
        """`extra`: more tables (TOML), e.g. a local-data job's [data] and [auth];
        `worker`: more [worker] settings, as TOML values; `discovery`: more
        [discovery] values (full_mesh_max, fanout)."""
        # The harness kills workers on purpose: none of them may count towards a crash
        # limit ([worker] max_crashes, docs/operations.md) and end the job on its peer.
        tables: dict[str, dict[str, object]] = {"worker": {"max_crashes": 0, **(worker or {})}}
        if slowdown_key and self.slowdown != 1.0:
            tables.setdefault(slowdown_key, {})["slowdown"] = self.slowdown
        slow = "".join(f"\n[{name}]\n" + "".join(f"{k} = {v}\n" for k, v in values.items())
                       for name, values in tables.items())
        (self.dir / "peerd.toml").write_text(
            "[daemon]\n"
            f'state_dir = "{self.dir / "state"}"\n'
            f'control_socket = "{self.socket}"\n'
            f'peer_id = "{self.peer_id}"\n'
            f'host = "{self.net.address}"\n\n'
            "[discovery]\n"
            f'interfaces = ["{self.net.address}"]  # mDNS only on this peer\'s link\n'
            f'realm = "{realm}"\n' + "".join(f"{k} = {v}\n" for k, v in (discovery or {}).items())
            + slow + extra
        )

    def start(self) -> None:
        if self.alive:
            raise PeerdError(f"{self.peer_id} is already running")
        self.dir.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "peerd.cli.daemon", "--config", str(self.dir / "peerd.toml")]
        with open(self.dir / "daemon.log", "ab") as log:
            self.process = subprocess.Popen(self.net.command(argv), stdout=log, stderr=log,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        self.expected_up = True

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if not self.alive:
                raise PeerdError(f"{self.peer_id} exited with {self.process.returncode}; see {self.dir / 'daemon.log'}")
            try:
                with self.client() as c:
                    c.status()
                return
            except PeerdError:
                if time.monotonic() > deadline:
                    raise PeerdError(f"{self.peer_id} did not answer in {timeout_s:.0f}s; "
                                     f"see {self.dir / 'daemon.log'}") from None
                time.sleep(0.3)

    def kill_daemon(self) -> None:
        """kill -9 the daemon; its worker gets SIGTERM from the kernel (PDEATHSIG)."""
        self.expected_up = False
        if self.alive:
            self.process.kill()
            self.process.wait(timeout=STOP_TIMEOUT_S)

    def stop(self) -> None:
        """SIGTERM, then kill -9 after STOP_TIMEOUT_S; then any worker still left."""
        self.terminate()
        self.reap(time.monotonic() + STOP_TIMEOUT_S)

    def terminate(self) -> None:
        self.expected_up = False
        self.thaw()  # a stopped process would hold its SIGTERM until continued
        if self.alive:
            self.process.send_signal(signal.SIGTERM)

    def reap(self, deadline: float) -> None:
        """Wait for the daemon until `deadline`, kill -9 it after; then kill -9 its workers."""
        if self.process is not None:
            try:
                self.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=STOP_TIMEOUT_S)
        for pid in sorted(self.worker_pids):
            if self._is_my_worker(pid):
                os.kill(pid, signal.SIGKILL)

    def kill_worker(self, job: str) -> int:
        """kill -9 this peer's worker of `job`; returns its PID."""
        pid = self._worker_pid(job)
        os.kill(pid, signal.SIGKILL)
        return pid

    def _worker_pid(self, job: str) -> int:
        with self.client() as c:
            pid = next((j.worker_pid for j in c.status().jobs if j.name == job), 0)
        if not pid or not self._is_my_worker(pid):
            raise PeerdError(f"{self.peer_id} has no worker of {job} running")
        return pid

    @property
    def frozen(self) -> bool:
        return bool(self.frozen_pid)

    def freeze(self, process: str, job: str) -> int:
        """SIGSTOP this peer's daemon ("daemon") or its worker of `job` ("worker")
        until `thaw`; returns the PID."""
        if process == "daemon":
            if not self.alive:
                raise PeerdError(f"{self.peer_id} has no daemon running")
            pid = self.process.pid
        else:
            pid = self._worker_pid(job)
        self._thawed.clear()
        self.frozen_pid = pid
        os.kill(pid, signal.SIGSTOP)
        return pid

    def stay_frozen(self, seconds: float) -> None:
        """Wait `seconds`, or less when the peer is thawed meanwhile (the soak ends)."""
        self._thawed.wait(seconds)

    def thaw(self) -> None:
        """SIGCONT the process `freeze` stopped, if any."""
        pid, self.frozen_pid = self.frozen_pid, 0
        self._thawed.set()
        if pid:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:  # it died meanwhile (a kill -9 of the soak's teardown)
                pass

    def _is_my_worker(self, pid: int) -> bool:
        """A peerd worker of this peer: its command line names this peer's directory,
        or (a worker started in the daemon's standby process, whose command line
        came on stdin) its parent is this peer's daemon."""
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
        if b"peerd.worker" not in cmdline:
            return False
        daemon = self.process.pid if self.process is not None else -1
        return parent == daemon or any(str(self.dir).encode() in a for a in cmdline)

    def sample(self, t: float, job: str, counters: tuple[int, int] | None) -> Sample:
        truth = dict(t=t, peer=self.peer_id, expected_up=self.expected_up, up=self.alive,
                     linked=self.linked, in_job=self.in_job, frozen=self.frozen)
        tx, rx = counters if counters else (math.nan, math.nan)
        if not truth["up"]:
            return Sample(**truth, tx_bytes=tx, rx_bytes=rx)
        try:
            with self.client(timeout_s=3.0) as c:
                status, peers = c.status(), c.peers()
        except PeerdError:
            return Sample(**truth, state="unanswered", tx_bytes=tx, rx_bytes=rx)
        view = {p.peer_id for p in peers.peers if any(j.name == job and j.state in ACTIVE_STATES for j in p.job_states)}
        local = next((j for j in status.jobs if j.name == job), None)
        if local is None:
            return Sample(**truth, state="", view=frozenset(view), tx_bytes=tx, rx_bytes=rx)
        if local.state in ACTIVE_STATES:
            view.add(self.peer_id)
        if local.worker_pid:
            self.worker_pids.add(local.worker_pid)
        p = local.progress
        return Sample(**truth, state=local.state, phase=p.phase, step=p.step, round=p.round, loss=p.loss,
                      metric=p.metric, lr=p.lr, batch=p.global_batch, exchange_s=p.exchange_s,
                      misses=p.segment_misses, reached=p.partners_reached, planned=p.partners_planned,
                      restarts=local.restarts, view=frozenset(view), tx_bytes=tx, rx_bytes=rx)
