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

import functools
import os
import statistics
import tempfile
from pathlib import Path

import exchange_group  # bench/exchange_group.py: the bulk-lane group method, the gloo floor, the rank settings
from harness.exchange import ExchangePeer, timed_rounds
from harness.output import md_table, ratio, timing_cells
from harness.ranks import (
    Rank, RepeatClock, checks, rank_vectors, run_ranks, same_result, slowest, stop_resource_tracker,
)
from harness.script import arg_parser, each_timed, names, numbers, run_main

METHODS = ("intrahost", "hier", "gloo")
JOB = "bench-intrahost"


def _intrahost(cfg: dict, me: Rank) -> dict:
    """One worker of the group: its group stage on the intra-host tier, every repeat."""
    import asyncio

    import torch

    from peerd.core.groups import plan_hierarchical
    from peerd.core.intrahost import IntraHostSlot
    from peerd.worker.intrahost.group import IntraHostGroup
    from peerd.worker.intrahost.round import intrahost_round
    from peerd.worker.wire.transport import MemoryTransport

    procs, segments = cfg["procs"], cfg["segments"]
    own0, mean = rank_vectors(me.rank, procs, cfg["numel"])
    peer = ExchangePeer(JOB, f"d.{me.rank}", cfg["numel"], segments)  # the daemon's workers: "<peer_id>.<k>"
    localities = {f"d.{k}": ("", "127.0.0.1", "d") for k in range(procs)}
    clock = RepeatClock(cfg["warmup"])

    async def main():
        group = IntraHostGroup(IntraHostSlot(cfg["rendezvous"], me.rank, procs), torch.device("cpu"), peer.me,
                               timeout_s=cfg["barrier_s"])
        try:
            while group.state.formed is None:  # the daemon wrote generation 1: form it, in round 0
                group.poll(0)
                await asyncio.sleep(0.05)
            ctx = peer.context(MemoryTransport(peer.identity, {}), intrahost=group)  # one group: nothing crosses hosts

            async def one_round(i: int, vector):
                round_ = group.state.start + i - 1  # the group is used from its start round
                into = await peer.store.hand_over(round_, vector)  # as the worker does with a model on the CPU
                plan = plan_hierarchical(JOB, round_, localities, peer.me, segments, procs)
                result = await intrahost_round(ctx, peer.inputs(plan, {}, vector, cfg["deadline_s"], into))
                if result is None:
                    raise RuntimeError(f"round {round_}: the intra-host group was not used")
                return result, into

            return await timed_rounds(me, cfg, own0.clone(), one_round, clock)
        finally:
            await group.aclose()

    vector = asyncio.run(main())
    torch.testing.assert_close(vector, mean, rtol=1e-5, atol=1e-6)
    return {**clock.report(), **checks(vector)}


def run_intrahost(cfg: dict) -> dict:
    """N processes with the daemon's rendezvous."""
    from peerd.control.rendezvous import Rendezvous

    rendezvous = Rendezvous(Path(cfg["tmp"]) / f"job-{cfg['procs']}", cfg["procs"])
    rendezvous.bump()  # as the daemon does before it starts the workers
    cfg = {**cfg, "rendezvous": str(rendezvous.directory)}
    ranks = run_ranks("intrahost", cfg["procs"], functools.partial(_intrahost, cfg), cfg["method_timeout_s"])
    same_result("intrahost", ranks)
    return {"times": slowest(ranks, "times"), "cpu": slowest(ranks, "cpu")}


def parse_args(argv: list[str] | None = None):
    p = arg_parser(
        __doc__, defaults=True, prog="bench/intrahost.py",
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
    args.methods = names(p, args.methods, METHODS, "--methods")
    args.procs = numbers(p, args.procs, int, "--procs")
    if any(n < 2 for n in args.procs) or args.repeats < 1 or args.warmup < 0 or args.mib <= 0:
        p.error("--procs each ≥ 2; --repeats, --mib positive; --warmup ≥ 0")
    return args


def run_group(args, n: int, tmp: str) -> dict[str, dict]:
    """Every method with n processes."""
    cfg = exchange_group.group_cfg(args, n, tmp)
    return each_timed(args.methods, lambda m: run_intrahost(cfg) if m == "intrahost" else
                      exchange_group.run_method(m, cfg), label=lambda m: f"{n} processes, {m}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    numel = int(args.mib * 1024 * 1024) // 4
    import torch

    with tempfile.TemporaryDirectory(prefix="peerd-bench-") as tmp:
        print(f"{numel * 4 / 2**20:g} MiB fp32, {args.procs} processes on 127.0.0.1, "
              f"{args.repeats} repeats + {args.warmup} warm-up, {args.segments} segments; torch {torch.__version__}, "
              f"{os.cpu_count()} CPUs", flush=True)
        rows = [(n, run_group(args, n, tmp)) for n in args.procs]
    print()
    print(md_table(["processes", "method", "median ms", "p90 ms", "min ms", "cpu ms (slowest process)",
                    "× hier (bulk lane)"], _rows(rows)))
    return 0


def _rows(rows: list[tuple[int, dict]]):
    for n, runs in rows:
        med = {m: statistics.median(r["times"]) for m, r in runs.items()}
        for m, r in runs.items():
            yield [n, m, *timing_cells(r["times"]), f"{statistics.median(r['cpu']) * 1e3:.0f}", ratio(med, m, "hier")]


if __name__ == "__main__":
    run_main(main, after=stop_resource_tracker)
