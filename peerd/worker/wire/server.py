"""The serving side of the exchange: a worker's gRPC Exchange service (segments,
state, the Lanes lookup) and its bulk lane beside it, started and stopped together.
Requests arrive as raw bytes and are checked for proof, parsed and validated here;
peerd errors become status codes here only."""

from __future__ import annotations

import logging
import math
from contextlib import aclosing

import grpc
from google.protobuf.message import DecodeError

from peerd.security.auth import AUTH_KEY, REPLY_KEY, Authenticator, ReplyMac, metadata_value
from peerd.core.names import join_host_port
from peerd.errors import InvalidMessage, JobMismatch, PeerdError, PeerUnavailable, RoundMismatch, Unauthenticated
from peerd.proto.v1 import peer_pb2
from peerd.security.rejections import Rejections
from peerd.security.tls import TlsMaterial, add_port
from peerd.worker.wire.bulk import BulkServer
from peerd.worker.wire.bulk_tls import server_context
from peerd.worker.wire.codec import encode_segment_chunk
from peerd.worker.wire.stores import SegmentServer, check_identity
from peerd.worker.state.pull import StateServer
from peerd.worker.wire.transport import (
    EXCHANGE_SERVICE, FETCH_SEGMENT, FETCH_STATE, KEEPALIVE, LANES, MAX_CHUNK_BYTES, MAX_REQUEST_BYTES, ROUND_KEY,
    state_fields,
)

log = logging.getLogger("peerd.worker")

MAX_WAIT_S = 60.0  # the longest a request may ask the callee to wait for a round
MAX_CONCURRENT_RPCS = 256
SERVER_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_REQUEST_BYTES),
    ("grpc.max_send_message_length", MAX_CHUNK_BYTES),
    *KEEPALIVE,
]


def _peer_host(context) -> str:
    """The caller's address without its (ephemeral) port, for logs."""
    peer = context.peer() or "unknown"
    return peer.rsplit(":", 1)[0] if peer.count(":") >= 2 else peer


class ExchangeServicer:
    """gRPC edge of a SegmentServer and a StateServer: requests arrive as raw
    bytes, are checked for proof of the secret, parsed and validated here; peerd
    errors become status codes here only."""

    def __init__(
        self, server: SegmentServer, state: StateServer, auth: Authenticator | None = None,
        rejections: Rejections | None = None,
    ) -> None:
        self._server = server
        self._state = state
        self._auth = auth
        self.rejections = rejections or Rejections(log)
        self.address = ""  # as callers dial it: their proofs are made for it
        self.bulk_port = 0  # this worker's bulk lane, told by Lanes (0: none)

    async def _refuse(self, context, code: grpc.StatusCode, reason: str, message: str) -> None:
        self.rejections.record(_peer_host(context), reason, message)
        await context.abort(code, message)

    async def _admit(self, method: str, raw: bytes, message_type, context):
        """The parsed request and the reply MAC (None without a secret), or abort."""
        reply = None
        if self._auth is not None:
            try:
                reply = self._auth.verify(
                    method, raw, metadata_value(context.invocation_metadata(), AUTH_KEY), self.address)
            except Unauthenticated as exc:
                await self._refuse(context, grpc.StatusCode.UNAUTHENTICATED, exc.reason, str(exc))
        try:
            request = message_type.FromString(raw)
        except DecodeError:
            await self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT, "malformed", "undecodable request")
        if not math.isfinite(request.wait_s):
            await self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT, "bad_request", "wait_s is not finite")
        remaining = context.time_remaining()
        wait_s = min(max(request.wait_s, 0.0), MAX_WAIT_S, remaining if remaining is not None else MAX_WAIT_S)
        return request, wait_s, reply

    def _finish(self, context, reply: ReplyMac | None) -> None:
        if reply is not None:
            context.set_trailing_metadata(((REPLY_KEY, reply.digest()),))

    async def _abort_peerd(self, context, exc: PeerdError, reply: ReplyMac | None) -> None:
        if isinstance(exc, RoundMismatch):
            current = str(max(exc.current_round, 0))
            trailer = [(ROUND_KEY, current)]
            if reply is not None:
                trailer.append((REPLY_KEY, reply.digest(f"ABORTED:{current}")))
            context.set_trailing_metadata(tuple(trailer))
            await context.abort(grpc.StatusCode.ABORTED, str(exc))
        if isinstance(exc, JobMismatch):
            await self._refuse(context, grpc.StatusCode.FAILED_PRECONDITION, "job_mismatch", str(exc))
        if isinstance(exc, InvalidMessage):
            await self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT, exc.reason, str(exc))
        await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))

    async def Lanes(self, raw: bytes, context) -> bytes:
        mac = None
        if self._auth is not None:
            try:
                mac = self._auth.verify(LANES, raw, metadata_value(context.invocation_metadata(), AUTH_KEY), self.address)
            except Unauthenticated as exc:
                await self._refuse(context, grpc.StatusCode.UNAUTHENTICATED, exc.reason, str(exc))
        try:
            request = peer_pb2.LanesRequest.FromString(raw)
            check_identity(self._server.identity, request.job, request.fingerprint)
        except DecodeError:
            await self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT, "malformed", "undecodable request")
        except JobMismatch as exc:
            await self._refuse(context, grpc.StatusCode.FAILED_PRECONDITION, "job_mismatch", str(exc))
        reply = peer_pb2.LanesReply(bulk_port=self.bulk_port).SerializeToString()
        if mac is not None:  # the port is covered too: a forged one could only point at a lane without the secret
            mac.update(reply)
            context.set_trailing_metadata(((REPLY_KEY, mac.digest()),))
        return reply

    async def FetchSegment(self, raw: bytes, context):
        request, wait_s, reply = await self._admit(FETCH_SEGMENT, raw, peer_pb2.SegmentRequest, context)
        try:
            # aclosing: a client that goes away (deadline, crash) must release the
            # snapshot it read at once, not whenever the generator is collected.
            async with aclosing(self._server.segment(
                request.job, request.fingerprint, request.round, request.segment, wait_s, request.stage
            )) as chunks:
                async for offset, total, data in chunks:
                    if reply is not None:
                        reply.update_fields(request.round, request.segment, offset, total, data.nbytes)
                    yield encode_segment_chunk(request.round, request.segment, offset, total, data)
        except PeerdError as exc:
            await self._abort_peerd(context, exc, reply)
        self._finish(context, reply)

    async def FetchState(self, raw: bytes, context):
        request, wait_s, reply = await self._admit(FETCH_STATE, raw, peer_pb2.StateRequest, context)
        try:
            async with aclosing(self._state.state(
                request.job, request.fingerprint, request.offset, request.length, wait_s, request.peer_id[:64]
            )) as chunks:
                async for meta, offset, total, sha, data in chunks:
                    chunk = peer_pb2.StateChunk(
                        round=meta.round, step=meta.step, progress=meta.progress, offset=offset,
                        total=total, params=self._state.board.params, sha256=sha, data=data,
                        extra=meta.extra if sha else b"",
                    )
                    if reply is not None:
                        reply.update_fields(*state_fields(chunk))
                    yield chunk.SerializeToString()
        except PeerdError as exc:
            await self._abort_peerd(context, exc, reply)
        self._finish(context, reply)


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
    server: SegmentServer, state: StateServer, host: str, port: int = 0, *,
    auth: Authenticator | None = None, tls: TlsMaterial | None = None, rejections: Rejections | None = None,
    bulk: bool = True,
) -> tuple[ExchangeServer, str]:
    """Serve segments and state on host:port (0: any free port), and segments on
    a bulk lane beside it (with the same proofs, and the same mutual TLS when
    configured); returns the server and its gRPC address."""
    grpc_server = grpc.aio.server(options=SERVER_OPTIONS, maximum_concurrent_rpcs=MAX_CONCURRENT_RPCS)
    servicer = ExchangeServicer(server, state, auth, rejections)
    lane = None
    if bulk:
        lane = BulkServer(server, auth, servicer.rejections, tls=server_context(tls) if tls is not None else None)
    if lane is not None:
        servicer.bulk_port = await lane.start(host)
    # Registered by hand, with no (de)serializers: requests are checked against
    # their proof as the bytes that came, and chunks go out as peerd.worker.wire.codec
    # encoded them.
    handlers = {
        "FetchSegment": grpc.unary_stream_rpc_method_handler(servicer.FetchSegment),
        "FetchState": grpc.unary_stream_rpc_method_handler(servicer.FetchState),
        "Lanes": grpc.unary_unary_rpc_method_handler(servicer.Lanes),
    }
    grpc_server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(EXCHANGE_SERVICE, handlers),))
    bound = add_port(grpc_server, join_host_port(host, port), tls)
    if bound == 0:
        if lane is not None:
            await lane.close()
        raise PeerUnavailable(f"cannot bind the exchange service to {join_host_port(host, port)}")
    await grpc_server.start()
    servicer.address = join_host_port(host, bound)
    if lane is not None:
        lane.audience = servicer.address  # what callers' proofs name
    return ExchangeServer(grpc_server, lane), servicer.address
