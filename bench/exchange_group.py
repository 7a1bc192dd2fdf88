#!/usr/bin/env python
"""Exchange-and-average of one fp32 vector in a group of N worker processes on
127.0.0.1 (default 4): peerd's hierarchical crossover inside one group against
torch.distributed gloo all_reduce with the same number of processes.

  hier       the real path: every process has SnapshotStore + StageStore +
             SegmentServer served by start_exchange_server, and per repeat runs
             publish(round), plan_hierarchical (all N on one host, group_size N:
             one group, so the round is a reduce-scatter + all-gather with no
             partner group) and hierarchical_round over GrpcTransport. Every
             process ends with the exact group mean.
  crossover  for reference: one round of flat crossover among the same N
             processes (plan_round + gossip_round): each pulls one model and
             averages pairwise, so it does NOT compute the group mean.
  gloo       torch.distributed gloo: all_reduce(SUM) then div_(N).

Each method gets N freshly spawned processes (torch.set_num_threads(1)). A
multiprocessing.Barrier starts every repeat; each process times from just
after it to the moment it holds its result, and the repeat's figure is the
slowest process's time. Before every repeat each process resets its vector to
its own starting values (untimed); one warm-up repeat is not counted. After the
last repeat, hier and gloo must hold the mean of the N vectors (checked to
float32 rounding: the order of the sum differs) and all N processes the same
bytes; crossover must have missed no segment.

bench/exchange.py is the 2-process version (with raw TCP); this file is separate
so the two can change independently. Only 127.0.0.1 is bound; gloo's rendezvous
uses file:// and GLOO_SOCKET_IFNAME=lo.

    .venv/bin/python bench/exchange_group.py                       # 4 processes, 64 MiB, 5 repeats
    .venv/bin/python bench/exchange_group.py --procs 4 --mib 16 --methods hier,gloo
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import tempfile
import time

from _harness import GcMeter, collect, quantile, rank_entry, reap, run_main, stop_resource_tracker

METHODS = ("hier", "crossover", "gloo")
BARRIER_TIMEOUT_S = 180.0
JOB = "bench-group"


def _vectors(rank: int, procs: int, numel: int):
    """This rank's initial vector and the mean of all ranks' vectors."""
    import torch

    vs = [torch.randn(numel, generator=torch.Generator().manual_seed(1234 + r)) for r in range(procs)]
    return vs[rank], torch.stack(vs).mean(0)


def _checks(vector) -> dict:
    return {"checksum": float(vector.double().sum()), "head": vector[:4].tolist()}


def _peerd(mode: str, rank: int, cfg: dict, barrier, conn) -> dict:
    import asyncio

    import torch

    from peerd.core.groups import plan_hierarchical
    from peerd.core.segments import split_even
    from peerd.core.topology import plan_round
    from peerd.worker.round.crossover import gossip_round
    from peerd.worker.round.hierarchy import hierarchical_round
    from peerd.worker.round.context import RoundBuffers, RoundContext, RoundInputs
    from peerd.worker.wire.stores import Identity, SegmentServer, SnapshotStore, StageStore
    from peerd.worker.state.pull import StateBoard, StateServer
    from peerd.worker.wire.server import start_exchange_server
    from peerd.worker.wire.transport import GrpcTransport

    numel, segments, procs = cfg["numel"], cfg["segments"], cfg["procs"]
    chunk_elems = cfg["chunk_kib"] * 1024 // 4
    own0, mean = _vectors(rank, procs, numel)
    vector, recv = own0.clone(), torch.empty(numel)
    me = f"p{rank}"
    identity = Identity(JOB, "fp", me)
    layout = split_even(numel, segments)

    async def wait_barrier() -> None:
        await asyncio.to_thread(barrier.wait, BARRIER_TIMEOUT_S)  # the loop keeps serving meanwhile

    async def main() -> dict:
        nonlocal vector
        store, stages = SnapshotStore(numel), StageStore()
        server = SegmentServer(identity, store, segments, chunk_elems, stages)
        state = StateServer(identity, StateBoard(2 * numel, numel), store, chunk_elems)
        grpc_server, address = await start_exchange_server(server, state, "127.0.0.1")
        transport = GrpcTransport(identity)
        ctx = RoundContext(me, layout, transport, stages)
        try:
            conn.send(address)
            if not await asyncio.to_thread(conn.poll, BARRIER_TIMEOUT_S):
                raise TimeoutError("never got the others' addresses")
            addresses = conn.recv()
            localities = {p: ("", "127.0.0.1") for p in addresses}
            times, cpu, gcs, misses, gc_meter = [], [], [], 0, GcMeter()
            for i in range(cfg["warmup"] + cfg["repeats"]):
                vector.copy_(own0)
                await wait_barrier()
                t0, c0, _ = time.perf_counter(), time.process_time(), gc_meter.take()
                round_ = i + 1
                into = await store.hand_over(round_, vector)  # as the worker does with a model on the CPU
                buffers = RoundBuffers(vector, recv, cfg["deadline_s"], into)
                if mode == "hier":
                    plan = plan_hierarchical(JOB, round_, localities, me, segments, procs)
                    result = await hierarchical_round(ctx, RoundInputs(plan, addresses, buffers))
                else:
                    plan = plan_round(JOB, round_, list(addresses), me, segments)
                    result = await gossip_round(ctx, RoundInputs(plan, addresses, buffers))
                vector = into
                t1, c1, gc_s = time.perf_counter(), time.process_time(), gc_meter.take()
                misses += result.misses
                if result.misses:
                    raise RuntimeError(f"round {round_}: {result.misses} fetch(es) missed: {result.errors}")
                if i >= cfg["warmup"]:
                    times.append(t1 - t0)
                    cpu.append(c1 - c0)
                    gcs.append(gc_s)
                await wait_barrier()  # the others may still fetch from this loop
            if mode == "hier":
                torch.testing.assert_close(vector, mean, rtol=1e-5, atol=1e-6)
            out = {"times": times, "cpu": cpu, "gc": gcs, **_checks(vector)}
            await transport.aclose()
            await wait_barrier()  # every channel closed before any server stops
            return out
        finally:
            await transport.aclose()
            await grpc_server.stop(grace=None)

    try:
        import uvloop

        return uvloop.run(main())
    except ImportError:
        return asyncio.run(main())


def _gloo(rank: int, cfg: dict, barrier, conn) -> dict:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    procs = cfg["procs"]
    own0, mean = _vectors(rank, procs, cfg["numel"])
    vector = own0.clone()
    dist.init_process_group("gloo", init_method=f"file://{cfg['gloo_store']}", rank=rank, world_size=procs,
                            timeout=timedelta(seconds=BARRIER_TIMEOUT_S))
    try:
        times, cpu = [], []
        for i in range(cfg["warmup"] + cfg["repeats"]):
            vector.copy_(own0)
            barrier.wait(BARRIER_TIMEOUT_S)
            t0, c0 = time.perf_counter(), time.process_time()
            dist.all_reduce(vector, op=dist.ReduceOp.SUM)
            vector.div_(procs)
            t1, c1 = time.perf_counter(), time.process_time()
            if i >= cfg["warmup"]:
                times.append(t1 - t0)
                cpu.append(c1 - c0)
        torch.testing.assert_close(vector, mean, rtol=1e-5, atol=1e-6)
        barrier.wait(BARRIER_TIMEOUT_S)
        return {"times": times, "cpu": cpu, **_checks(vector)}
    finally:
        dist.destroy_process_group()


def _worker(method: str, rank: int, cfg: dict, barrier, results, conn) -> None:
    """Entry point of a spawned process: report a result dict or the error."""
    if method == "gloo":
        run = lambda: _gloo(rank, cfg, barrier, conn)  # noqa: E731
    else:
        run = lambda: _peerd(method, rank, cfg, barrier, conn)  # noqa: E731
    rank_entry(run, rank, barrier, results, conn)


def run_method(method: str, cfg: dict) -> dict:
    """Spawn the N processes of one method, hand out addresses, collect timings, always reap them."""
    ctx = multiprocessing.get_context("spawn")
    n = cfg["procs"]
    barrier, results = ctx.Barrier(n), ctx.Queue()
    pipes = [ctx.Pipe(duplex=True) for _ in range(n)]
    procs = [ctx.Process(target=_worker, args=(method, r, cfg, barrier, results, pipes[r][1]),
                         name=f"bench-{method}-{r}", daemon=True) for r in range(n)]
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + cfg["method_timeout_s"]
        if method != "gloo":
            addresses = {}
            for r, (parent, _) in enumerate(pipes):
                if not parent.poll(max(0.0, deadline - time.monotonic())):
                    raise TimeoutError(f"{method}: process {r} never reported its address")
                addresses[f"p{r}"] = parent.recv()
            for parent, _ in pipes:
                parent.send(addresses)
        got = collect(method, procs, results, deadline)
    finally:
        reap(procs, [end for pipe in pipes for end in pipe], results)
    if method != "crossover" and len({(g["checksum"], tuple(g["head"])) for g in got.values()}) != 1:
        raise AssertionError(f"{method}: the processes hold different results")
    ranks = [got[r] for r in range(n)]
    return {"times": [max(ts) for ts in zip(*(g["times"] for g in ranks))],
            "cpu": [max(cs) for cs in zip(*(g["cpu"] for g in ranks))],
            "gc": [max(cs) for cs in zip(*(g["gc"] for g in ranks))] if "gc" in ranks[0] else []}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="bench/exchange_group.py", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Time the exchange-and-average of an fp32 vector in a group of N processes on 127.0.0.1: "
        "peerd hierarchical crossover (one group: reduce-scatter + all-gather over gRPC) vs torch.distributed "
        "gloo all_reduce; flat crossover for reference.",
        epilog="Figures are per repeat the slowest process, in ms; ratios are of medians.")
    p.add_argument("--procs", type=int, default=4, help="processes (the group size)")
    p.add_argument("--mib", type=float, default=64, help="vector size in MiB")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats per method")
    p.add_argument("--warmup", type=int, default=1, help="untimed warm-up repeats per method")
    p.add_argument("--segments", type=int, default=8, help="peerd segments (job default 8; a multiple of --procs "
                   "gives every owner the same share)")
    p.add_argument("--chunk-kib", type=int, default=1024, help="peerd chunk size in KiB")
    p.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of: " + ", ".join(METHODS))
    p.add_argument("--deadline-s", type=float, default=90.0, help="peerd deadline per round (hier: a third per stage)")
    args = p.parse_args(argv)
    args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if not args.methods or any(m not in METHODS for m in args.methods):
        p.error(f"--methods: choose from {', '.join(METHODS)}")
    if args.procs < 2 or args.repeats < 1 or args.warmup < 0 or args.segments < 1 or args.mib <= 0:
        p.error("--procs ≥ 2; --repeats, --segments, --mib positive; --warmup ≥ 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    numel = int(args.mib * 1024 * 1024) // 4
    import grpc
    import torch

    with tempfile.TemporaryDirectory(prefix="peerd-bench-") as tmp:
        cfg = {"numel": numel, "procs": args.procs, "repeats": args.repeats, "warmup": args.warmup,
               "segments": args.segments, "chunk_kib": args.chunk_kib, "deadline_s": args.deadline_s,
               "gloo_store": os.path.join(tmp, "gloo-store"),
               "method_timeout_s": 90.0 + (args.repeats + args.warmup) * 60.0}
        print(f"{numel * 4 / 2**20:g} MiB fp32, {args.procs} processes on 127.0.0.1, {args.repeats} repeats + "
              f"{args.warmup} warm-up; peerd: {args.segments} segments, {args.chunk_kib} KiB chunks; "
              f"torch {torch.__version__}, grpcio {grpc.__version__}, {os.cpu_count()} CPUs", flush=True)
        runs = {}
        for method in args.methods:
            t = time.monotonic()
            runs[method] = run_method(method, cfg)
            print(f"  {method}: done in {time.monotonic() - t:.1f} s", flush=True)
    med = {m: statistics.median(r["times"]) for m, r in runs.items()}
    print("\n| method | median ms | p90 ms | min ms | cpu ms (slowest process) | gc ms | × gloo |\n|---|---|---|---|---|---|---|")
    for m, r in runs.items():
        ratio = f"{med[m] / med['gloo']:.2f}" if "gloo" in med else "-"
        gc_ms = f"{statistics.median(r['gc']) * 1e3:.0f}" if r["gc"] else "-"
        print(f"| {m} | {med[m] * 1e3:.1f} | {quantile(r['times'], 0.9) * 1e3:.1f} | {min(r['times']) * 1e3:.1f} "
              f"| {statistics.median(r['cpu']) * 1e3:.0f} | {gc_ms} | {ratio} |")
    return 0


if __name__ == "__main__":
    run_main(main, after=stop_resource_tracker)
