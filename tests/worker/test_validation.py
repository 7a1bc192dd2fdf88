"""Input validation on both sides of the exchange, over real gRPC on 127.0.0.1.

A rogue partner sends every kind of malformed segment; the receiving peer
refuses it, counts it by reason, keeps its own value and carries on. An honest
server refuses malformed requests with a status and keeps serving.
"""

from __future__ import annotations

import logging
import math

import grpc
import numpy as np
import pytest
import torch

from peerd.security.auth import Authenticator
from peerd.errors import InvalidMessage, RoundMismatch, Unauthenticated
from peerd.proto.v1 import peer_pb2
from peerd.security.rejections import LOG_EVERY_S, Rejections
from peerd.worker.wire.codec import encode_segment_chunk
from peerd.worker.wire.stores import Identity
from peerd.worker.wire.server import start_exchange_server
from peerd.worker.wire.transport import (
    EXCHANGE_SERVICE, FETCH_SEGMENT, FETCH_STATE, MAX_CHUNK_BYTES, MAX_REQUEST_BYTES, GrpcTransport,
)

from exchange_helpers import NUMEL, SEGMENTS, Peer, two_peers

SECRET = b"0123456789abcdef-the-job-secret"


def _good(request: peer_pb2.SegmentRequest, size: int) -> list[tuple]:
    """(round, segment, offset, total, values) of an honest answer, in two chunks."""
    values = np.ones(size, dtype="<f4")
    half = size // 2
    return [(request.round, request.segment, 0, size, values[:half]),
            (request.round, request.segment, half, size, values[half:])]


def _with(chunks, k: int, **changes) -> list[tuple]:
    fields = dict(zip(("round", "segment", "offset", "total", "values"), chunks[k]))
    fields.update(changes)
    return [*chunks[:k], tuple(fields.values()), *chunks[k + 1:]]


def _nan(chunks):
    values = chunks[1][4].copy()
    values[3] = math.nan
    return _with(chunks, 1, values=values)


def _inf(chunks):
    values = chunks[0][4].copy()
    values[0] = -math.inf
    return _with(chunks, 0, values=values)


# How a rogue partner answers FetchSegment, and the reason the receiver counts.
MALFORMED = {
    "wrong_length": (lambda c: [(r, s, o, t + 1, v) for r, s, o, t, v in c], "wrong_length"),
    "offset_gap": (lambda c: _with(c, 1, offset=c[1][2] + 1), "bad_offset"),
    "repeated_chunk": (lambda c: [c[0], c[0], c[1]], "bad_offset"),
    "nan": (_nan, "non_finite"),
    "inf": (_inf, "non_finite"),
    "past_the_end": (lambda c: [*c, (c[0][0], c[0][1], c[0][3], c[0][3], c[1][4])], "oversize"),
    "empty_chunk": (lambda c: [_with(c, 0, values=c[0][4][:0])[0], *c], "oversize"),
    "wrong_segment": (lambda c: _with(c, 0, segment=c[0][1] + 1), "wrong_segment"),
    "wrong_round": (lambda c: _with(c, 1, round=c[1][0] + 7), "wrong_segment"),
    "partial_float": (lambda c: _with(c, 1, values=c[1][4].tobytes()[:-1]), "bad_dtype"),
    "not_a_chunk": (lambda c: b"\xff\xff\xff", "malformed"),
    "too_big": (lambda c: b"\x00" * (MAX_CHUNK_BYTES + 1), "oversize"),
}


async def start_rogue(answer, state_answer=None) -> tuple[grpc.aio.Server, str]:
    """An Exchange server that answers with whatever `answer(request)` makes."""
    async def fetch_segment(raw: bytes, context):
        request = peer_pb2.SegmentRequest.FromString(raw)
        made = answer(request)
        if isinstance(made, bytes):
            yield made
            return
        for round_, segment, offset, total, values in made:
            yield encode_segment_chunk(round_, segment, offset, total, values)

    async def fetch_state(raw: bytes, context):
        for chunk in state_answer(peer_pb2.StateRequest.FromString(raw)):
            yield chunk.SerializeToString()

    server = grpc.aio.server(options=[("grpc.max_send_message_length", 2 * MAX_CHUNK_BYTES)])
    handlers = {"FetchSegment": grpc.unary_stream_rpc_method_handler(fetch_segment),
                "FetchState": grpc.unary_stream_rpc_method_handler(fetch_state)}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(EXCHANGE_SERVICE, handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


@pytest.fixture
async def rogue_pair():
    """Factory: peer a (honest, its own transport) and a rogue partner b."""
    made = []

    async def make(answer, state_answer=None, secret: bytes | None = None):
        a, _ = two_peers()
        server, address = await start_rogue(answer, state_answer)
        transport = GrpcTransport(a.identity, Authenticator(secret) if secret else None,
                                  rejections=Rejections(logging.getLogger("test")))
        made.append((server, transport))
        return a, {"a": "127.0.0.1:1", "b": address}, transport

    yield make
    for server, transport in made:
        await transport.aclose()
        await server.stop(grace=None)


@pytest.mark.parametrize("case", sorted(MALFORMED))
async def test_a_malformed_segment_is_refused_counted_and_missed(rogue_pair, case):
    mutate, reason = MALFORMED[case]
    sizes = {}
    a, addresses, transport = await rogue_pair(lambda r: mutate(_good(r, sizes[r.segment])))
    for s, span in enumerate(a.layout):
        sizes[s] = span.size
    before = a.vector.clone()
    result = await a.round(1, addresses, transport, deadline_s=3.0)
    assert result.misses == SEGMENTS and not result.reached  # every segment refused, no crash
    torch.testing.assert_close(a.vector, before)  # a kept its own values
    assert transport.rejections.counts == {reason: SEGMENTS}, result.errors


async def test_the_honest_answer_of_the_rogue_harness_is_accepted(rogue_pair):
    """The control for the cases above: unchanged chunks are averaged in."""
    sizes = {}
    a, addresses, transport = await rogue_pair(lambda r: _good(r, sizes[r.segment]))
    for s, span in enumerate(a.layout):
        sizes[s] = span.size
    expected = (a.vector + 1) / 2
    result = await a.round(1, addresses, transport, deadline_s=3.0)
    assert result.misses == 0 and not transport.rejections.counts
    torch.testing.assert_close(a.vector, expected)


async def test_a_round_number_without_proof_is_not_believed(rogue_pair):
    """A partner without the secret cannot make a peer jump rounds."""
    async def refuse(raw: bytes, context):
        context.set_trailing_metadata((("peerd-round", str(10**12)),))
        await context.abort(grpc.StatusCode.ABORTED, "I am far ahead")
        yield b""

    server = grpc.aio.server()
    handlers = {"FetchSegment": grpc.unary_stream_rpc_method_handler(refuse)}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(EXCHANGE_SERVICE, handlers),))
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    open_, guarded = GrpcTransport(Identity("job", "fp", "a")), GrpcTransport(Identity("job", "fp", "a"), Authenticator(SECRET))
    try:
        with pytest.raises(RoundMismatch):  # without a secret the data plane is open, rounds included
            await open_.fetch_segment(address, 1, 0, torch.empty(10), 2.0)
        with pytest.raises(Unauthenticated):
            await guarded.fetch_segment(address, 1, 0, torch.empty(10), 2.0)
        assert guarded.rejections.counts == {"reply_missing": 1}
    finally:
        await open_.aclose()
        await guarded.aclose()
        await server.stop(grace=None)


def _state_chunks(request, values: np.ndarray, sha: bytes, progress: float = 0.5):
    return [peer_pb2.StateChunk(round=3, step=4, offset=request.offset, total=2 * NUMEL, progress=progress,
                                sha256=sha, params=NUMEL, data=values.tobytes())]


@pytest.mark.parametrize("case, reason", [
    ("non_finite", "non_finite"), ("bad_checksum", "bad_checksum"), ("bad_progress", "bad_progress"),
    ("wrong_offset", "bad_offset"),
])
async def test_a_malformed_state_range_is_refused(rogue_pair, case, reason):
    import hashlib

    def answer(request):
        values = np.ones(request.length, dtype="<f4")
        sha = hashlib.sha256(values.tobytes()).digest()
        if case == "non_finite":
            values[1] = math.nan
            sha = hashlib.sha256(values.tobytes()).digest()
        if case == "bad_checksum":
            sha = bytes(32)
        chunks = _state_chunks(request, values, sha, progress=-1.0 if case == "bad_progress" else 0.5)
        if case == "wrong_offset":
            chunks[0].offset = request.offset + 1
        return chunks

    a, addresses, transport = await rogue_pair(None, answer)
    with pytest.raises(InvalidMessage):
        await transport.fetch_state(addresses["b"], a.layout[1], timeout=2.0)
    assert transport.rejections.counts == {reason: 1}


# ---- the serving side: malformed requests to an honest server -------------------------------


@pytest.fixture
async def honest():
    peer = Peer("b", torch.randn(NUMEL))
    peer.rejections = Rejections(logging.getLogger("test"))
    server, address = await start_exchange_server(peer.server, peer.state, "127.0.0.1", rejections=peer.rejections)
    await peer.store.publish(1, peer.vector)
    channel = grpc.aio.insecure_channel(address)
    yield peer, address, channel
    await channel.close()
    await server.stop(grace=None)


async def _status(channel, method: str, body: bytes) -> grpc.StatusCode:
    try:
        async for _ in channel.unary_stream(method)(body, timeout=5.0):
            pass
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def _segment(**fields) -> bytes:
    return peer_pb2.SegmentRequest(**{"job": "job", "fingerprint": "fp", "round": 1, **fields}).SerializeToString()


@pytest.mark.parametrize("method, body, code, reason", [
    (FETCH_SEGMENT, _segment(segment=SEGMENTS), grpc.StatusCode.INVALID_ARGUMENT, "bad_segment"),
    (FETCH_SEGMENT, _segment(segment=2**32 - 1), grpc.StatusCode.INVALID_ARGUMENT, "bad_segment"),
    (FETCH_SEGMENT, _segment(wait_s=math.nan), grpc.StatusCode.INVALID_ARGUMENT, "bad_request"),
    (FETCH_SEGMENT, _segment(fingerprint="other-model"), grpc.StatusCode.FAILED_PRECONDITION, "job_mismatch"),
    (FETCH_SEGMENT, _segment(job="other-job"), grpc.StatusCode.FAILED_PRECONDITION, "job_mismatch"),
    (FETCH_SEGMENT, b"\x0a\xff\xff\xff\x0f", grpc.StatusCode.INVALID_ARGUMENT, "malformed"),
    (FETCH_STATE, peer_pb2.StateRequest(job="job", fingerprint="fp", offset=2**63, length=2**63).SerializeToString(),
     grpc.StatusCode.INVALID_ARGUMENT, "bad_range"),
    (FETCH_STATE, peer_pb2.StateRequest(job="job", fingerprint="fp", offset=0, length=0).SerializeToString(),
     grpc.StatusCode.INVALID_ARGUMENT, "bad_range"),
])
async def test_a_malformed_request_is_answered_with_a_status_and_counted(honest, method, body, code, reason):
    peer, _, channel = honest
    assert await _status(channel, method, body) == code
    assert peer.rejections.counts == {reason: 1}
    assert await _status(channel, FETCH_SEGMENT, _segment(segment=0)) == grpc.StatusCode.OK  # still serving


async def test_an_oversized_request_is_refused_before_it_is_read(honest):
    peer, _, channel = honest
    body = _segment(peer_id="x" * MAX_REQUEST_BYTES)
    assert await _status(channel, FETCH_SEGMENT, body) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert await _status(channel, FETCH_SEGMENT, _segment(segment=0)) == grpc.StatusCode.OK


async def test_a_huge_wait_is_capped_by_the_callers_deadline(honest):
    peer, _, channel = honest
    call = channel.unary_stream(FETCH_SEGMENT)(_segment(round=2, wait_s=1e30), timeout=0.5)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in call:
            pass
    assert info.value.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.ABORTED)
    assert await _status(channel, FETCH_SEGMENT, _segment(segment=0)) == grpc.StatusCode.OK


# ---- rejections are logged at most once per peer per minute --------------------------------


def test_rejections_are_counted_always_and_logged_once_per_peer_per_minute(caplog):
    now = [0.0]
    rejections = Rejections(logging.getLogger("test.rejections"), clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, "test.rejections"):
        for _ in range(5):
            rejections.record("10.0.0.1", "non_finite", "NaN")
        rejections.record("10.0.0.2", "bad_mac", "x")
        now[0] = LOG_EVERY_S + 1
        rejections.record("10.0.0.1", "oversize", "y")
    assert rejections.counts == {"non_finite": 5, "bad_mac": 1, "oversize": 1}
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 3 and "10.0.0.2" in logged[1] and "oversize" in logged[2]
