"""Helpers the bench scripts share: polling, daemon checks, spawned rank
processes (result collection and reaping), quantiles and the __main__ wrapper.

Importing this puts the repository root on sys.path, so `python bench/x.py`
finds peerd without installing it.
"""

from __future__ import annotations

import math
import os
import queue
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from peerd.errors import DaemonNotRunning, PeerdError  # noqa: E402
from peerd.interrupts import sigterm_interrupts  # noqa: E402

TOOK_STATE = "joining: took the state of round"  # a worker's log line when it started from its peers' state


# ---------------------------------------------------------------- daemons


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


def job_status(cluster, peer, job: str):
    """`job`'s status at the daemon of a LocalCluster peer; None while it has no such job."""
    with cluster.client(peer) as c:
        jobs = [j for j in c.status().jobs if j.name == job]
    return jobs[0] if jobs else None


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


def took_state(peer_dir: Path, job: str) -> str:
    """The worker's log line saying it joined from the others' state, "" if it did not."""
    log = peer_dir / "state" / "jobs" / job / "worker.log"
    if not log.exists():
        return ""
    for line in log.read_text(errors="replace").splitlines():
        if TOOK_STATE in line:
            return line.split(" INFO ", 1)[-1]
    return ""


# ---------------------------------------------------------------- rank processes


def rank_entry(run: Callable[[], dict], rank: int, barrier, results, conn) -> None:
    """The body of a spawned rank process: put run()'s result dict, or the error, on `results`."""
    try:
        import torch

        torch.set_num_threads(1)
        results.put({"rank": rank, "ok": True, **run()})
    except Exception:
        barrier.abort()  # wake the partners now instead of at their timeout
        results.put({"rank": rank, "ok": False, "error": traceback.format_exc()})
    finally:
        conn.close()


class GcMeter:
    """Seconds of CPU spent in Python's garbage collector since the last take():
    a rank's exchange allocates asyncio objects, and a collection it triggers
    walks every object torch imported (a full one: ~60 ms)."""

    def __init__(self) -> None:
        import gc

        self._seconds, self._began = 0.0, 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._began = time.thread_time()
        else:
            self._seconds += time.thread_time() - self._began

    def take(self) -> float:
        seconds, self._seconds = self._seconds, 0.0
        return seconds


def collect(method: str, procs: list, results, deadline: float) -> dict[int, dict]:
    """Each rank's result dict, by rank; raises when one fails, dies or is late."""
    got: dict[int, dict] = {}
    while len(got) < len(procs):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{method}: no result by the deadline")
        try:
            msg = results.get(timeout=0.5)
        except queue.Empty:
            dead = [p.name for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"{method}: {', '.join(dead)} died without a result") from None
            continue
        if not msg["ok"]:
            raise RuntimeError(f"{method} rank {msg['rank']} failed:\n{msg['error']}")
        got[msg["rank"]] = msg
    for p in procs:
        p.join(30)
    return got


def reap(procs: list, conns: list, results) -> None:
    """Stop every rank process still running (SIGTERM, then SIGKILL) and close the pipes."""
    for p in procs:
        if p.is_alive():
            p.terminate()
            p.join(5)
        if p.is_alive():
            p.kill()
            p.join(5)
    for conn in conns:
        conn.close()
    results.close()
    results.cancel_join_thread()


def wait_ranks(procs: list, timeout_s: float, failed: str) -> None:
    """Wait for subprocess ranks (each started in its own session) for `timeout_s`
    in all; raise PeerdError(`failed`) if one exited non-zero. Pair with kill_ranks
    in a `finally`."""
    deadline = time.monotonic() + timeout_s
    for proc in procs:
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    if any(p.returncode for p in procs):
        raise PeerdError(failed)


def kill_ranks(procs: list) -> None:
    """SIGKILL the session of every rank still running (its own session: the rank
    and what it started, nothing else) and reap it."""
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def stop_resource_tracker() -> None:
    """Reap multiprocessing's resource-tracker process (started for the Barrier's
    semaphores) rather than leaving it to exit after us, unreaped."""
    import gc
    from multiprocessing import resource_tracker

    gc.collect()  # free the Barriers/Queues first, so their semaphores are unregistered
    stop = getattr(resource_tracker._resource_tracker, "_stop", None)  # private, present in 3.8-3.13
    if stop is not None:
        stop()


# ---------------------------------------------------------------- figures and __main__


def quantile(xs: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def run_main(main: Callable[[], int], after: Callable[[], None] = lambda: None) -> None:
    """Run a bench script's main and exit with its code: SIGTERM ends it as Ctrl+C
    does (130, after its cleanup), a crash prints its traceback (1); `after` runs last."""
    try:
        with sigterm_interrupts():
            code = main()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        code = 130
    except Exception:
        traceback.print_exc()
        code = 1
    after()  # after the handler: the traceback no longer holds what `after` frees
    sys.exit(code)
