"""How a worker fetches from its partners: one small interface, two transports.

`GrpcTransport` is the real one; `MemoryTransport` wires workers of one process
together with no network, for tests of the exchange logic. The serving side is
peerd.worker.wire.server.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import aclosing
from typing import Protocol

import grpc
import torch

from google.protobuf.message import DecodeError

from peerd.security.auth import REPLY_KEY, Authenticator, ReplyMac, metadata_value
from peerd.core.names import host_of
from peerd.core.segments import Span
from peerd.errors import InvalidMessage, JobMismatch, PeerUnavailable, RoundMismatch, Unauthenticated
from peerd.proto.v1 import peer_pb2
from peerd.security.rejections import Rejections
from peerd.security.tls import TlsMaterial, open_channel
from peerd.worker.wire.bulk_client import BulkClient
from peerd.worker.wire.bulk_tls import client_context
from peerd.worker.wire.codec import ROUND_CHECKED_STAGES, ChunkView, decode_segment_chunk, fill_values
from peerd.worker.wire.stores import Identity, SegmentServer
from peerd.worker.wire.values import stage_wire
from peerd.worker.state.pull import StateMeta, StatePart, StateServer, verify_part

log = logging.getLogger("peerd.worker")

# Size limits (docs/protocol.md): requests are small, chunks at most the job's
# chunk_kib (≤ 16 MiB) plus a few header bytes.
MAX_REQUEST_BYTES = 64 * 1024
MAX_CHUNK_BYTES = 16 * 1024 * 1024 + 1024
KEEPALIVE = [("grpc.keepalive_time_ms", 10_000), ("grpc.keepalive_timeout_ms", 5_000)]
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_CHUNK_BYTES),
    ("grpc.max_send_message_length", MAX_REQUEST_BYTES),
    *KEEPALIVE,
]


EXCHANGE_SERVICE = "peerd.v1.Exchange"
FETCH_SEGMENT = f"/{EXCHANGE_SERVICE}/FetchSegment"
FETCH_STATE = f"/{EXCHANGE_SERVICE}/FetchState"
LANES = f"/{EXCHANGE_SERVICE}/Lanes"
ROUND_KEY = "peerd-round"


class Transport(Protocol):
    async def fetch_segment(
        self, address: str, round_: int, segment: int, out: torch.Tensor, timeout: float, stage: int = 0
    ) -> None:
        """Fill `out` with the partner's segment of `round_` or raise a PeerdError."""

    async def fetch_state(self, address: str, span: Span, timeout: float) -> StatePart:
        """A verified range of the partner's training state."""

    async def aclose(self) -> None: ...


class _StateAssembly:
    """Chunks of one state range into a buffer, then verified (checksum, finite)."""

    def __init__(self, span: Span) -> None:
        self.span = span
        self.values = torch.empty(span.size, dtype=torch.float32)
        self.filled = 0
        self.meta: StateMeta | None = None
        self.sha = b""
        self.asked = time.monotonic()
        self.first_s = 0.0

    def add(self, meta: StateMeta, offset: int, sha: bytes, data: bytes) -> None:
        if self.meta is None:
            self.meta, self.sha = meta, sha
            self.first_s = time.monotonic() - self.asked
        if offset < self.span.start:
            raise InvalidMessage(f"state chunk at {offset} before the range {self.span.start}", "bad_offset")
        self.filled = fill_values(self.values, offset - self.span.start, self.span.size, data, self.filled)

    def result(self, address: str) -> StatePart:
        if self.meta is None or self.filled != self.span.size:
            raise PeerUnavailable(f"{address} ended its state range early ({self.filled}/{self.span.size})")
        part = StatePart(self.meta, self.span, self.values, self.first_s)
        verify_part(part, self.sha)
        return part


def _decode_state_chunk(raw: bytes) -> peer_pb2.StateChunk:
    try:
        return peer_pb2.StateChunk.FromString(raw)
    except DecodeError:
        raise InvalidMessage("undecodable StateChunk", "malformed") from None


def state_fields(c: peer_pb2.StateChunk) -> tuple:
    """What the reply proof covers of a StateChunk: every field, the data by its
    length (the range's sha256, covered here, checks the data)."""
    return c.round, c.step, c.offset, c.total, c.progress, c.sha256, c.params, len(c.data), c.extra


def _decode_segment_chunk(raw: bytes, round_: int, segment: int) -> ChunkView:
    try:
        chunk = decode_segment_chunk(raw)
    except ValueError as exc:
        raise InvalidMessage(str(exc), "malformed") from None
    if chunk.round != round_ or chunk.segment != segment:
        raise InvalidMessage(
            f"partner sent segment {chunk.segment} of round {chunk.round}, asked for {segment} of {round_}",
            "wrong_segment")
    return chunk


class GrpcTransport:
    """The client side. Segments go over the partner's bulk lane when it has one
    (peerd.worker.wire.bulk), else over gRPC. With `auth`, every request carries a
    proof of the job secret and every reply must carry one back (peerd.security.auth);
    with `tls`, every connection is mutual TLS. The bulk lane carries the same
    proofs under the same TLS."""

    def __init__(
        self, identity: Identity, auth: Authenticator | None = None, tls: TlsMaterial | None = None,
        rejections: Rejections | None = None, wire: str = "fp32", bulk: bool = True,
    ) -> None:
        self._identity = identity
        self._auth = auth
        self._tls = tls
        self._wire = wire
        self._channels: dict[str, grpc.aio.Channel] = {}
        self.rejections = rejections or Rejections(log)
        self._bulk = None
        if bulk:
            self._bulk = BulkClient(wire, auth, client_context(tls) if tls is not None else None,
                                    tls.server_name if tls is not None else "")
        self._lanes: dict[str, int] = {}  # exchange address -> its bulk port (0: none)

    def _channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = open_channel(address, self._tls, CHANNEL_OPTIONS)
            self._channels[address] = channel
        return channel

    def _call(self, address: str, method: str, request, timeout: float):
        """Start a raw-bytes stream call (no protobuf copies of the payload): the
        call, and the MAC its reply must carry (None without a secret)."""
        body = request.SerializeToString()
        metadata, reply = None, None
        if self._auth is not None:
            header, reply = self._auth.sign(method, body, audience=address)
            metadata = (header,)
        return self._channel(address).unary_stream(method)(body, timeout=timeout, metadata=metadata), reply

    async def fetch_segment(
        self, address: str, round_: int, segment: int, out: torch.Tensor, timeout: float, stage: int = 0
    ) -> None:
        request = peer_pb2.SegmentRequest(
            job=self._identity.job, fingerprint=self._identity.fingerprint, round=round_,
            segment=segment, peer_id=self._identity.peer_id, wait_s=timeout, stage=stage,
        )
        port = await self._lane(address, timeout)
        if port:
            try:
                await self._bulk.fetch(host_of(address), port, request, out, timeout, audience=address)
            except (InvalidMessage, Unauthenticated) as exc:
                self.rejections.record(address, exc.reason, str(exc))
                raise
            except PeerUnavailable:
                self._lanes.pop(address, None)  # look the lane up again next time: the worker may have restarted
                raise
            return
        filled = 0
        call, reply = self._call(address, FETCH_SEGMENT, request, timeout)
        try:
            async for raw in call:
                chunk = _decode_segment_chunk(raw, round_, segment)
                if reply is not None:
                    reply.update_fields(chunk.round, chunk.segment, chunk.offset, chunk.total, chunk.data.nbytes)
                filled = fill_values(out, chunk.offset, chunk.total, chunk.data, filled, stage_wire(stage, self._wire))
            if filled != out.numel():
                raise PeerUnavailable(f"{address} ended segment {segment} after {filled}/{out.numel()} elements")
            if reply is not None:
                reply.check(metadata_value(await call.trailing_metadata(), REPLY_KEY))
        except grpc.aio.AioRpcError as exc:
            raise self._translate(exc, address, reply) from None
        except (InvalidMessage, Unauthenticated) as exc:
            self.rejections.record(address, exc.reason, str(exc))
            raise
        finally:
            call.cancel()  # a bad chunk ends the stream here, so the partner stops sending (no-op when done)

    async def _lane(self, address: str, timeout: float) -> int:
        """The partner's bulk port, asked once per address; 0 when it has none."""
        if self._bulk is None:
            return 0
        port = self._lanes.get(address)
        if port is None:
            body = peer_pb2.LanesRequest(job=self._identity.job, fingerprint=self._identity.fingerprint
                                         ).SerializeToString()
            metadata, mac = None, None
            if self._auth is not None:
                header, mac = self._auth.sign(LANES, body, audience=address)
                metadata = (header,)
            call = self._channel(address).unary_unary(LANES)(body, timeout=timeout, metadata=metadata)
            try:
                raw = await call
                if mac is not None:
                    mac.update(raw)
                    mac.check(metadata_value(await call.trailing_metadata(), REPLY_KEY))
                port = peer_pb2.LanesReply.FromString(raw).bulk_port
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                    raise self._translate(exc, address, mac) from None
                port = 0  # a peer from before bulk lanes
            except DecodeError:
                raise InvalidMessage(f"{address} sent an undecodable LanesReply", "malformed") from None
            except Unauthenticated as exc:
                self.rejections.record(address, exc.reason, str(exc))
                raise
            told = address in self._lanes  # by a lookup that ran alongside this one
            port = self._lanes[address] = port if 0 < port < 65536 else 0
            if not told:
                how = f"its bulk lane (port {port}{', TLS' if self._tls else ''})" if port else "gRPC (it has no bulk lane)"
                log.info("segments from %s over %s", address, how)
        return self._lanes[address]

    async def fetch_state(self, address: str, span: Span, timeout: float) -> StatePart:
        request = peer_pb2.StateRequest(
            job=self._identity.job, fingerprint=self._identity.fingerprint, peer_id=self._identity.peer_id,
            offset=span.start, length=span.size, wait_s=timeout / 2,
        )
        assembly = _StateAssembly(span)
        call, reply = self._call(address, FETCH_STATE, request, timeout)
        try:
            async for raw in call:
                c = _decode_state_chunk(raw)
                if reply is not None:
                    reply.update_fields(*state_fields(c))
                assembly.add(StateMeta(c.round, c.step, c.progress, c.extra), c.offset, c.sha256, c.data)
            if reply is not None:
                reply.check(metadata_value(await call.trailing_metadata(), REPLY_KEY))
            return assembly.result(address)
        except grpc.aio.AioRpcError as exc:
            raise self._translate(exc, address, reply) from None
        except (InvalidMessage, Unauthenticated) as exc:
            self.rejections.record(address, exc.reason, str(exc))
            raise
        finally:
            call.cancel()

    def _translate(self, exc: grpc.aio.AioRpcError, address: str, reply: ReplyMac | None) -> Exception:
        code, details = exc.code(), exc.details()
        if code == grpc.StatusCode.FAILED_PRECONDITION:
            return JobMismatch(f"{address} refused: {details}")
        if code == grpc.StatusCode.UNAUTHENTICATED:
            return Unauthenticated(f"{address} refused this peer's proof: {details}", "refused")
        if code == grpc.StatusCode.ABORTED:
            meta = exc.trailing_metadata() or ()
            current = metadata_value(meta, ROUND_KEY) or ""
            if not current.isdigit():
                return PeerUnavailable(f"{address}: ABORTED without a round: {details}")
            if reply is not None:  # a round we would jump to must come from a holder of the secret
                try:
                    reply.check(metadata_value(meta, REPLY_KEY), f"ABORTED:{current}")
                except Unauthenticated as bad:
                    self.rejections.record(address, bad.reason, str(bad))
                    return bad
            return RoundMismatch(f"{address}: {details}", int(current))
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            self.rejections.record(address, "oversize", details or "")
        return PeerUnavailable(f"{address}: {code.name}: {details}")

    async def aclose(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        await asyncio.gather(*(c.close() for c in channels), return_exceptions=True)
        if self._bulk is not None:
            await self._bulk.aclose()


class MemoryTransport:
    """Workers of one process, found by address in a shared dict: the exchange
    logic without a network."""

    def __init__(
        self, identity: Identity, servers: dict[str, SegmentServer],
        state_servers: dict[str, StateServer] | None = None, wire: str = "fp32",
    ) -> None:
        self._identity = identity
        self._wire = wire
        self._servers = servers
        self._state_servers = state_servers or {}

    def _server(self, address: str) -> SegmentServer:
        server = self._servers.get(address)
        if server is None:
            raise PeerUnavailable(f"no worker at {address}")
        return server

    async def fetch_segment(
        self, address: str, round_: int, segment: int, out: torch.Tensor, timeout: float, stage: int = 0
    ) -> None:
        async def pull() -> None:
            filled = 0
            chunks = self._server(address).segment(
                self._identity.job, self._identity.fingerprint, round_, segment, timeout, stage
            )
            async with aclosing(chunks):
                async for offset, total, data in chunks:  # checked as the bulk lane checks
                    filled = fill_values(out, offset, total, data, filled, stage_wire(stage, self._wire),
                                         check_finite=stage not in ROUND_CHECKED_STAGES)

        try:
            await asyncio.wait_for(pull(), timeout)
        except TimeoutError:
            raise PeerUnavailable(f"{address}: deadline exceeded") from None

    async def fetch_state(self, address: str, span: Span, timeout: float) -> StatePart:
        assembly = _StateAssembly(span)
        state = self._state_servers.get(address)
        if state is None:
            raise PeerUnavailable(f"no worker at {address}")
        chunks = state.state(self._identity.job, self._identity.fingerprint, span.start, span.size, timeout / 2)
        async with aclosing(chunks):
            async for meta, offset, _, sha, data in chunks:
                assembly.add(meta, offset, sha, data)
        return assembly.result(address)

    async def aclose(self) -> None:
        pass
