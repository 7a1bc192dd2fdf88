"""The bulk lane: segment values as raw bytes over TCP (mutual TLS with [tls]), beside gRPC.

gRPC copies every received message twice in its Cython layer and frames each
chunk in HTTP/2; at 64 MiB per round that kept the exchange at 3× gloo's time
(docs/benchmarks.md). The bulk lane carries the same SegmentRequest over a
socket of its own and answers with a fixed header and the values: the server
sends straight from its snapshot, the client receives straight into the tensor
it fills. gRPC keeps everything else (state transfer, the Lanes lookup) and is
the fallback for a partner without a lane. With TLS the frames travel inside a
TLS 1.3 connection with gRPC's certificates (peerd.worker.wire.bulk_tls).

Frames, little-endian (docs/protocol.md):
  request:      u32 n, n bytes of SegmentRequest (protobuf)
                [with a job secret: u32 m, m bytes of proof, as in gRPC's peerd-auth]
  reply, ok:    u8 0, u64 elements, then the values in the job's wire dtype (fp32 for stage 3;
                int8: peerd.worker.wire.quant's records)
  reply, error: u8 kind (BulkError: 1 job mismatch, 2 round mismatch, 3 unavailable,
                4 unauthenticated), i64 the server's round, u32 n, n bytes of UTF-8 message
                [with a job secret, either reply ends in the 32-byte reply proof]

This module holds the frames and the server; the client is peerd.worker.wire.bulk_client.
"""

from __future__ import annotations

import asyncio
import enum
import hmac
import logging
import math
import socket
import ssl
import struct
from contextlib import aclosing

from google.protobuf.message import DecodeError

from peerd.security.auth import Authenticator, ReplyMac
from peerd.errors import InvalidMessage, JobMismatch, PeerdError, PeerUnavailable, RoundMismatch, Unauthenticated
from peerd.proto.v1 import peer_pb2
from peerd.security.rejections import Rejections
from peerd.worker.wire.bulk_tls import HandshakeFailed, Stream, handshake
from peerd.worker.wire.stores import SegmentServer

log = logging.getLogger("peerd.worker")

LENGTH = struct.Struct("<I")
OK_HEADER = struct.Struct("<BQ")
ERROR_HEADER = struct.Struct("<BqI")


class BulkError(enum.IntEnum):
    """The kind byte of an error reply."""

    JOB_MISMATCH = 1
    ROUND_MISMATCH = 2
    UNAVAILABLE = 3
    UNAUTHENTICATED = 4  # the server closes the connection after this one


_KIND = {JobMismatch: BulkError.JOB_MISMATCH, RoundMismatch: BulkError.ROUND_MISMATCH,
         PeerUnavailable: BulkError.UNAVAILABLE}
MAC_BYTES = 32  # a reply proof (HMAC-SHA256)
BULK_METHOD = "bulk:FetchSegment"  # what a lane request's proof names: not valid for a gRPC call
MAX_PROOF_BYTES = 256
MAX_REQUEST_BYTES = 4096  # a SegmentRequest is ~100 bytes; anything bigger is not one
MAX_WAIT_S = 120.0  # a caller cannot hold a server's snapshot longer than this


class _Closed(ConnectionError):
    """The other side closed the connection between frames."""


async def _recv_exact(loop: asyncio.AbstractEventLoop, conn: Stream, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = await conn.recv_into(loop, view[got:])
        if n == 0:
            raise _Closed() if got == 0 else ConnectionError("connection closed mid-frame")
        got += n


async def _recv_bytes(loop: asyncio.AbstractEventLoop, conn: Stream, n: int) -> bytes:
    buffer = bytearray(n)
    await _recv_exact(loop, conn, memoryview(buffer))
    return bytes(buffer)


def _host(sock: socket.socket) -> str:
    try:
        return sock.getpeername()[0]
    except OSError:
        return "unknown"


def reply_fields(request, total: int, nbytes: int) -> tuple:
    """What an ok reply's proof covers: the values by their count and length, as
    gRPC's reply proof covers its chunks (docs/protocol.md)."""
    return (request.round, request.segment, 0, total, nbytes)


def mac_ok(expected_hex: str, received: bytes) -> bool:
    return len(received) == MAC_BYTES and hmac.compare_digest(bytes.fromhex(expected_hex), received)


class BulkServer:
    """Serves a SegmentServer's segments on a TCP port. With `auth`, every
    request must carry proof of the job secret made for `audience` (the worker's
    gRPC exchange address, which callers dial), and every reply carries one.
    With `tls` (a server context), every connection is mutual TLS first; a failed
    handshake is counted in `tls_refusals` and logged once per host a minute."""

    def __init__(self, segments: SegmentServer, auth: Authenticator | None = None,
                 rejections=None, tls: ssl.SSLContext | None = None) -> None:
        self._segments = segments
        self._auth = auth
        self._rejections = rejections
        self._tls = tls
        self.tls_refusals = Rejections(log, what="TLS handshake failed on the bulk lane with")
        self.audience = ""
        self._sock: socket.socket | None = None
        self._accepting: asyncio.Task | None = None
        self._connections: set[asyncio.Task] = set()

    async def start(self, host: str) -> int:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, 0))
        sock.listen(64)
        sock.setblocking(False)
        self._sock = sock
        self._accepting = asyncio.create_task(self._accept())
        return sock.getsockname()[1]

    async def close(self) -> None:
        tasks = [t for t in (self._accepting, *self._connections) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._sock is not None:
            self._sock.close()

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            conn, _ = await loop.sock_accept(self._sock)
            conn.setblocking(False)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            task = asyncio.create_task(self._serve(conn))
            self._connections.add(task)
            task.add_done_callback(self._connections.discard)

    async def _open(self, sock: socket.socket) -> Stream | None:
        """The connection as a Stream: at once when plain, after the handshake
        under TLS; None (counted, logged, closed) when the handshake fails."""
        if self._tls is None:
            return Stream(sock)
        host = _host(sock)
        try:
            tls_sock = self._tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        except (OSError, ValueError):
            sock.close()
            return None
        try:
            await handshake(tls_sock)
        except BaseException as exc:
            tls_sock.close()
            if not isinstance(exc, HandshakeFailed):
                raise
            self.tls_refusals.record(host, "tls", exc.reason)
            return None
        return Stream(tls_sock)

    async def _serve(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        conn = await self._open(sock)
        if conn is None:
            return
        try:
            while True:
                size, = LENGTH.unpack(await _recv_bytes(loop, conn, LENGTH.size))
                if not 0 < size <= MAX_REQUEST_BYTES:
                    return  # not our protocol: drop the connection
                body = await _recv_bytes(loop, conn, size)
                reply = None
                if self._auth is not None:
                    proof_size, = LENGTH.unpack(await _recv_bytes(loop, conn, LENGTH.size))
                    if proof_size > MAX_PROOF_BYTES:
                        return
                    proof = (await _recv_bytes(loop, conn, proof_size)).decode(errors="replace")
                    try:
                        reply = self._auth.verify(BULK_METHOD, body, proof, self.audience)
                    except Unauthenticated as exc:
                        self._reject(conn, exc.reason, str(exc))
                        message = str(exc).encode()[:4096]
                        await conn.sendall(loop, ERROR_HEADER.pack(BulkError.UNAUTHENTICATED, -1, len(message)) + message)
                        return  # no proof to answer with: the connection ends here
                request = peer_pb2.SegmentRequest.FromString(body)
                await self._answer(loop, conn, request, reply)
        except (_Closed, ConnectionError, OSError, DecodeError):
            pass  # the client went away or spoke garbage: nothing to answer
        finally:
            conn.close()

    def _reject(self, conn: Stream, reason: str, detail: str) -> None:
        if self._rejections is not None:
            self._rejections.record(_host(conn.sock), reason, detail)

    async def _answer(self, loop: asyncio.AbstractEventLoop, conn: Stream, request,
                      reply: ReplyMac | None) -> None:
        started = False
        try:
            if not math.isfinite(request.wait_s):  # refused as gRPC refuses it (server.py)
                self._reject(conn, "bad_request", "wait_s is not finite")
                raise InvalidMessage("wait_s is not finite", "bad_request")
            wait_s = min(max(request.wait_s, 0.0), MAX_WAIT_S)
            chunks = self._segments.segment(
                request.job, request.fingerprint, request.round, request.segment, wait_s, request.stage,
                chunk_elems=1 << 62)  # the whole segment in one piece: one send
            async with aclosing(chunks):
                async for _, total, data in chunks:
                    await conn.sendall(loop, OK_HEADER.pack(0, total))
                    started = True
                    # Sends stay on the event loop: a thread blocked on a full send
                    # buffer could hold the threads the partner's reads need.
                    values = memoryview(data).cast("B")
                    await conn.sendall(loop, values)
                    if reply is not None:
                        reply.update_fields(request.round, request.segment, 0, total, values.nbytes)
                        await conn.sendall(loop, bytes.fromhex(reply.digest()))
        except PeerdError as exc:
            if started:
                raise ConnectionError("failed mid-segment") from exc
            kind = next((k for cls, k in _KIND.items() if isinstance(exc, cls)), BulkError.UNAVAILABLE)
            message = str(exc).encode()[:4096]
            current = getattr(exc, "current_round", -1)
            mac = bytes.fromhex(reply.digest(f"{int(kind)}:{current}")) if reply is not None else b""
            await conn.sendall(loop, ERROR_HEADER.pack(kind, current, len(message)) + message + mac)
