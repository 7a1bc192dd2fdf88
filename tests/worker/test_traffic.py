"""Byte counters and the exchange-time histogram behind the metrics, over real gRPC."""

from __future__ import annotations

import pytest
import torch

from peerd.core.segments import Span
from peerd.errors import JobMismatch
from peerd.control.progress import EXCHANGE_BUCKETS_S
from peerd.worker.wire.stores import Identity, SegmentServer, SnapshotStore
from peerd.worker.state.pull import StateBoard, StateMeta, StateServer
from peerd.worker.wire.traffic import (
    CountingSegmentServer,
    CountingStateServer,
    CountingTransport,
    ExchangeTimes,
    Traffic,
)
from peerd.worker.wire.server import start_exchange_server
from peerd.worker.wire.transport import GrpcTransport

N = 10_000
CHUNK = 1024


async def test_bytes_are_counted_on_both_sides_of_a_segment_and_a_state_fetch():
    served, fetched = Traffic(), Traffic()
    identity = Identity("job", "fp", "a")
    store, board = SnapshotStore(N), StateBoard(2 * N, N)
    await store.publish(1, torch.arange(N, dtype=torch.float32))
    await board.capture([torch.ones(N), torch.zeros(N)], StateMeta(1, 1, 0.0))
    server = CountingSegmentServer(SegmentServer(identity, store, 4, CHUNK), served)
    state = CountingStateServer(StateServer(identity, board, store, CHUNK), served)
    grpc_server, address = await start_exchange_server(server, state, "127.0.0.1")
    transport = CountingTransport(GrpcTransport(Identity("job", "fp", "b")), fetched)
    try:
        out = torch.empty(N // 4)
        await transport.fetch_segment(address, 1, 2, out, 5.0)
        assert torch.equal(out, torch.arange(N // 2, 3 * N // 4, dtype=torch.float32))
        assert fetched.received == served.sent == 4 * (N // 4)
        part = await transport.fetch_state(address, Span(0, 3000), 5.0)
        assert part.values.numel() == 3000
        assert fetched.received == served.sent == 4 * (N // 4 + 3000)
        with pytest.raises(JobMismatch):  # refused: nothing counted
            await CountingTransport(GrpcTransport(Identity("job", "other", "c")), fetched).fetch_segment(
                address, 1, 0, out, 5.0)
        assert fetched.received == served.sent == 4 * (N // 4 + 3000)
    finally:
        await transport.aclose()
        await grpc_server.stop(grace=None)


def test_exchange_times_are_cumulative_buckets():
    times = ExchangeTimes()
    for seconds in (0.001, 0.3, 0.3, 50.0):
        times.observe(seconds)
    assert times.count == 4 and times.sum_s == pytest.approx(50.601)
    by_bound = dict(zip(EXCHANGE_BUCKETS_S, times.buckets))
    assert by_bound[0.005] == 1 and by_bound[0.25] == 1 and by_bound[0.5] == 3 and by_bound[10.0] == 3
    assert times.buckets == sorted(times.buckets)  # cumulative
