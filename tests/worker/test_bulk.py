"""The bulk lane's pipelined client against a real BulkServer on 127.0.0.1, with and
without proofs of the job secret."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest
import torch

from peerd.core.segments import split_even
from peerd.security.auth import Authenticator, ReplyMac
from peerd.errors import PeerUnavailable, RoundMismatch, Unauthenticated
from peerd.security.rejections import Rejections
from peerd.worker.wire import bulk_client
from peerd.worker.wire.bulk import BulkServer
from peerd.worker.wire.bulk_client import BulkClient
from peerd.worker.wire.stores import Identity, SegmentServer, SnapshotStore

from bulk_helpers import NUMEL, SEGMENTS, Lane, cancel_twice_mid_segment, segment_request
from conftest import until


def _reader_threads() -> int:
    return sum(t.name == "peerd-bulk-recv" and t.is_alive() for t in threading.enumerate())


async def test_all_segments_from_one_partner_share_one_connection_and_arrive_intact():
    async with Lane() as lane:
        client = BulkClient()
        try:
            await lane.store.publish(1, lane.vector)
            outs = [torch.empty(span.size) for span in lane.layout]
            await asyncio.gather(*(client.fetch("127.0.0.1", lane.port, segment_request(1, s), outs[s], 5.0)
                                   for s in range(SEGMENTS)))
            for s in range(SEGMENTS):
                assert torch.equal(outs[s], lane.segment(s))
            assert lane.connections() == 1
            # A later round reuses the connection (and its reader thread).
            await lane.store.publish(2, lane.vector * 2)
            await asyncio.gather(*(client.fetch("127.0.0.1", lane.port, segment_request(2, s), outs[s], 5.0)
                                   for s in range(SEGMENTS)))
            assert torch.equal(outs[3], lane.segment(3) * 2)
            assert lane.connections() == 1
        finally:
            await client.aclose()
        await asyncio.sleep(0.05)
        assert lane.connections() == 0


async def test_requests_queued_behind_a_waiting_one_are_answered_in_order():
    """The server answers one connection in order: a request for a round not yet
    published holds the ones behind it, which then all arrive."""
    async with Lane() as lane:
        client = BulkClient()
        try:
            outs = [torch.empty(span.size) for span in lane.layout]
            fetches = asyncio.gather(*(client.fetch("127.0.0.1", lane.port, segment_request(1, s), outs[s], 5.0)
                                       for s in range(SEGMENTS)))
            await asyncio.sleep(0.2)
            assert not fetches.done()
            await lane.store.publish(1, lane.vector)
            await fetches
            assert all(torch.equal(outs[s], lane.segment(s)) for s in range(SEGMENTS))
        finally:
            await client.aclose()


async def test_a_deadline_fails_the_pipe_and_the_next_fetch_reconnects():
    async with Lane() as lane:
        client = BulkClient()
        try:
            outs = [torch.full((span.size,), -1.0) for span in lane.layout]
            results = await asyncio.gather(
                *(client.fetch("127.0.0.1", lane.port, segment_request(1, s), outs[s], 0.3) for s in range(3)),
                return_exceptions=True)
            assert all(isinstance(r, PeerUnavailable) for r in results), results
            # Nothing is written into a caller's buffer after its fetch has failed.
            await lane.store.publish(1, lane.vector)
            await asyncio.sleep(0.2)
            assert all(bool((out == -1.0).all()) for out in outs)
            await client.fetch("127.0.0.1", lane.port, segment_request(1, 4), outs[4], 5.0)
            assert torch.equal(outs[4], lane.segment(4))
        finally:
            await client.aclose()


async def test_an_idle_connection_is_closed_and_its_thread_ends(monkeypatch):
    monkeypatch.setattr(bulk_client, "IDLE_S", 0.2)
    async with Lane() as lane:
        client = BulkClient()
        try:
            before = _reader_threads()
            await lane.store.publish(1, lane.vector)
            out = torch.empty(lane.layout[0].size)
            await client.fetch("127.0.0.1", lane.port, segment_request(1, 0), out, 5.0)
            assert _reader_threads() == before + 1
            await until(lambda: _reader_threads() == before, "the idle connection's reader thread to end")
            out1 = torch.empty(lane.layout[1].size)
            await client.fetch("127.0.0.1", lane.port, segment_request(1, 1), out1, 5.0)  # a fresh connection
            assert torch.equal(out1, lane.segment(1))
        finally:
            await client.aclose()


async def test_a_partner_that_dies_mid_pipe_fails_every_queued_fetch():
    async with Lane() as lane:
        client = BulkClient()
        try:
            outs = [torch.empty(span.size) for span in lane.layout]
            fetches = [asyncio.ensure_future(client.fetch("127.0.0.1", lane.port, segment_request(1, s), outs[s], 5.0))
                       for s in range(SEGMENTS)]
            await asyncio.sleep(0.2)  # all asked; the server waits for round 1
            await lane.server.close()
            results = await asyncio.gather(*fetches, return_exceptions=True)
            assert all(isinstance(r, PeerUnavailable) for r in results), results
        finally:
            await client.aclose()


@pytest.mark.parametrize("wire", ["fp16", "bf16"])
async def test_narrow_wire_values_are_widened_in_the_reader(wire):
    store = SnapshotStore(NUMEL)
    segments = SegmentServer(Identity("job", "fp", "srv"), store, SEGMENTS, 1000, wire=wire)
    server = BulkServer(segments)
    port = await server.start("127.0.0.1")
    client = BulkClient(wire)
    try:
        vector = torch.randn(NUMEL, generator=torch.Generator().manual_seed(5))
        await store.publish(1, vector)
        span = split_even(NUMEL, SEGMENTS)[2]
        out = torch.empty(span.size)
        await client.fetch("127.0.0.1", port, segment_request(1, 2), out, 5.0)
        dtype = torch.float16 if wire == "fp16" else torch.bfloat16
        assert torch.equal(out, vector[span.start : span.stop].to(dtype).float())
    finally:
        await client.aclose()
        await server.close()


# ---- proofs of the job secret on the lane ------------------------------------------------

SECRET = b"bulk-lane-secret-0123456789"


class SecretLane(Lane):
    def __init__(self, auth) -> None:
        super().__init__()
        self.rejections = Rejections(logging.getLogger("test"))
        self.server = BulkServer(SegmentServer(Identity("job", "fp", "srv"), self.store, SEGMENTS, 1000),
                                 auth, self.rejections)
        self.server.audience = "127.0.0.1:1"  # the exchange address callers' proofs name


async def test_with_the_secret_segments_travel_with_proofs():
    async with SecretLane(Authenticator(SECRET)) as lane:
        client = BulkClient(auth=Authenticator(SECRET))
        try:
            await lane.store.publish(1, lane.vector)
            outs = [torch.empty(span.size) for span in lane.layout]
            await asyncio.gather(*(client.fetch("127.0.0.1", lane.port, segment_request(1, s), outs[s], 5.0,
                                                audience="127.0.0.1:1") for s in range(SEGMENTS)))
            assert all(torch.equal(outs[s], lane.segment(s)) for s in range(SEGMENTS))
            # A refusal is proved too, and still carries the round.
            with pytest.raises(RoundMismatch):
                await client.fetch("127.0.0.1", lane.port, segment_request(0, 0), outs[0], 5.0, audience="127.0.0.1:1")
            assert lane.connections() == 1 and not lane.rejections.counts
        finally:
            await client.aclose()


@pytest.mark.parametrize("who", ["no secret", "another secret", "another audience"])
async def test_a_request_without_valid_proof_is_refused(who):
    async with SecretLane(Authenticator(SECRET)) as lane:
        auth = {"no secret": None, "another secret": Authenticator(b"x" * 32)}.get(who, Authenticator(SECRET))
        audience = "127.0.0.1:2" if who == "another audience" else "127.0.0.1:1"
        client = BulkClient(auth=auth)
        try:
            await lane.store.publish(1, lane.vector)
            out = torch.full((lane.layout[0].size,), -1.0)
            with pytest.raises(PeerUnavailable):  # Unauthenticated; without a secret, no answer at all
                await client.fetch("127.0.0.1", lane.port, segment_request(1, 0), out, 1.0, audience=audience)
            assert bool((out == -1.0).all())
            if who != "no secret":  # (that one never sent a proof's length: the lane still waits for it)
                assert lane.rejections.counts.get("bad_mac") == 1, lane.rejections.counts
        finally:
            await client.aclose()


async def test_a_wait_that_is_not_a_number_is_refused_and_the_lane_serves_on():
    # gRPC refuses a non-finite wait_s; the lane must too, not hand NaN to the
    # server's timeout (uvloop raises on it, and the connection would end unanswered).
    async with SecretLane(Authenticator(SECRET)) as lane:
        client = BulkClient(auth=Authenticator(SECRET))
        try:
            out = torch.full((lane.layout[0].size,), -1.0)
            with pytest.raises(PeerUnavailable, match="wait_s is not finite"):
                await client.fetch("127.0.0.1", lane.port, segment_request(1, 0, wait_s=float("nan")), out, 5.0,
                                   audience="127.0.0.1:1")
            assert bool((out == -1.0).all()) and lane.rejections.counts == {"bad_request": 1}
            await lane.store.publish(1, lane.vector)
            await client.fetch("127.0.0.1", lane.port, segment_request(1, 0), out, 5.0, audience="127.0.0.1:1")
            assert torch.equal(out, lane.segment(0))
        finally:
            await client.aclose()


class _Forger:
    """A server that takes any request and answers with a key it made up: it
    cannot know the secret, so its replies cannot carry a valid proof."""

    def verify(self, method, body, header, audience):
        return ReplyMac(b"k" * 32, "forged")


async def test_a_reply_without_valid_proof_is_not_believed():
    async with SecretLane(_Forger()) as lane:
        client = BulkClient(auth=Authenticator(SECRET))
        try:
            await lane.store.publish(1, lane.vector)
            with pytest.raises(Unauthenticated) as info:
                await client.fetch("127.0.0.1", lane.port, segment_request(1, 0), torch.empty(lane.layout[0].size), 5.0)
            assert info.value.reason == "reply_bad_mac"
            with pytest.raises(Unauthenticated):  # a refusal's proof is checked as well
                await client.fetch("127.0.0.1", lane.port, segment_request(0, 0), torch.empty(lane.layout[0].size), 5.0)
        finally:
            await client.aclose()


async def test_a_fetch_cancelled_twice_still_stops_its_reader_before_returning():
    """A deadline cancels a fetch from two sides (the client's timeout, the
    round's). However often it is cancelled, when the fetch has returned nothing
    may be written into its buffer any more: the next round reuses it."""
    big = 8_000_000  # 32 MB: still arriving when the cancellations come
    store = SnapshotStore(big)
    server = BulkServer(SegmentServer(Identity("job", "fp", "srv"), store, 1, 1 << 20))
    port = await server.start("127.0.0.1")
    client = BulkClient()
    try:
        await store.publish(1, torch.ones(big))
        await cancel_twice_mid_segment(client, port, big, times=5)
    finally:
        await client.aclose()
        await server.close()
