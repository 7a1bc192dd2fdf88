"""Shared fixtures and helpers: local clusters of real peerd daemons on 127.0.0.1,
in-process daemons, polling, and the leak checks every test runs under."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import settings as hypothesis_settings
from pytest_asyncio import is_async_test

from peerd.cli.localcluster import LocalCluster, default_job, job_with
from peerd.settings.config import DaemonConfig
from peerd.daemon.app import Daemon
from peerd.soak.netns import made_here

REPO = Path(__file__).resolve().parents[1]

# Property tests draw the same examples on every run ("ci", the default), so a
# run passes or fails for the code, not for the draw, and with no deadline per
# example (a busy machine is not a failure); PEERD_HYPOTHESIS=explore draws new
# ones each run, to look for counterexamples (pin what it finds with @example).
hypothesis_settings.register_profile("ci", derandomize=True, database=None, deadline=None)
hypothesis_settings.register_profile("explore", max_examples=1000, deadline=None)
hypothesis_settings.load_profile(os.environ.get("PEERD_HYPOTHESIS", "ci"))


def example_job(**tables: dict[str, object]) -> str:
    """The built-in job's text with values replaced, e.g. example_job(job={"epochs": 2})."""
    return job_with(default_job(), **tables)


def wait_for(predicate: Callable[[], object], timeout_s: float, what: str, interval_s: float = 0.25):
    """Poll until predicate() is truthy; fail the test with `what` on timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(interval_s)


def wait_for_discovery(cluster, timeout_s: float = 30) -> None:
    """Every daemon of a LocalCluster knows every other one."""
    others = len(cluster.peers) - 1
    wait_for(lambda: all(cluster.client(p).status().peers_known == others for p in cluster.peers), timeout_s,
             "discovery")


def all_finished(jobs):
    """`jobs` (job statuses) once every one has finished, else False: a predicate
    for wait_for that fails the test at once when one failed or is restarting."""
    jobs = list(jobs)
    assert all(j.state not in ("failed", "restarting") for j in jobs), jobs
    return all(j.state == "finished" for j in jobs) and jobs


def first_jobs(cluster, peers=None) -> list:
    """The status of the first (in these tests the only) job of each peer's daemon."""
    return [cluster.client(p).status().jobs[0] for p in (cluster.peers if peers is None else peers)]


def round_of(cluster, peer) -> int:
    """The round of a peer's first job as its daemon reports it (0 before it has one)."""
    jobs = cluster.client(peer).status().jobs
    return jobs[0].progress.round if jobs else 0


async def until(predicate: Callable[[], object], what: str, timeout_s: float = 20.0):
    """The in-process twin of wait_for: poll without blocking the event loop."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what}")
        await asyncio.sleep(0.05)


# --- leak check: a test must not leave tasks, threads, child processes or namespaces behind ----

# How long a task, thread or process that is already stopping may take to end
# (tests/tools/test_leak_checks.py shortens it for the tests that leak on purpose).
LEAK_GRACE_S = float(os.environ.get("PEERD_TEST_LEAK_GRACE_S", "10"))
# Process-wide threads libraries start once, on first use, and keep: not a test's leak.
LIBRARY_THREADS = ("(_poll_wrapper)",)  # grpc.aio's completion-queue poller
# multiprocessing's helpers (a DataLoader's workers start them), kept for the process's life.
LIBRARY_PROCESSES = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def _threads() -> dict[int, str]:
    return {t.ident: t.name for t in threading.enumerate() if t.ident is not None}


def _children() -> dict[int, str]:
    """Direct child processes of this process (from /proc: psutil is not a dependency)."""
    pids: set[int] = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            pids.update(int(p) for p in (task / "children").read_text().split())
        except (FileNotFoundError, ProcessLookupError):
            pass  # the thread ended while we looked
    out = {}
    for pid in pids:
        try:
            out[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
        except (FileNotFoundError, ProcessLookupError):
            pass
    return out


def _namespaces() -> set[str]:
    """Network namespaces this process made (peerd.soak.netns): the machine-wide list
    also holds other processes', which come and go while a test runs."""
    return made_here()


def _left_behind(before: tuple[dict, dict, set]) -> list[str]:
    threads, children, namespaces = before
    leaks = [f"thread {name!r}" for ident, name in _threads().items()
             if ident not in threads and not name.endswith(LIBRARY_THREADS)]
    leaks += [f"child process {pid}: {cmd}" for pid, cmd in _children().items()
              if pid not in children and not any(name in cmd for name in LIBRARY_PROCESSES)]
    leaks += [f"network namespace {ns}" for ns in sorted(_namespaces() - namespaces)]
    return leaks


@pytest.fixture(autouse=True)
def no_leaks():
    """Fail a test that leaves a thread, child process or network namespace it created.

    Autouse fixtures are set up first and so torn down last: other fixtures have cleaned up by
    the time this looks. Threads and processes that existed before the test (zeroconf's, grpc's,
    a session-wide server) are not counted; new ones get LEAK_GRACE_S to finish ending.
    """
    before = (_threads(), _children(), _namespaces())
    yield
    deadline = time.monotonic() + LEAK_GRACE_S
    while (leaks := _left_behind(before)) and time.monotonic() < deadline:
        time.sleep(0.1)
    if leaks:
        pytest.fail("the test left behind: " + "; ".join(leaks), pytrace=False)


@pytest.fixture(autouse=True)
def no_pending_tasks(no_leaks, request):
    """Fail an async test that leaves an asyncio task pending in its event loop.

    pytest-asyncio (1.x) runs each async test in an asyncio.Runner, a fixture of its own,
    whose close cancels whatever tasks are left: a leak nobody would see. Asking for that
    fixture here sets it up inside this one, so the runner closes after this looks and after
    the test's own fixtures have cleaned up. Only function-scoped loops: a wider loop may
    keep tasks from one test to the next on purpose. Depends on no_leaks so that the
    thread check runs once the runner has closed (and joined its executor's threads).
    """
    marker = request.node.get_closest_marker("asyncio")
    scope = marker and (marker.kwargs.get("loop_scope") or request.config.getini("asyncio_default_test_loop_scope"))
    if not is_async_test(request.node) or scope != "function":
        yield
        return
    runner = request.getfixturevalue("_function_scoped_runner")
    yield
    loop = runner.get_loop()
    if loop.is_closed():
        return
    pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
    if pending:
        runner.run(asyncio.wait(pending, timeout=LEAK_GRACE_S))
    pending = [t for t in pending if not t.done()]
    if pending:
        pytest.fail("the test left asyncio tasks pending: " + "; ".join(
            f"{t.get_name()} running {getattr(t.get_coro(), '__qualname__', t.get_coro())}" for t in pending)
            + " (cancel and await them before the test ends)", pytrace=False)


def free_port() -> int:
    """A port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def peerctl(peer, *args: str) -> subprocess.CompletedProcess:
    """`peerctl ARGS` against a LocalCluster peer's daemon, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "peerd.cli.peerctl", "--socket", str(peer.socket), *args],
                          capture_output=True, text=True, timeout=30)


def daemon_config(tmp_path: Path, name: str, realm: str = "", **changes) -> DaemonConfig:
    """An in-process daemon's settings: fast Hellos, loopback only, no standby; realm
    defaults to one of this test's own."""
    base = DaemonConfig(
        state_dir=tmp_path / name, control_socket=tmp_path / f"{name}.sock", peer_id=name,
        interfaces=("127.0.0.1",), hello_interval_s=0.2, peer_timeout_s=1.5, worker_standby=False,
        realm=realm or tmp_path.name,
    )
    return replace(base, **changes)


@pytest.fixture
async def daemons(tmp_path):
    """Factory: start a Daemon in this test's loop, daemons("alpha", seeds=...); all
    are closed when the test ends."""
    started: list[Daemon] = []

    async def start(name: str, realm: str = "", **changes) -> Daemon:
        daemon = Daemon(daemon_config(tmp_path, name, realm, **changes))
        started.append(daemon)
        await daemon.start()
        return daemon

    yield start
    for daemon in started:
        await daemon.aclose()


@pytest.fixture
def local_cluster(tmp_path):
    """Factory: start n daemons; all are stopped (by PID) when the test ends."""
    clusters: list[LocalCluster] = []

    def start(n: int, **options) -> LocalCluster:
        cluster = LocalCluster(n, tmp_path / f"cluster-{len(clusters)}", **options).__enter__()
        clusters.append(cluster)
        cluster.wait_ready()
        return cluster

    yield start
    for cluster in clusters:
        cluster.close()
        for peer in cluster.peers:
            assert peer.process.poll() is not None, f"{peer.peer_id} still running"
