"""Local daemons for a bench run (peerd.cli.localcluster.LocalCluster, or soak peers):
bounded waits, joins, the status of a job on each daemon, following a run, and
what a worker's log says about its start."""

from __future__ import annotations

import math
import re
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from peerd.cli.localcluster import LocalCluster
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
    return job_of(cluster.client(peer), job)


def job_of(client, job: str):
    """`job`'s status at the daemon behind a control client (closed after); None while it has no such job."""
    with client as c:
        return next((j for j in c.status().jobs if j.name == job), None)


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


def wait_finished(cluster, job: str, failed: str, interval_s: float = 1.0,
                  on_poll: Callable[[list], object] = lambda statuses: None) -> list:
    """Every peer's status of `job` once all have finished it, handing each poll's
    statuses (job_status's, in peer order) to `on_poll`; SystemExit(`failed`) as
    soon as one has failed."""
    while True:
        statuses = [job_status(cluster, p, job) for p in cluster.peers]
        on_poll(statuses)
        jobs = [j for j in statuses if j is not None]
        if any(j.state == "failed" for j in jobs):
            raise SystemExit(failed)
        if len(jobs) == len(cluster.peers) and all(j.state == "finished" for j in jobs):
            return jobs
        time.sleep(interval_s)


@dataclass
class Watch:
    """How a bench follows one run on a cluster: its label and log folder for
    messages, a bound on its time, how often it polls and says where it is."""

    label: str
    logs: Path
    limit_s: float
    interval_s: float
    say_every_s: float = 10.0

    def run(self, cluster, poll: Callable[[], list[dict]], over: Callable[[list[dict]], bool],
            say: Callable[[list[dict]], str]) -> bool:
        """poll() rows (a "state" each) until over(rows), which may act on the run
        meanwhile (joins, leaves); True then, False past the time limit (the
        caller records the run as incomplete). A failed worker or an exited
        daemon is an error."""
        started, said = time.monotonic(), -math.inf
        while True:
            rows = poll()
            t = time.monotonic() - started
            if t - said >= self.say_every_s:
                said = t
                print(f"  [{self.label} {t:5.0f}s] {say(rows)}", flush=True)
            if any(r["state"] == "failed" for r in rows):
                raise PeerdError(f"{self.label}: a worker failed; see the logs in {self.logs}")
            daemons_alive(cluster)
            if over(rows):
                return True
            if t > self.limit_s:
                print(f"  [{self.label}] not finished after {self.limit_s:.0f}s (--time-limit); stopping it; "
                      f"logs in {self.logs}", flush=True)
                return False
            time.sleep(self.interval_s)


def train_job(peers: int, out: Path, text: str, spec_dir: str = "", interval_s: float = 1.0) -> tuple[list, float]:
    """A fresh LocalCluster of `peers` daemons (logs under `out`) trains the job in
    `text` to its end: every peer's final status, and the seconds from the last
    join to the last finish. Every daemon is stopped by PID at the end."""
    job = tomllib.loads(text)["job"]["name"]
    with LocalCluster(peers, out) as cluster:
        cluster.wait_ready()
        join_all(cluster, text, spec_dir)
        started = time.perf_counter()
        jobs = wait_finished(cluster, job, f"a peer failed; logs under {out}", interval_s)
        return jobs, time.perf_counter() - started


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


def wait_job_seen(client_of: Callable, job: str, timeout_s: float = 30.0) -> None:
    """Until the daemon behind client_of() has heard of the running `job` (from
    its Hello replies: joining it by name fails before)."""
    def seen() -> bool:
        with client_of() as c:
            return any(j.name == job for j in c.jobs().jobs)

    poll_until(seen, timeout_s, f"the newcomer's daemon to see job {job!r}")


def join_by_name(client_of: Callable, peer_dir: Path, job: str, timeout_s: float) -> tuple[float, str]:
    """The daemon behind client_of() joins the running `job` by name, as `peerctl
    join NAME` does: the wall clock at the join, and its worker's log once it trains."""
    started = time.time()
    with client_of() as c:
        c.join_by_name(job)
    return started, first_step(job_dir(peer_dir, job) / "worker.log", timeout_s)


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
