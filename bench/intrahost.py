#!/usr/bin/env python
"""The intra-host tier against the bulk lane: N CPU worker processes of one daemon
averaging a model (their group stage), for N = 2 and 4, in one invocation.

  intrahost  the tier (peerd.worker.intrahost.group, intrahost_round): every process holds an
             IntraHostGroup formed from a Rendezvous under a temp "job directory"
             (FileStore, gloo on 127.0.0.1), and per repeat runs hand_over(round),
             plan_hierarchical (all N on one daemon, group_size N: one group) and
             intrahost_round: an all_gather of (round, plan key) to agree, then
             all_reduce(SUM) / N into the new state. Every process ends with
             the exact group mean.
  hier       today's path, measured exactly as bench/exchange_group.py does
             (its run_method): SnapshotStore + StageStore + SegmentServer on
             start_exchange_server, hierarchical_round over GrpcTransport, segments
             over the bulk lane (reduce-scatter + all-gather between the processes).
  gloo       for reference, the floor: a bare gloo all_reduce(SUM) then div_(N)
             (bench/exchange_group.py's gloo).

Timing is bench/exchange_group.py's: fresh processes per method and N
(torch.set_num_threads(1)), a multiprocessing.Barrier before every repeat, each
process times from the barrier to holding its result, a repeat's figure is the
slowest process; vectors reset before each repeat (untimed); one warm-up repeat.
intrahost and hier are checked to hold the exact mean on every process.

    .venv/bin/python bench/intrahost.py                      # 2 and 4 processes, 64 MiB, 5 repeats
    .venv/bin/python bench/intrahost.py --procs 2,4 --mib 16 --methods intrahost,hier
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import exchange_group  # noqa: E402  (bench/exchange_group.py: the bulk-lane group method and the harness figures)
from _harness import collect, reap  # noqa: E402

METHODS = ("intrahost", "hier", "gloo")
JOB = "bench-intrahost"


def _intrahost(rank: int, cfg: dict, barrier) -> dict:
    import asyncio

    import torch

    from peerd.core.groups import plan_hierarchical
    from peerd.core.intrahost import IntraHostSlot
    from peerd.core.segments import split_even
    from peerd.worker.intrahost.group import IntraHostGroup
    from peerd.worker.intrahost.round import intrahost_round
    from peerd.worker.round.context import RoundBuffers, RoundContext, RoundInputs
    from peerd.worker.wire.stores import Identity, SnapshotStore, StageStore
    from peerd.worker.wire.transport import MemoryTransport

    procs, numel, segments = cfg["procs"], cfg["numel"], cfg["segments"]
    own0, mean = exchange_group._vectors(rank, procs, numel)
    me = f"d.{rank}"  # the daemon's workers: "<peer_id>.<k>"
    localities = {f"d.{k}": ("", "127.0.0.1", "d") for k in range(procs)}
    layout = split_even(numel, segments)

    async def main() -> dict:
        group = IntraHostGroup(IntraHostSlot(cfg["rendezvous"], rank, procs), torch.device("cpu"), me,
                               timeout_s=exchange_group.BARRIER_TIMEOUT_S)
        try:
            while group.state.formed is None:  # the daemon wrote generation 1: form it, in round 0
                group.poll(0)
                await asyncio.sleep(0.05)
            store, stages = SnapshotStore(numel), StageStore()
            transport = MemoryTransport(Identity(JOB, "fp", me), {})  # one group: nothing crosses hosts
            ctx = RoundContext(me, layout, transport, stages, intrahost=group)
            vector, recv = own0.clone(), torch.empty(numel)
            times, cpu = [], []
            for i in range(cfg["warmup"] + cfg["repeats"]):
                vector.copy_(own0)
                await asyncio.to_thread(barrier.wait, exchange_group.BARRIER_TIMEOUT_S)
                t0, c0 = time.perf_counter(), time.process_time()
                round_ = group.state.start + i  # the group is used from its start round
                into = await store.hand_over(round_, vector)  # as the worker does with a model on the CPU
                plan = plan_hierarchical(JOB, round_, localities, me, segments, procs)
                buffers = RoundBuffers(vector, recv, cfg["deadline_s"], into)
                result = await intrahost_round(ctx, RoundInputs(plan, {}, buffers))
                if result is None:
                    raise RuntimeError(f"round {round_}: the intra-host group was not used")
                vector = into
                t1, c1 = time.perf_counter(), time.process_time()
                if i >= cfg["warmup"]:
                    times.append(t1 - t0)
                    cpu.append(c1 - c0)
            torch.testing.assert_close(vector, mean, rtol=1e-5, atol=1e-6)
            await asyncio.to_thread(barrier.wait, exchange_group.BARRIER_TIMEOUT_S)
            return {"times": times, "cpu": cpu, **exchange_group._checks(vector)}
        finally:
            await group.aclose()

    return asyncio.run(main())


def _worker(rank: int, cfg: dict, barrier, results) -> None:
    try:
        import torch

        torch.set_num_threads(1)
        results.put({"rank": rank, "ok": True, **_intrahost(rank, cfg, barrier)})
    except Exception:
        barrier.abort()
        results.put({"rank": rank, "ok": False, "error": traceback.format_exc()})


def run_intrahost(cfg: dict) -> dict:
    """N processes with the daemon's rendezvous; always reaped."""
    from peerd.rendezvous import Rendezvous

    rendezvous = Rendezvous(Path(cfg["tmp"]) / f"job-{cfg['procs']}", cfg["procs"])
    rendezvous.bump()  # as the daemon does before it starts the workers
    cfg = {**cfg, "rendezvous": str(rendezvous.directory)}
    ctx = multiprocessing.get_context("spawn")
    n = cfg["procs"]
    barrier, results = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, cfg, barrier, results), name=f"bench-intrahost-{r}", daemon=True)
             for r in range(n)]
    try:
        for p in procs:
            p.start()
        got = collect("intrahost", procs, results, time.monotonic() + cfg["method_timeout_s"])
    finally:
        reap(procs, [], results)
    if len({(g["checksum"], tuple(g["head"])) for g in got.values()}) != 1:
        raise AssertionError("intrahost: the processes hold different results")
    ranks = [got[r] for r in range(n)]
    return {"times": [max(ts) for ts in zip(*(g["times"] for g in ranks))],
            "cpu": [max(cs) for cs in zip(*(g["cpu"] for g in ranks))]}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="bench/intrahost.py", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="N CPU worker processes of one daemon averaging a vector: the intra-host tier (gloo) vs the "
        "bulk lane (hierarchical_round), for each N in --procs.",
        epilog="Figures are per repeat the slowest process, in ms; ratios are of medians.")
    p.add_argument("--procs", default="2,4", help="comma-separated process counts")
    p.add_argument("--mib", type=float, default=64, help="vector size in MiB")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats per method")
    p.add_argument("--warmup", type=int, default=1, help="untimed warm-up repeats per method")
    p.add_argument("--segments", type=int, default=8, help="peerd segments (job default 8)")
    p.add_argument("--chunk-kib", type=int, default=1024, help="peerd chunk size in KiB (hier)")
    p.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of: " + ", ".join(METHODS))
    p.add_argument("--deadline-s", type=float, default=90.0, help="deadline per round")
    args = p.parse_args(argv)
    args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    try:
        args.procs = [int(n) for n in args.procs.split(",")]
    except ValueError:
        p.error("--procs: whole numbers separated by commas")
    if not args.methods or any(m not in METHODS for m in args.methods):
        p.error(f"--methods: choose from {', '.join(METHODS)}")
    if any(n < 2 for n in args.procs) or args.repeats < 1 or args.warmup < 0 or args.mib <= 0:
        p.error("--procs each ≥ 2; --repeats, --mib positive; --warmup ≥ 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    numel = int(args.mib * 1024 * 1024) // 4
    import torch

    rows = []
    with tempfile.TemporaryDirectory(prefix="peerd-bench-") as tmp:
        print(f"{numel * 4 / 2**20:g} MiB fp32, {args.procs} processes on 127.0.0.1, {args.repeats} repeats + "
              f"{args.warmup} warm-up, {args.segments} segments; torch {torch.__version__}, {os.cpu_count()} CPUs",
              flush=True)
        for n in args.procs:
            cfg = {"numel": numel, "procs": n, "repeats": args.repeats, "warmup": args.warmup,
                   "segments": args.segments, "chunk_kib": args.chunk_kib, "deadline_s": args.deadline_s,
                   "gloo_store": os.path.join(tmp, f"gloo-store-{n}"), "tmp": tmp,
                   "method_timeout_s": 90.0 + (args.repeats + args.warmup) * 60.0}
            runs = {}
            for method in args.methods:
                t = time.monotonic()
                runs[method] = run_intrahost(cfg) if method == "intrahost" else exchange_group.run_method(method, cfg)
                print(f"  {n} processes, {method}: done in {time.monotonic() - t:.1f} s", flush=True)
            rows.append((n, runs))
    print("\n| processes | method | median ms | p90 ms | min ms | cpu ms (slowest process) | × hier (bulk lane) |")
    print("|---|---|---|---|---|---|---|")
    for n, runs in rows:
        med = {m: statistics.median(r["times"]) for m, r in runs.items()}
        for m, r in runs.items():
            ratio = f"{med[m] / med['hier']:.2f}" if "hier" in med else "-"
            print(f"| {n} | {m} | {med[m] * 1e3:.1f} | {exchange_group.quantile(r['times'], 0.9) * 1e3:.1f} "
                  f"| {min(r['times']) * 1e3:.1f} | {statistics.median(r['cpu']) * 1e3:.0f} | {ratio} |")
    return 0


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        code = main()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        code = 130
    sys.exit(code)
