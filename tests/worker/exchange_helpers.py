"""Two in-process peers with a segment server and a state server each, over
a vector of NUMEL values: shared by the exchange, auth, validation and fuzz tests."""

from __future__ import annotations

import torch

from peerd.core.segments import split_even
from peerd.core.topology import plan_round
from peerd.worker.round.crossover import gossip_round
from peerd.worker.round.context import RoundBuffers, RoundContext, RoundInputs
from peerd.worker.wire.stores import Identity, SegmentServer, SnapshotStore, StageStore
from peerd.worker.state.pull import StateBoard, StateServer

NUMEL = 10_007  # not a multiple of the segment or chunk size
SEGMENTS = 5
CHUNK = 1000


class Peer:
    def __init__(self, peer_id: str, vector: torch.Tensor, fingerprint: str = "fp") -> None:
        self.identity = Identity("job", fingerprint, peer_id)
        self.vector = vector.clone()
        self.store = SnapshotStore(NUMEL)
        self.server = SegmentServer(self.identity, self.store, SEGMENTS, CHUNK)
        self.board = StateBoard(2 * NUMEL, NUMEL)
        self.state = StateServer(self.identity, self.board, self.store, CHUNK)
        self.layout = split_even(NUMEL, SEGMENTS)
        self.recv = torch.empty(NUMEL)

    def context(self, transport, clipper=None) -> RoundContext:
        return RoundContext(self.identity.peer_id, self.layout, transport, StageStore(), clipper)

    async def round(self, round_: int, addresses: dict[str, str], transport, deadline_s: float = 5.0):
        await self.store.publish(round_, self.vector)
        plan = plan_round("job", round_, list(addresses), self.identity.peer_id, SEGMENTS)
        return await gossip_round(self.context(transport),
                                  RoundInputs(plan, addresses, RoundBuffers(self.vector, self.recv, deadline_s)))


def two_peers() -> tuple[Peer, Peer]:
    gen = torch.Generator().manual_seed(0)
    return Peer("a", torch.randn(NUMEL, generator=gen)), Peer("b", torch.randn(NUMEL, generator=gen))
