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

import functools
import os
import statistics
import tempfile

from harness.exchange import ExchangePeer, grpc_rounds
from harness.output import md_table, ratio, timing_cells
from harness.ranks import (
    Rank, RepeatClock, checks, gloo_average, rank_vectors, run_loop, run_ranks, same_result, slowest,
    stop_resource_tracker,
)
from harness.script import arg_parser, each_timed, names, run_main

METHODS = ("hier", "crossover", "gloo")
BARRIER_TIMEOUT_S = 180.0
JOB = "bench-group"


def _mean_checked(vector, mean) -> dict:
    """The group mean to float32 rounding (the order of the sum differs)."""
    import torch.testing

    torch.testing.assert_close(vector, mean, rtol=1e-5, atol=1e-6)
    return checks(vector)


def _peerd(mode: str, cfg: dict, me: Rank) -> dict:
    """One rank of hier or crossover: the worker's round over GrpcTransport."""
    from peerd.core.groups import plan_hierarchical
    from peerd.core.topology import plan_round
    from peerd.worker.round.crossover import gossip_round
    from peerd.worker.round.hierarchy import hierarchical_round

    segments, procs = cfg["segments"], cfg["procs"]
    own0, mean = rank_vectors(me.rank, procs, cfg["numel"])
    peer = ExchangePeer(JOB, f"p{me.rank}", cfg["numel"], segments, cfg["chunk_kib"] * 1024 // 4)
    clock = RepeatClock(cfg["warmup"], gc=True)

    def rounds(ctx, addresses: dict[str, str]):
        localities = {p: ("", "127.0.0.1") for p in addresses}

        async def one_round(round_: int, vector):
            into = await peer.store.hand_over(round_, vector)  # as the worker does with a model on the CPU
            if mode == "hier":
                plan = plan_hierarchical(JOB, round_, localities, peer.me, segments, procs)
                return await hierarchical_round(ctx, peer.inputs(plan, addresses, vector, cfg["deadline_s"], into)), into
            plan = plan_round(JOB, round_, list(addresses), peer.me, segments)
            return await gossip_round(ctx, peer.inputs(plan, addresses, vector, cfg["deadline_s"], into)), into

        return one_round

    vector = run_loop(lambda: grpc_rounds(peer, me, cfg, rounds, clock, own0.clone()))
    checked = _mean_checked(vector, mean) if mode == "hier" else checks(vector)
    return {**clock.report(), **checked}


def _entry(method: str, cfg: dict):
    """What each rank of `method` runs."""
    if method == "gloo":
        return functools.partial(gloo_average, cfg=cfg, verify=_mean_checked)
    return functools.partial(_peerd, method, cfg)


def run_method(method: str, cfg: dict) -> dict:
    """The N processes of one method, their timings (per repeat the slowest process's)."""
    ranks = run_ranks(method, cfg["procs"], _entry(method, cfg), cfg["method_timeout_s"], share=method != "gloo")
    if method != "crossover":
        same_result(method, ranks)
    return {"times": slowest(ranks, "times"), "cpu": slowest(ranks, "cpu"), "gc": slowest(ranks, "gc")}


def parse_args(argv: list[str] | None = None):
    p = arg_parser(
        __doc__, defaults=True, prog="bench/exchange_group.py",
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
    args.methods = names(p, args.methods, METHODS, "--methods")
    if args.procs < 2 or args.repeats < 1 or args.warmup < 0 or args.segments < 1 or args.mib <= 0:
        p.error("--procs ≥ 2; --repeats, --segments, --mib positive; --warmup ≥ 0")
    return args


def group_cfg(args, procs: int, tmp: str) -> dict:
    """What every rank of a group of `procs` gets (bench/intrahost.py's groups too)."""
    return {"numel": int(args.mib * 1024 * 1024) // 4, "procs": procs, "repeats": args.repeats,
            "warmup": args.warmup, "segments": args.segments, "chunk_kib": args.chunk_kib,
            "deadline_s": args.deadline_s, "gloo_store": os.path.join(tmp, f"gloo-store-{procs}"), "tmp": tmp,
            "barrier_s": BARRIER_TIMEOUT_S, "method_timeout_s": 90.0 + (args.repeats + args.warmup) * 60.0}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import grpc
    import torch

    with tempfile.TemporaryDirectory(prefix="peerd-bench-") as tmp:
        cfg = group_cfg(args, args.procs, tmp)
        print(f"{cfg['numel'] * 4 / 2**20:g} MiB fp32, {args.procs} processes on 127.0.0.1, {args.repeats} repeats + "
              f"{args.warmup} warm-up; peerd: {args.segments} segments, {args.chunk_kib} KiB chunks; "
              f"torch {torch.__version__}, grpcio {grpc.__version__}, {os.cpu_count()} CPUs", flush=True)
        runs = each_timed(args.methods, lambda m: run_method(m, cfg))
    med = {m: statistics.median(r["times"]) for m, r in runs.items()}
    print()
    print(md_table(["method", "median ms", "p90 ms", "min ms", "cpu ms (slowest process)", "gc ms", "× gloo"], (
        [m, *timing_cells(r["times"]), f"{statistics.median(r['cpu']) * 1e3:.0f}",
         f"{statistics.median(r['gc']) * 1e3:.0f}" if r["gc"] else "-", ratio(med, m, "gloo")]
        for m, r in runs.items())))
    return 0


if __name__ == "__main__":
    run_main(main, after=stop_resource_tracker)
