"""The peerd side of the exchange benches: one worker's exchange pieces, wired
as the engine wires them (peerd.worker.engine), and a rank's timed rounds."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import torch

from harness.ranks import Rank, RepeatClock
from peerd.core.segments import split_even
from peerd.worker.round.context import RoundBuffers, RoundContext, RoundInputs
from peerd.worker.round.shared import RoundResult
from peerd.worker.state.pull import StateBoard, StateServer
from peerd.worker.wire.server import start_exchange_server
from peerd.worker.wire.stores import Identity, SegmentServer, SnapshotStore, StageStore
from peerd.worker.wire.traffic import CountingSegmentServer, Traffic
from peerd.worker.wire.transport import GrpcTransport

CHUNK_ELEMS = 262_144  # the job default, chunk_kib = 1024


class ExchangePeer:
    """A worker's snapshot and stage stores and segment server (its bytes counted
    in `traffic` when given, as the engine counts them), served on 127.0.0.1
    (or the address serve() is given) with the state service beside it (idle
    here: no newcomer asks)."""

    def __init__(self, job: str, me: str, numel: int, segments: int, chunk_elems: int = CHUNK_ELEMS,
                 wire: str = "fp32", traffic: Traffic | None = None) -> None:
        self.identity = Identity(job, "fp", me)
        self.me = me
        self.numel = numel
        self.layout = split_even(numel, segments)
        self.store, self.stages = SnapshotStore(numel), StageStore()
        server = SegmentServer(self.identity, self.store, segments, chunk_elems, self.stages, wire)
        self.server = server if traffic is None else CountingSegmentServer(server, traffic)
        self.recv = torch.empty(numel)
        self._chunk_elems = chunk_elems
        self._exchange = None

    async def serve(self, host: str = "127.0.0.1", **options) -> str:
        """Serve on host:0 (start_exchange_server's `options`: auth, bulk); the address."""
        state = StateServer(self.identity, StateBoard(2 * self.numel, self.numel), self.store, self._chunk_elems)
        self._exchange, address = await start_exchange_server(self.server, state, host, **options)
        return address

    def context(self, transport, intrahost=None) -> RoundContext:
        return RoundContext(self.me, self.layout, transport, self.stages, intrahost=intrahost)

    def inputs(self, plan, addresses: dict[str, str], vector: torch.Tensor, deadline_s: float,
               into: torch.Tensor | None = None) -> RoundInputs:
        return RoundInputs(plan, addresses, RoundBuffers(vector, self.recv, deadline_s, into))

    async def stop(self) -> None:
        if self._exchange is not None:
            await self._exchange.stop(grace=None)


Round = Callable[[int, torch.Tensor], Awaitable[tuple[RoundResult | None, torch.Tensor]]]


async def timed_rounds(me: Rank, cfg: dict, vector: torch.Tensor, one_round: Round, clock: RepeatClock) -> torch.Tensor:
    """The repeats of one rank: the vector reset to its own values and the ranks
    started together by the barrier (untimed), one_round(round_, vector) -> (its
    result, the vector after it) timed by `clock`, a missed segment an error,
    and the barrier again (the partners may still fetch from this loop). Returns
    the vector after the last round. cfg: warmup, repeats, barrier_s."""
    own0 = vector.clone()
    for i in range(cfg["warmup"] + cfg["repeats"]):
        vector.copy_(own0)
        await me.wait(cfg["barrier_s"])
        clock.start()
        result, vector = await one_round(i + 1, vector)
        clock.stop()
        if result is not None and result.misses:
            raise RuntimeError(f"round {i + 1}: {result.misses} segment(s) missed: {result.errors}")
        await me.wait(cfg["barrier_s"])
    return vector


async def grpc_rounds(peer: ExchangePeer, me: Rank, cfg: dict, make_round: Callable[[RoundContext, dict], Round],
                      clock: RepeatClock, vector: torch.Tensor, auth=None, bulk: bool = True,
                      tls=None) -> torch.Tensor:
    """A rank's rounds over GrpcTransport (mutual TLS with `tls`, a TlsMaterial):
    serve (on 127.0.0.1, or on cfg["hosts"][rank] when the ranks sit on capped
    links), learn every rank's address (rank r is "p{r}"), time the rounds
    make_round(context, addresses) runs (timed_rounds), then close every channel
    before any server stops."""
    host = cfg["hosts"][me.rank] if cfg.get("hosts") else "127.0.0.1"
    address = await peer.serve(host, auth=auth, bulk=bulk, tls=tls)
    transport = GrpcTransport(peer.identity, auth, tls, bulk=bulk)
    try:
        sent = await asyncio.to_thread(me.share, address, cfg["barrier_s"])
        addresses = {f"p{r}": a for r, a in sent.items()}
        vector = await timed_rounds(me, cfg, vector, make_round(peer.context(transport), addresses), clock)
        await transport.aclose()
        await me.wait(cfg["barrier_s"])
        return vector
    finally:
        await transport.aclose()
        await peer.stop()
