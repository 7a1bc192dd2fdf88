"""Rank processes of a measurement: spawned with a barrier between them, their
result dicts collected, always reaped; the timing of their repeats, the gloo
baseline every exchange bench sets peerd against, and subprocess ranks (each
the leader of its own process group) for the training baselines."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import queue
import signal
import time
import traceback
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

from peerd.errors import PeerdError

# ---------------------------------------------------------------- spawned ranks


@dataclass
class Rank:
    """What a spawned rank has: its number among `world`, the barrier that
    starts every repeat, and its pipe to the parent."""

    rank: int
    world: int
    barrier: object
    conn: object

    def share(self, mine: object, timeout_s: float) -> dict:
        """What every rank sent the parent (its address), by rank (run_ranks with share)."""
        self.conn.send(mine)
        if not self.conn.poll(timeout_s):
            raise TimeoutError("never got the others' addresses")
        return self.conn.recv()

    async def wait(self, timeout_s: float) -> None:
        """The barrier, waited for in a thread: the event loop keeps serving partners meanwhile."""
        await asyncio.to_thread(self.barrier.wait, timeout_s)


def rank_entry(entry: Callable[[Rank], dict], rank: int, world: int, barrier, results, conn) -> None:
    """The body of a spawned rank process: put entry(Rank)'s result dict, or the
    error, on `results`."""
    try:
        import torch

        torch.set_num_threads(1)
        results.put({"rank": rank, "ok": True, **entry(Rank(rank, world, barrier, conn))})
    except Exception:
        barrier.abort()  # wake the partners now instead of at their timeout
        results.put({"rank": rank, "ok": False, "error": traceback.format_exc()})
    finally:
        conn.close()


def run_ranks(name: str, n: int, entry: Callable[[Rank], dict], timeout_s: float, share: bool = False) -> list[dict]:
    """Spawn n fresh processes running entry(Rank) -> dict (a module-level
    function or a partial of one) and return their dicts by rank. With `share`,
    each first sends the parent what its partners need (Rank.share). Always reaped."""
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(n), ctx.Queue()
    pipes = [ctx.Pipe(duplex=True) for _ in range(n)]
    procs = [ctx.Process(target=rank_entry, args=(entry, r, n, barrier, results, pipes[r][1]),
                         name=f"bench-{name}-{r}", daemon=True) for r in range(n)]
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout_s
        if share:
            _hand_out([parent for parent, _ in pipes], deadline, name)
        got = collect(name, procs, results, deadline)
    finally:
        reap(procs, [end for pipe in pipes for end in pipe], results)
    return [got[r] for r in range(n)]


def _hand_out(parents: list, deadline: float, name: str) -> None:
    """Read what every rank sent and send each of them all of it, by rank."""
    sent = {}
    for r, parent in enumerate(parents):
        if not parent.poll(max(0.0, deadline - time.monotonic())):
            raise TimeoutError(f"{name}: process {r} never reported its address")
        sent[r] = parent.recv()
    for parent in parents:
        parent.send(sent)


def collect(name: str, procs: list, results, deadline: float) -> dict[int, dict]:
    """Each rank's result dict, by rank; raises when one fails, dies or is late."""
    got: dict[int, dict] = {}
    while len(got) < len(procs):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name}: no result by the deadline")
        try:
            msg = results.get(timeout=0.5)
        except queue.Empty:
            dead = [p.name for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"{name}: {', '.join(dead)} died without a result") from None
            continue
        if not msg["ok"]:
            raise RuntimeError(f"{name} rank {msg['rank']} failed:\n{msg['error']}")
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


def stop_resource_tracker() -> None:
    """Reap multiprocessing's resource-tracker process (started for the Barrier's
    semaphores) rather than leaving it to exit after us, unreaped."""
    import gc
    from multiprocessing import resource_tracker

    gc.collect()  # free the Barriers/Queues first, so their semaphores are unregistered
    stop = getattr(resource_tracker._resource_tracker, "_stop", None)  # private, present in 3.8-3.13
    if stop is not None:
        stop()


def slowest(ranks: list[dict], key: str) -> list[float]:
    """Per repeat, the slowest rank's figure under `key`."""
    return [max(values) for values in zip(*(r[key] for r in ranks))]


def same_result(name: str, ranks: list[dict]) -> None:
    """Every rank holds the same bytes (checksum and head of its vector)."""
    if len({(r["checksum"], tuple(r["head"])) for r in ranks}) != 1:
        raise AssertionError(f"{name}: the processes hold different results")


# ---------------------------------------------------------------- inside a rank


def rank_vectors(rank: int, world: int, numel: int):
    """This rank's initial vector and the mean of all ranks' vectors."""
    import torch

    vs = [torch.randn(numel, generator=torch.Generator().manual_seed(1234 + r)) for r in range(world)]
    return vs[rank], torch.stack(vs).mean(0)


def checks(vector) -> dict:
    """What the parent compares across ranks (same_result)."""
    return {"checksum": float(vector.double().sum()), "head": vector[:4].tolist()}


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


def cpu_wait_s() -> float:
    """Seconds this process's threads have spent runnable but waiting for a CPU
    (Linux: /proc/self/task/*/schedstat, run_delay; 0 elsewhere). A thread that
    ends takes its share with it."""
    total = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return 0.0
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                total += int(f.read().split()[1])
        except (OSError, IndexError, ValueError):
            pass
    return total / 1e9


class RepeatClock:
    """A rank's repeats: wall and CPU time (the process's, all threads) from
    start() to stop(), named sub-steps (each lap since the one before), with
    `gc` the garbage collector's share and with `waits` the time its threads
    waited for a CPU (cpu_wait_s); the first `warmup` repeats are not kept."""

    def __init__(self, warmup: int, gc: bool = False, waits: bool = False) -> None:
        self.warmup, self.done = warmup, 0
        self.times: list[float] = []
        self.cpu: list[float] = []
        self.gc: list[float] = []
        self.waited: list[float] = []
        self.split: dict[str, list[float]] = {}
        self._gc = GcMeter() if gc else None
        self._waits = waits

    def start(self) -> None:
        if self._gc is not None:
            self._gc.take()
        self._w0 = cpu_wait_s() if self._waits else 0.0
        self._t0 = self._lap = time.perf_counter()
        self._c0 = time.process_time()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        if self.done >= self.warmup:
            self.split.setdefault(name, []).append(now - self._lap)
        self._lap = now

    def stop(self) -> None:
        t, c = time.perf_counter(), time.process_time()
        gc_s = self._gc.take() if self._gc is not None else 0.0
        if self.done >= self.warmup:
            self.times.append(t - self._t0)
            self.cpu.append(c - self._c0)
            if self._gc is not None:
                self.gc.append(gc_s)
            if self._waits:
                self.waited.append(cpu_wait_s() - self._w0)
        self.done += 1

    def report(self) -> dict:
        return {"times": self.times, "cpu": self.cpu, "gc": self.gc, "split": self.split}


def run_loop(main: Callable, uvloop: bool = True):
    """main()'s coroutine run to its end, on uvloop (as the worker runs) when asked and installed."""
    if uvloop:
        try:
            import uvloop as loop

            return loop.run(main())
        except ImportError:
            pass
    return asyncio.run(main())


@contextmanager
def gloo_group(store: str, rank: int, world: int, timeout_s: float | None = None, iface: str | None = "lo"):
    """A torch.distributed gloo group over loopback only: rendezvous in a
    FileStore (torch's TCPStore listens on every interface), gloo's own sockets
    on `iface` (None: as GLOO_SOCKET_IFNAME already says)."""
    import torch.distributed as dist

    if iface is not None:
        os.environ["GLOO_SOCKET_IFNAME"] = iface
    extra = {"timeout": timedelta(seconds=timeout_s)} if timeout_s is not None else {}
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world, **extra)
    try:
        yield dist
    finally:
        dist.destroy_process_group()


def gloo_average(me: Rank, cfg: dict, verify: Callable) -> dict:
    """The baseline of the exchange benches, in one rank: gloo all_reduce(SUM) then
    div_(world), timed from the barrier; `verify(vector, mean)` checks the result
    and returns what the parent compares. cfg: numel, warmup, repeats,
    gloo_store, barrier_s."""
    own0, mean = rank_vectors(me.rank, me.world, cfg["numel"])
    vector, clock = own0.clone(), RepeatClock(cfg["warmup"])
    with gloo_group(cfg["gloo_store"], me.rank, me.world, cfg["barrier_s"]) as dist:
        for _ in range(cfg["warmup"] + cfg["repeats"]):
            vector.copy_(own0)
            me.barrier.wait(cfg["barrier_s"])
            clock.start()
            dist.all_reduce(vector, op=dist.ReduceOp.SUM)
            clock.lap("all_reduce")
            vector.div_(me.world)
            clock.stop()
        checked = verify(vector, mean)
        me.barrier.wait(cfg["barrier_s"])
    return {**clock.report(), **checked}


# ---------------------------------------------------------------- subprocess ranks


def wait_ranks(procs: list, timeout_s: float, failed: str) -> None:
    """Wait for subprocess ranks (each leading its own process group) for `timeout_s`
    in all; raise PeerdError(`failed`) if one exited non-zero. Pair with kill_ranks
    in a `finally`."""
    deadline = time.monotonic() + timeout_s
    for proc in procs:
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    if any(p.returncode for p in procs):
        raise PeerdError(failed)


def kill_ranks(procs: list) -> None:
    """SIGKILL the process group of every rank still running (its own group: the
    rank and what it started, nothing else) and reap it."""
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
