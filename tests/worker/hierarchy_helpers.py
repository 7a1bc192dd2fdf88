"""In-process peers for hierarchical (and flat, and pair) rounds over a vector of
NUMEL values, served over real sockets on 127.0.0.1, and a partner that poisons
a stage: shared by the hierarchy, non-finite, pair and intra-host tests."""

from __future__ import annotations

import asyncio
import math
from contextlib import asynccontextmanager

import torch

from peerd.core.groups import plan_hierarchical
from peerd.core.segments import split_even
from peerd.worker.round.hierarchy import hierarchical_round
from peerd.worker.round.context import RoundBuffers, RoundContext, RoundInputs
from peerd.worker.wire.stores import Identity, SegmentServer, SnapshotStore, StageStore
from peerd.worker.wire.server import start_exchange_server
from peerd.worker.wire.transport import GrpcTransport
from peerd.worker.state.pull import StateBoard, StateServer

NUMEL = 5_003
SEGMENTS = 6
CHUNK = 700
# Two racks: 3 + 3 peers, groups of at most 3.
VIEW = {p: ("rack-a", "h") for p in ("a1", "a2", "a3")} | {p: ("rack-b", "h") for p in ("b1", "b2", "b3")}


class Peer:
    def __init__(self, peer_id: str, vector: torch.Tensor, wire: str = "fp32") -> None:
        self.id = peer_id
        self.identity = Identity("job", "fp", peer_id)
        self.vector = vector.clone()
        self.store = SnapshotStore(NUMEL)
        self.stages = StageStore()
        self.server = SegmentServer(self.identity, self.store, SEGMENTS, CHUNK, self.stages, wire)
        self.layout = split_even(NUMEL, SEGMENTS)
        self.recv = torch.empty(NUMEL)

    def context(self, transport, wire="fp32") -> RoundContext:
        return RoundContext(self.id, self.layout, transport, self.stages, wire=wire)

    def inputs(self, plan, addresses, deadline_s=5.0, out=None) -> RoundInputs:
        return RoundInputs(plan, addresses, RoundBuffers(self.vector, self.recv, deadline_s, out))

    async def round(self, round_, view, addresses, transport, deadline_s=5.0, hand_over=False):
        """In place after a copy (publish), or as the worker runs a model on the
        CPU: the vector becomes the snapshot and the round writes a new one."""
        into = await self.store.hand_over(round_, self.vector) if hand_over else None
        if into is None:
            await self.store.publish(round_, self.vector)
        plan = plan_hierarchical("job", round_, view, self.id, SEGMENTS, 3)
        snapshot = self.vector.clone()
        result = await hierarchical_round(self.context(transport), self.inputs(plan, addresses, deadline_s, into))
        if into is not None:
            assert torch.equal(self.vector, snapshot)  # what partners read was never written
            self.vector = into
        return result


def make_peers(view, wire="fp32"):
    gen = torch.Generator().manual_seed(1)
    return {p: Peer(p, torch.randn(NUMEL, generator=gen), wire) for p in sorted(view)}


@asynccontextmanager
async def served(peers: dict[str, Peer]):
    """Every peer behind its own exchange server (bulk lane on), and a transport each."""
    servers, addresses = [], {}
    try:
        for p, peer in peers.items():
            state = StateServer(peer.identity, StateBoard(2 * NUMEL, NUMEL), peer.store, 1000)
            server, address = await start_exchange_server(peer.server, state, "127.0.0.1")
            assert server.bulk is not None
            servers.append(server)
            addresses[p] = address
        transports = {p: GrpcTransport(peers[p].identity) for p in peers}
        yield addresses, transports
        await asyncio.gather(*(t.aclose() for t in transports.values()))
    finally:
        await asyncio.gather(*(s.stop(None) for s in servers))


class PoisonedStages(StageStore):
    """Serves a NaN in every value it publishes for `stage`; keeps its own copy clean."""

    def __init__(self, stage: int) -> None:
        super().__init__()
        self.bad = stage

    async def put(self, round_: int, stage: int, segment: int, value: torch.Tensor) -> None:
        if stage == self.bad:
            value = value.clone()
            value[0] = math.nan
        await super().put(round_, stage, segment, value)
