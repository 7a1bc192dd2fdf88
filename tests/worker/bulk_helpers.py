"""A SegmentServer behind a real BulkServer on 127.0.0.1, and the requests and
cancellations the bulk lane tests (plain and under TLS) send it."""

from __future__ import annotations

import asyncio

import torch

from peerd.core.segments import split_even
from peerd.proto.v1 import peer_pb2
from peerd.worker.wire.bulk import BulkServer
from peerd.worker.wire.stores import Identity, SegmentServer, SnapshotStore

NUMEL = 40_003
SEGMENTS = 8


def segment_request(round_: int, segment: int, wait_s: float = 5.0, stage: int = 0):
    return peer_pb2.SegmentRequest(job="job", fingerprint="fp", round=round_, segment=segment,
                                   peer_id="client", wait_s=wait_s, stage=stage)


class Lane:
    """A SegmentServer behind a BulkServer, counting the connections it accepts."""

    def __init__(self) -> None:
        self.store = SnapshotStore(NUMEL)
        self.server = BulkServer(SegmentServer(Identity("job", "fp", "srv"), self.store, SEGMENTS, 1000))
        self.layout = split_even(NUMEL, SEGMENTS)
        self.vector = torch.randn(NUMEL, generator=torch.Generator().manual_seed(3))

    async def __aenter__(self) -> Lane:
        self.port = await self.server.start("127.0.0.1")
        return self

    async def __aexit__(self, *exc) -> None:
        await self.server.close()

    def connections(self) -> int:
        return len(self.server._connections)

    def segment(self, s: int) -> torch.Tensor:
        span = self.layout[s]
        return self.vector[span.start : span.stop]


async def cancel_twice_mid_segment(client, port: int, numel: int, times: int) -> None:
    """Fetch segment 0 of round 1 (all ones) and cancel it twice while its
    reader is filling the buffer; then check nothing is written after the
    fetch has returned."""
    for _ in range(times):
        out = torch.full((numel,), -1.0)
        task = asyncio.ensure_future(client.fetch("127.0.0.1", port, segment_request(1, 0), out, 30.0))
        while out[0] != 1.0 and not task.done():  # the reader is filling it
            await asyncio.sleep(0)
        task.cancel()
        await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        seen = out.clone()
        await asyncio.sleep(0.2)
        assert torch.equal(out, seen), "the reader wrote into the buffer after the fetch returned"
