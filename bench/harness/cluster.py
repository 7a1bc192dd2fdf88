"""Local daemons for a bench run (peerd.cluster.LocalCluster, or soak peers):
bounded waits, joins, the status of a job on each daemon, the built-in job with
a bench's values, and what a worker's log says about its start."""

from __future__ import annotations

import re
import time
import tomllib
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import tomli_w

from peerd.cluster import default_job
from peerd.errors import DaemonNotRunning, PeerdError

TOOK_STATE = "joining: took the state of round"  # a worker's log line when it started from its peers' state
FIRST_STEP = "training from round"  # a worker's log line when it starts training
STAMP = re.compile(r"^ts=(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})Z ")  # peerd.logs, text format, UTC
PULLED = re.compile(r"took the state of round \d+ .* from (.*) in ([\d.]+)s")
DOWN = "down"  # job_statuses: the daemon did not answer


def poll_until(predicate: Callable[[], object], timeout_s: float, what: str, interval_s: float = 0.2,
               retry_on: tuple[type[BaseException], ...] = (DaemonNotRunning,)):
    """predicate()'s first truthy value, polled every interval_s; PeerdError naming
    `what` after timeout_s. `retry_on`: errors that mean "not yet" (a control socket
    that is not up)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if value := predicate():
                return value
        except retry_on:
            pass
        if time.monotonic() > deadline:
            raise PeerdError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(interval_s)


def daemons_alive(cluster) -> bool:
    """True, or PeerdError naming the first daemon of a LocalCluster that exited."""
    for peer in cluster.peers:
        if peer.process.poll() is not None:
            raise PeerdError(f"{peer.peer_id}'s daemon exited with {peer.process.returncode}; "
                             f"see {peer.dir / 'daemon.log'}")
    return True


def peers_known(client) -> int:
    """How many other daemons the daemon behind a control client has heard of (closes it)."""
    with client as c:
        return c.status().peers_known


def wait_discovery(cluster, timeout_s: float = 30.0) -> None:
    """Until every daemon of a LocalCluster has heard of every other."""
    n = len(cluster.peers) - 1
    poll_until(lambda: daemons_alive(cluster) and all(peers_known(cluster.client(p)) >= n for p in cluster.peers),
               timeout_s, f"every daemon to discover the other {n}")


def join_all(cluster, text: str, spec_dir: str = "", peers=None) -> None:
    """Join `peers` (default: every daemon) to the job in `text`, its code in `spec_dir`."""
    for peer in cluster.peers if peers is None else peers:
        with cluster.client(peer) as c:
            c.join(text, spec_dir)


def job_status(cluster, peer, job: str):
    """`job`'s status at the daemon of a LocalCluster peer; None while it has no such job."""
    with cluster.client(peer) as c:
        jobs = [j for j in c.status().jobs if j.name == job]
    return jobs[0] if jobs else None


def job_statuses(cluster, job: str) -> list:
    """Each daemon's status of `job`, in peer order: None where it has no such job,
    DOWN where it did not answer."""
    out = []
    for peer in cluster.peers:
        try:
            out.append(job_status(cluster, peer, job))
        except PeerdError:
            out.append(DOWN)
    return out


def wait_finished(cluster, job: str, failed: str, interval_s: float = 1.0) -> list:
    """Every peer's status of `job` once all have finished it; SystemExit(`failed`)
    as soon as one has failed."""
    while True:
        jobs = [j for j in (job_status(cluster, p, job) for p in cluster.peers) if j is not None]
        if any(j.state == "failed" for j in jobs):
            raise SystemExit(failed)
        if len(jobs) == len(cluster.peers) and all(j.state == "finished" for j in jobs):
            return jobs
        time.sleep(interval_s)


def example_job(**tables: dict) -> str:
    """The built-in MNIST job (peerd/examples/mnist.toml) with a bench's values:
    each keyword a table whose keys replace or add to the file's."""
    data = tomllib.loads(default_job().read_text())
    for table, values in tables.items():
        data.setdefault(table, {}).update(values)
    return tomli_w.dumps(data)


def job_dir(peer_dir: Path, job: str) -> Path:
    """Where a daemon keeps a job's worker log, checkpoints and model.pt."""
    return peer_dir / "state" / "jobs" / job


def took_state(peer_dir: Path, job: str) -> str:
    """The worker's log line saying it joined from the others' state, "" if it did not."""
    log = job_dir(peer_dir, job) / "worker.log"
    if not log.exists():
        return ""
    for line in log.read_text(errors="replace").splitlines():
        if TOOK_STATE in line:
            return line.split(" INFO ", 1)[-1]
    return ""


def first_step(log_path: Path, timeout_s: float) -> str:
    """A worker's log once it says it trains: the text, for stamp_of and pulled."""
    return poll_until(lambda: log_path.exists() and FIRST_STEP in (t := log_path.read_text()) and t,
                      timeout_s, "the newcomer's first step")


def stamp_of(log: str, needle: str) -> float:
    """The time (UTC seconds) of the first log line holding `needle`."""
    for line in log.splitlines():
        if needle in line and (m := STAMP.match(line)):
            return datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%f").replace(tzinfo=timezone.utc).timestamp()
    raise PeerdError(f"no {needle!r} in the newcomer's log")


def pulled(log: str) -> tuple[str, float] | None:
    """Whom a newcomer pulled its state from ("a, b") and in how many seconds; None if it did not."""
    m = PULLED.search(log)
    return (m.group(1), float(m.group(2))) if m else None
