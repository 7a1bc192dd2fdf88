"""How a worker fetches from its partners: one small interface, two transports.

`GrpcTransport` is the real one; `MemoryTransport` wires workers of one process
together with no network, for tests of the exchange logic.
"""

from __future__ import annotations

import asyncio
from contextlib import aclosing
from typing import Protocol

import grpc
import numpy as np
import torch

from peerd.errors import JobMismatch, PeerUnavailable, RoundMismatch
from peerd.proto.v1 import peer_pb2, peer_pb2_grpc
from peerd.core.segments import Span
from peerd.worker.bulk import BulkClient, BulkServer, split_address
from peerd.worker.codec import decode_segment_chunk, encode_segment_chunk, fill_values
from peerd.worker.snapshots import Identity, SegmentServer, check_identity
from peerd.worker.state import StateMeta, StatePart, StateServer, verify_part

# Streams of ~1 MiB chunks; allow some headroom over the largest chunk.
MAX_MESSAGE_BYTES = 32 * 1024 * 1024
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
]


EXCHANGE_SERVICE = "peerd.v1.Exchange"
FETCH_SEGMENT = f"/{EXCHANGE_SERVICE}/FetchSegment"


class Transport(Protocol):
    async def fetch_segment(
        self, address: str, round_: int, segment: int, out: torch.Tensor, timeout: float, stage: int = 0
    ) -> None:
        """Fill `out` with the partner's segment of `round_` (at `stage`, see
        SegmentRequest) or raise a PeerdError."""

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

    def add(self, meta: StateMeta, offset: int, sha: bytes, data: bytes) -> None:
        if self.meta is None:
            self.meta, self.sha = meta, sha
        self.filled = fill_values(self.values, offset - self.span.start, self.span.size, data, self.filled)

    def result(self, address: str) -> StatePart:
        if self.meta is None or self.filled != self.span.size:
            raise PeerUnavailable(f"{address} ended its state range early ({self.filled}/{self.span.size})")
        part = StatePart(self.meta, self.span, self.values)
        verify_part(part, self.sha)
        return part


class GrpcTransport:
    """Segments over the partner's bulk lane when it has one, else over gRPC;
    state and lane lookups over gRPC."""

    def __init__(self, identity: Identity, wire: str = "fp32", bulk: bool = True) -> None:
        self._identity = identity
        self._wire = wire
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._bulk = BulkClient(wire) if bulk else None
        self._lanes: dict[str, int] = {}  # exchange address -> its bulk port (0: none)

    def _channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
            self._channels[address] = channel
        return channel

    def _stub(self, address: str) -> peer_pb2_grpc.ExchangeStub:
        return peer_pb2_grpc.ExchangeStub(self._channel(address))

    def _fetch_segment(self, address: str):
        # The generated stub would parse chunks with protobuf (two more copies of
        # the payload); this one hands over views into the received bytes.
        return self._channel(address).unary_stream(
            FETCH_SEGMENT, request_serializer=peer_pb2.SegmentRequest.SerializeToString,
            response_deserializer=decode_segment_chunk,
        )

    async def fetch_segment(
        self, address: str, round_: int, segment: int, out: torch.Tensor, timeout: float, stage: int = 0
    ) -> None:
        request = peer_pb2.SegmentRequest(
            job=self._identity.job, fingerprint=self._identity.fingerprint, round=round_,
            segment=segment, peer_id=self._identity.peer_id, wait_s=timeout, stage=stage,
        )
        port = await self._lane(address, timeout)
        if port:
            host = split_address(address)[0]
            try:
                await self._bulk.fetch(host, port, request, out, timeout)
            except PeerUnavailable:
                self._lanes.pop(address, None)  # look the lane up again next time: the worker may have restarted
                raise
            return
        filled = 0
        call = self._fetch_segment(address)(request, timeout=timeout)
        try:
            async for chunk in call:
                filled = fill_values(out, chunk.offset, chunk.total, chunk.data, filled, self._wire)
        except grpc.aio.AioRpcError as exc:
            raise _translate(exc, address) from None
        finally:
            call.cancel()  # a bad chunk ends the stream here, so the partner stops sending (no-op when done)
        if filled != out.numel():
            raise PeerUnavailable(f"{address} ended segment {segment} after {filled}/{out.numel()} elements")

    async def _lane(self, address: str, timeout: float) -> int:
        """The partner's bulk port, asked once per address; 0 when it has none."""
        if self._bulk is None:
            return 0
        port = self._lanes.get(address)
        if port is None:
            request = peer_pb2.LanesRequest(job=self._identity.job, fingerprint=self._identity.fingerprint)
            try:
                reply = await self._stub(address).Lanes(request, timeout=timeout)
                port = reply.bulk_port
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                    raise _translate(exc, address) from None
                port = 0  # a peer from before bulk lanes
            self._lanes[address] = port
        return port

    async def fetch_state(self, address: str, span: Span, timeout: float) -> StatePart:
        request = peer_pb2.StateRequest(
            job=self._identity.job, fingerprint=self._identity.fingerprint, peer_id=self._identity.peer_id,
            offset=span.start, length=span.size, wait_s=timeout / 2,
        )
        assembly = _StateAssembly(span)
        call = self._stub(address).FetchState(request, timeout=timeout)
        try:
            async for c in call:
                assembly.add(StateMeta(c.round, c.step, c.progress), c.offset, c.sha256, c.data)
        except grpc.aio.AioRpcError as exc:
            raise _translate(exc, address) from None
        finally:
            call.cancel()
        return assembly.result(address)

    async def aclose(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        await asyncio.gather(*(c.close() for c in channels), return_exceptions=True)
        if self._bulk is not None:
            self._bulk.close()


def _translate(exc: grpc.aio.AioRpcError, address: str) -> Exception:
    code, details = exc.code(), exc.details()
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return JobMismatch(f"{address} refused: {details}")
    if code == grpc.StatusCode.ABORTED:
        meta = dict(exc.trailing_metadata() or ())
        return RoundMismatch(f"{address}: {details}", int(meta.get("peerd-round", -1)))
    return PeerUnavailable(f"{address}: {code.name}: {details}")


class ExchangeServicer(peer_pb2_grpc.ExchangeServicer):
    """gRPC edge of a SegmentServer: peerd errors become status codes here only."""

    def __init__(self, server: SegmentServer, state: StateServer, bulk_port: int = 0) -> None:
        self._server = server
        self._state = state
        self.bulk_port = bulk_port

    async def Lanes(self, request, context):
        try:
            check_identity(self._server.identity, request.job, request.fingerprint)
        except JobMismatch as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        return peer_pb2.LanesReply(bulk_port=self.bulk_port)

    async def FetchSegment(self, request, context):
        try:
            # aclosing: a client that goes away (deadline, crash) must release the
            # snapshot it read at once, not whenever the generator is collected.
            async with aclosing(self._server.segment(
                request.job, request.fingerprint, request.round, request.segment, request.wait_s,
                request.stage,
            )) as chunks:
                async for offset, total, data in chunks:
                    yield encode_segment_chunk(request.round, request.segment, offset, total, data)
        except JobMismatch as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except RoundMismatch as exc:
            context.set_trailing_metadata((("peerd-round", str(exc.current_round)),))
            await context.abort(grpc.StatusCode.ABORTED, str(exc))

    async def FetchState(self, request, context):
        try:
            async with aclosing(self._state.state(
                request.job, request.fingerprint, request.offset, request.length, request.wait_s
            )) as chunks:
                async for meta, offset, total, sha, data in chunks:
                    yield peer_pb2.StateChunk(
                        round=meta.round, step=meta.step, progress=meta.progress, offset=offset,
                        total=total, params=self._state.board.params, sha256=sha, data=data,
                    )
        except JobMismatch as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except PeerUnavailable as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))


class ExchangeServer:
    """The gRPC server and the bulk lane of one worker, stopped together."""

    def __init__(self, grpc_server: grpc.aio.Server, bulk: BulkServer | None) -> None:
        self.grpc = grpc_server
        self.bulk = bulk

    async def stop(self, grace: float | None) -> None:
        if self.bulk is not None:
            await self.bulk.close()
        await self.grpc.stop(grace)


async def start_exchange_server(
    server: SegmentServer, state: StateServer, host: str, port: int = 0, bulk: bool = True
) -> tuple[ExchangeServer, str]:
    """Serve segments and state on host:port (0: any free port), and segments on a
    bulk lane beside it unless `bulk` is off; returns the server and its gRPC address."""
    grpc_server = grpc.aio.server(options=CHANNEL_OPTIONS)
    lane = BulkServer(server) if bulk else None
    servicer = ExchangeServicer(server, state, await lane.start(host) if lane else 0)
    # Registered by hand, not with add_ExchangeServicer_to_server: FetchSegment
    # yields chunks already encoded by peerd.worker.codec.
    handlers = {
        "FetchSegment": grpc.unary_stream_rpc_method_handler(
            servicer.FetchSegment, request_deserializer=peer_pb2.SegmentRequest.FromString),
        "FetchState": grpc.unary_stream_rpc_method_handler(
            servicer.FetchState, request_deserializer=peer_pb2.StateRequest.FromString,
            response_serializer=peer_pb2.StateChunk.SerializeToString),
        "Lanes": grpc.unary_unary_rpc_method_handler(
            servicer.Lanes, request_deserializer=peer_pb2.LanesRequest.FromString,
            response_serializer=peer_pb2.LanesReply.SerializeToString),
    }
    grpc_server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(EXCHANGE_SERVICE, handlers),))
    bound = grpc_server.add_insecure_port(_join(host, port))
    if bound == 0:
        if lane:
            await lane.close()
        raise PeerUnavailable(f"cannot bind the exchange service to {host}:{port}")
    await grpc_server.start()
    return ExchangeServer(grpc_server, lane), _join(host, bound)


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


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
                async for offset, total, data in chunks:
                    filled = fill_values(out, offset, total, data, filled, self._wire)

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
