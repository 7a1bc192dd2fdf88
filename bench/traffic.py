#!/usr/bin/env python
"""Traffic per peer per round: bytes each peer actually receives and sends in
real gossip rounds, for whole-model gossip, flat crossover and hierarchical
crossover, with 2, 4 and 8 workers in one process.

Every worker has the real exchange pieces (SnapshotStore, StageStore,
SegmentServer) and fetches through the real transports (MemoryTransport, or
GrpcTransport on 127.0.0.1:0 with --grpc), counted as the worker counts its
traffic (peerd.worker.wire.traffic): a fetch adds the bytes of the segment it
filled (elements × the wire's bytes per value) to the fetcher's "received",
and the serving peer's segment server adds what it streamed to its "sent".
That is the payload; the chunk headers (a few dozen bytes per 1 MiB chunk) and
HTTP/2 framing are not counted.

    .venv/bin/python bench/traffic.py                 # the example model, in memory (seconds)
    .venv/bin/python bench/traffic.py --grpc          # the same over gRPC on 127.0.0.1
    .venv/bin/python bench/traffic.py --numel 1000000 --segments 8 --rounds 5

tests/tools/test_gossip_traffic.py asserts the figures (exactly one model per peer per round
for crossover whatever the number of peers; 2 − 1/|G| for hierarchical groups).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
from dataclasses import dataclass

import torch

from harness.exchange import ExchangePeer
from harness.output import md_row, md_table
from harness.script import arg_parser, numbers, run_main
from peerd.core.groups import plan_hierarchical
from peerd.core.topology import plan_round
from peerd.worker.round.crossover import gossip_round
from peerd.worker.round.hierarchy import hierarchical_round
from peerd.worker.round.shared import RoundResult
from peerd.worker.wire.traffic import CountingTransport, Traffic
from peerd.worker.wire.transport import GrpcTransport, MemoryTransport

WIRE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
JOB = "traffic"


@dataclass(frozen=True)
class Setup:
    mode: str  # "crossover" | "whole" | "hierarchical"
    peers: int
    numel: int
    segments: int = 8
    group_size: int = 4
    wire: str = "fp32"
    racks: tuple[str, ...] = ()  # one rack label per peer; default: half rack-a, half rack-b

    @property
    def layout_segments(self) -> int:
        return 1 if self.mode == "whole" else self.segments

    def localities(self) -> dict[str, tuple[str, str]]:
        """(rack, host) per peer, every peer on one host, as in a LocalCluster."""
        racks = self.racks or tuple("rack-a" if k < (self.peers + 1) // 2 else "rack-b" for k in range(self.peers))
        return {p: (rack, "127.0.0.1") for p, rack in zip(peer_ids(self.peers), racks, strict=True)}


def peer_ids(n: int) -> list[str]:
    return [f"peer-{k}" for k in range(n)]


class Worker(ExchangePeer):
    """One worker's exchange pieces and vector, its bytes counted in `traffic`."""

    def __init__(self, me: str, setup: Setup, vector: torch.Tensor) -> None:
        self.traffic = Traffic()
        super().__init__(JOB, me, setup.numel, setup.layout_segments, wire=setup.wire, traffic=self.traffic)
        self.setup, self.vector = setup, vector

    async def round(self, round_: int, addresses: dict[str, str], transport, deadline_s: float) -> RoundResult:
        await self.store.publish(round_, self.vector)
        s, ctx = self.setup, self.context(transport)
        if s.mode == "hierarchical":
            plan = plan_hierarchical(JOB, round_, s.localities(), self.me, len(self.layout), s.group_size)
            return await hierarchical_round(ctx, self.inputs(plan, addresses, self.vector, deadline_s))
        plan = plan_round(JOB, round_, sorted(addresses), self.me, len(self.layout))
        return await gossip_round(ctx, self.inputs(plan, addresses, self.vector, deadline_s))


@dataclass
class Measured:
    """Bytes per peer, per round, of `rounds` rounds."""

    setup: Setup
    rounds: int
    received: list[dict[str, int]]  # per round: peer -> bytes
    sent: list[dict[str, int]]
    misses: int

    @property
    def model_bytes(self) -> int:
        return self.setup.numel * WIRE_BYTES[self.setup.wire]


async def _transports(workers: dict[str, Worker], setup: Setup, grpc: bool) -> tuple[dict, dict]:
    """Each worker's address (served over gRPC, or a name in memory) and its counting transport."""
    if grpc:
        addresses = {p: await w.serve() for p, w in workers.items()}
    else:
        addresses = {p: f"mem-{p}" for p in workers}
    by_address = {a: workers[p].server for p, a in addresses.items()}
    return addresses, {p: CountingTransport(GrpcTransport(w.identity, wire=setup.wire) if grpc else
                                            MemoryTransport(w.identity, by_address, wire=setup.wire), w.traffic,
                                            setup.wire)
                       for p, w in workers.items()}


async def measure(setup: Setup, rounds: int = 3, grpc: bool = False, deadline_s: float = 30.0) -> Measured:
    """Run `rounds` real rounds among setup.peers workers; count each round's bytes."""
    gen = torch.Generator().manual_seed(0)
    workers = {p: Worker(p, setup, torch.randn(setup.numel, generator=gen)) for p in peer_ids(setup.peers)}
    received_rounds, sent_rounds, misses, transports = [], [], 0, {}
    try:
        addresses, transports = await _transports(workers, setup, grpc)
        for r in range(1, rounds + 1):
            before = {p: (w.traffic.received, w.traffic.sent) for p, w in workers.items()}
            results = await asyncio.gather(*(w.round(r, addresses, transports[p], deadline_s)
                                             for p, w in workers.items()))
            misses += sum(res.misses for res in results)
            received_rounds.append({p: w.traffic.received - before[p][0] for p, w in workers.items()})
            sent_rounds.append({p: w.traffic.sent - before[p][1] for p, w in workers.items()})
    finally:
        await asyncio.gather(*(t.aclose() for t in transports.values()))
        await asyncio.gather(*(w.stop() for w in workers.values()))
    return Measured(setup, rounds, received_rounds, sent_rounds, misses)


def expected_models(setup: Setup) -> float:
    """Model sizes each peer receives per round, from docs/algorithms.md, when
    every group's owners hold equal shares (segments a multiple of |G|)."""
    if setup.mode != "hierarchical":
        return 1.0
    groups = plan_hierarchical(JOB, 1, setup.localities(), "peer-0", setup.segments, setup.group_size).groups
    g = len(groups[0])
    if any(len(x) != g for x in groups):
        return float("nan")
    return 2 * (g - 1) / g + (1 / g if len(groups) > 1 else 0.0)


def _label(setup: Setup) -> str:
    if setup.mode == "hierarchical":
        return f"hierarchical, group_size {setup.group_size}"
    return {"crossover": "flat crossover", "whole": "whole model"}[setup.mode] + (
        "" if setup.wire == "fp32" else f", {setup.wire}")


def parse_args(argv: list[str] | None = None):
    p = arg_parser(__doc__, defaults=True)
    p.add_argument("--numel", type=int, default=0,
                   help="model size in fp32 values (0: the example job's model, peerd/examples/mnist.py)")
    p.add_argument("--segments", type=int, default=8, help="gossip.segments")
    p.add_argument("--peers", default="2,4,8", help="comma-separated numbers of workers")
    p.add_argument("--rounds", type=int, default=3, help="rounds measured per case")
    p.add_argument("--grpc", action="store_true", help="fetch over GrpcTransport on 127.0.0.1 instead of in memory")
    args = p.parse_args(argv)
    args.peers = numbers(p, args.peers, int, "--peers")
    if any(n < 2 for n in args.peers) or args.rounds < 1 or args.segments < 1:
        p.error("--peers must all be ≥ 2, --rounds and --segments ≥ 1")
    if args.numel == 0:
        from peerd.examples.mnist import make_model

        args.numel = sum(t.numel() for t in make_model().parameters())
    if args.numel < args.segments:
        p.error("--numel must be at least --segments")
    return args


def _row(setup: Setup, t: Measured) -> list[str]:
    """A case's line: the bytes per peer per round as fp32 model sizes (bf16 shows as 0.5)."""
    unit = setup.numel * 4
    recv = [b / unit for rnd in t.received for b in rnd.values()]
    sent = [b / unit for rnd in t.sent for b in rnd.values()]
    groups = "-"
    if setup.mode == "hierarchical":
        plan = plan_hierarchical(JOB, 1, setup.localities(), "peer-0", setup.segments, setup.group_size)
        groups = "+".join(str(len(x)) for x in plan.groups)
    exp = expected_models(setup) * WIRE_BYTES[setup.wire] / 4
    return [_label(setup), str(setup.peers), groups, f"{statistics.fmean(recv):.4f} ({min(recv):.4f}–{max(recv):.4f})",
            f"{statistics.fmean(sent):.4f} ({min(sent):.4f}–{max(sent):.4f})", f"{exp:.4f}"]


async def amain(args) -> int:
    torch.set_num_threads(1)
    cases = [("crossover", 4, "fp32"), ("whole", 4, "fp32"), ("crossover", 4, "bf16"),
             ("hierarchical", 2, "fp32"), ("hierarchical", 4, "fp32"), ("hierarchical", 8, "fp32")]
    print(f"model: {args.numel} fp32 values = {args.numel * 4} bytes; {args.segments} segments; "
          f"{'gRPC on 127.0.0.1' if args.grpc else 'in memory'}; {args.rounds} rounds per case\n")
    print(md_table(["gossip", "peers", "groups", "received per peer per round, model sizes: mean (min–max)",
                    "sent, mean (min–max)", "expected (docs/algorithms.md)"]))
    failed = False
    for mode, g, wire in cases:
        for n in args.peers:
            setup = Setup(mode, n, args.numel, args.segments, g, wire)
            t = await measure(setup, args.rounds, args.grpc)
            failed |= t.misses > 0
            print(md_row(_row(setup, t)), flush=True)
    if failed:
        print("\nsome fetches missed their deadline: the figures above are incomplete", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(amain(parse_args(argv)))


if __name__ == "__main__":
    run_main(main)
