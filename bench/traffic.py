#!/usr/bin/env python
"""Traffic per peer per round: bytes each peer actually receives and sends in
real gossip rounds, for whole-model gossip, flat crossover and hierarchical
crossover, with 2, 4 and 8 workers in one process.

Every worker has the real exchange pieces (SnapshotStore, StageStore,
SegmentServer) and fetches through the real transports (MemoryTransport, or
GrpcTransport on 127.0.0.1:0 with --grpc), wrapped in CountingTransport: a
fetch that succeeds adds the bytes of the segment it filled (elements × the
wire's bytes per value) to the fetcher's "received" and to the serving peer's
"sent". That is the payload; the chunk headers (a few dozen bytes per 1 MiB
chunk) and HTTP/2 framing are not counted.

    .venv/bin/python bench/traffic.py                 # the example model, in memory (seconds)
    .venv/bin/python bench/traffic.py --grpc          # the same over gRPC on 127.0.0.1
    .venv/bin/python bench/traffic.py --numel 1000000 --segments 8 --rounds 5

tests/tools/test_gossip_traffic.py asserts the figures (exactly one model per peer per round
for crossover whatever the number of peers; 2 − 1/|G| for hierarchical groups).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from peerd.core.groups import plan_hierarchical  # noqa: E402
from peerd.core.segments import split_even  # noqa: E402
from peerd.core.topology import plan_round  # noqa: E402
from peerd.worker.round.crossover import RoundResult, gossip_round  # noqa: E402
from peerd.worker.round.hierarchy import hierarchical_round  # noqa: E402
from peerd.worker.round.context import RoundBuffers, RoundContext, RoundInputs  # noqa: E402
from peerd.worker.wire.stores import Identity, SegmentServer, SnapshotStore, StageStore  # noqa: E402
from peerd.worker.state.pull import StateBoard, StateServer  # noqa: E402
from peerd.worker.wire.server import start_exchange_server  # noqa: E402
from peerd.worker.wire.transport import GrpcTransport, MemoryTransport  # noqa: E402

WIRE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
JOB = "traffic"
CHUNK_ELEMS = 262_144  # the job default, chunk_kib = 1024


class CountingTransport:
    """A Transport that counts the bytes of every segment it filled, for the
    fetcher (`me`) and for the peer it fetched from (looked up by address)."""

    def __init__(self, inner, me: str, peer_at: dict[str, str], wire: str,
                 received: Counter, sent: Counter) -> None:
        self._inner = inner
        self._me = me
        self._peer_at = peer_at
        self._itemsize = WIRE_BYTES[wire]
        self._received = received
        self._sent = sent

    async def fetch_segment(self, address, round_, segment, out, timeout, stage=0) -> None:
        await self._inner.fetch_segment(address, round_, segment, out, timeout, stage)
        n = out.numel() * self._itemsize
        self._received[self._me] += n
        self._sent[self._peer_at[address]] += n

    async def fetch_state(self, address, span, timeout):
        return await self._inner.fetch_state(address, span, timeout)

    async def aclose(self) -> None:
        await self._inner.aclose()


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


@dataclass
class Worker:
    """One worker's exchange pieces, as peerd.worker.main.Worker has them."""

    id: str
    setup: Setup
    vector: torch.Tensor
    store: SnapshotStore = field(init=False)
    stages: StageStore = field(init=False)
    server: SegmentServer = field(init=False)

    def __post_init__(self) -> None:
        self.identity = Identity(JOB, "fp", self.id)
        self.store = SnapshotStore(self.setup.numel)
        self.stages = StageStore()
        self.server = SegmentServer(self.identity, self.store, self.setup.layout_segments, CHUNK_ELEMS,
                                    self.stages, self.setup.wire)
        self.layout = split_even(self.setup.numel, self.setup.layout_segments)
        self.recv = torch.empty(self.setup.numel)

    async def round(self, round_: int, addresses: dict[str, str], transport, deadline_s: float) -> RoundResult:
        await self.store.publish(round_, self.vector)
        s = self.setup
        ctx = RoundContext(self.id, self.layout, transport, self.stages)
        buffers = RoundBuffers(self.vector, self.recv, deadline_s)
        if s.mode == "hierarchical":
            plan = plan_hierarchical(JOB, round_, s.localities(), self.id, len(self.layout), s.group_size)
            return await hierarchical_round(ctx, RoundInputs(plan, addresses, buffers))
        plan = plan_round(JOB, round_, sorted(addresses), self.id, len(self.layout))
        return await gossip_round(ctx, RoundInputs(plan, addresses, buffers))


@dataclass
class Traffic:
    """Bytes per peer, per round, of `rounds` rounds."""

    setup: Setup
    rounds: int
    received: list[dict[str, int]]  # per round: peer -> bytes
    sent: list[dict[str, int]]
    misses: int

    @property
    def model_bytes(self) -> int:
        return self.setup.numel * WIRE_BYTES[self.setup.wire]


async def measure(setup: Setup, rounds: int = 3, grpc: bool = False, deadline_s: float = 30.0) -> Traffic:
    """Run `rounds` real rounds among setup.peers workers; count each round's bytes."""
    gen = torch.Generator().manual_seed(0)
    workers = {p: Worker(p, setup, torch.randn(setup.numel, generator=gen)) for p in peer_ids(setup.peers)}
    servers, addresses = [], {}
    if grpc:
        for p, w in workers.items():
            state = StateServer(w.identity, StateBoard(2 * setup.numel, setup.numel), w.store, CHUNK_ELEMS)
            server, addresses[p] = await start_exchange_server(w.server, state, "127.0.0.1")
            servers.append(server)
    else:
        addresses = {p: f"mem-{p}" for p in workers}
    by_address = {a: workers[p].server for p, a in addresses.items()}
    peer_at = {a: p for p, a in addresses.items()}
    inner = {p: GrpcTransport(w.identity, wire=setup.wire) if grpc else MemoryTransport(w.identity, by_address, wire=setup.wire)
             for p, w in workers.items()}
    received_rounds, sent_rounds, misses = [], [], 0
    try:
        for r in range(1, rounds + 1):
            received, sent = Counter(), Counter()
            transports = {p: CountingTransport(inner[p], p, peer_at, setup.wire, received, sent) for p in workers}
            results = await asyncio.gather(*(w.round(r, addresses, transports[p], deadline_s)
                                             for p, w in workers.items()))
            misses += sum(res.misses for res in results)
            received_rounds.append({p: received[p] for p in workers})
            sent_rounds.append({p: sent[p] for p in workers})
    finally:
        await asyncio.gather(*(t.aclose() for t in inner.values()))
        await asyncio.gather(*(s.stop(None) for s in servers))
    return Traffic(setup, rounds, received_rounds, sent_rounds, misses)


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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--numel", type=int, default=0,
                   help="model size in fp32 values (0: the example job's model, peerd/examples/mnist.py)")
    p.add_argument("--segments", type=int, default=8, help="gossip.segments")
    p.add_argument("--peers", default="2,4,8", help="comma-separated numbers of workers")
    p.add_argument("--rounds", type=int, default=3, help="rounds measured per case")
    p.add_argument("--grpc", action="store_true", help="fetch over GrpcTransport on 127.0.0.1 instead of in memory")
    args = p.parse_args(argv)
    args.peers = [int(x) for x in args.peers.split(",") if x.strip()]
    if any(n < 2 for n in args.peers) or args.rounds < 1 or args.segments < 1:
        p.error("--peers must all be ≥ 2, --rounds and --segments ≥ 1")
    if args.numel == 0:
        from peerd.examples.mnist import make_model

        args.numel = sum(t.numel() for t in make_model().parameters())
    if args.numel < args.segments:
        p.error("--numel must be at least --segments")
    return args


async def amain(args: argparse.Namespace) -> int:
    torch.set_num_threads(1)
    cases = [("crossover", 4, "fp32"), ("whole", 4, "fp32"), ("crossover", 4, "bf16"),
             ("hierarchical", 2, "fp32"), ("hierarchical", 4, "fp32"), ("hierarchical", 8, "fp32")]
    print(f"model: {args.numel} fp32 values = {args.numel * 4} bytes; {args.segments} segments; "
          f"{'gRPC on 127.0.0.1' if args.grpc else 'in memory'}; {args.rounds} rounds per case\n")
    print("| gossip | peers | groups | received per peer per round, model sizes: mean (min–max) "
          "| sent, mean (min–max) | expected (docs/algorithms.md) |")
    print("|---|---|---|---|---|---|")
    failed = False
    for mode, g, wire in cases:
        for n in args.peers:
            setup = Setup(mode, n, args.numel, args.segments, g, wire)
            t = await measure(setup, args.rounds, args.grpc)
            failed |= t.misses > 0
            unit = args.numel * 4  # fp32 model size, so bf16 shows as 0.5
            recv = [b / unit for rnd in t.received for b in rnd.values()]
            sent = [b / unit for rnd in t.sent for b in rnd.values()]
            groups = "-"
            if mode == "hierarchical":
                plan = plan_hierarchical(JOB, 1, setup.localities(), "peer-0", setup.segments, g)
                groups = "+".join(str(len(x)) for x in plan.groups)
            exp = expected_models(setup) * WIRE_BYTES[wire] / 4
            print(f"| {_label(setup)} | {n} | {groups} | {statistics.fmean(recv):.4f} ({min(recv):.4f}–{max(recv):.4f}) "
                  f"| {statistics.fmean(sent):.4f} ({min(sent):.4f}–{max(sent):.4f}) | {exp:.4f} |", flush=True)
    if failed:
        print("\nsome fetches missed their deadline: the figures above are incomplete", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(amain(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
