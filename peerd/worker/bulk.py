"""The bulk lane: segment values as raw bytes over plain TCP, beside gRPC.

gRPC copies every received message twice in its Cython layer and frames each
chunk in HTTP/2; at 64 MiB per round that kept the exchange at 3× gloo's time
(docs/benchmarks.md). The bulk lane carries the same SegmentRequest over a
plain socket and answers with a fixed header and the values: the server sends
straight from its snapshot, the client receives straight into the tensor it
fills. gRPC keeps everything else (state transfer, the Lanes lookup) and is the
fallback for a partner without a lane.

Frames, little-endian (docs/protocol.md):
  request:      u32 n, n bytes of SegmentRequest (protobuf)
  reply, ok:    u8 0, u64 elements, then the values in the job's wire dtype
  reply, error: u8 kind (1 job mismatch, 2 round mismatch, 3 unavailable),
                i64 the server's round, u32 n, n bytes of UTF-8 message
"""

from __future__ import annotations

import asyncio
import socket
import struct
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing

import torch
from google.protobuf.message import DecodeError

from peerd.errors import JobMismatch, PeerdError, PeerUnavailable, RoundMismatch
from peerd.proto.v1 import peer_pb2
from peerd.worker.codec import fill_values
from peerd.worker.snapshots import SegmentServer

_LENGTH = struct.Struct("<I")
_OK = struct.Struct("<BQ")
_ERROR = struct.Struct("<BqI")
_KIND = {JobMismatch: 1, RoundMismatch: 2, PeerUnavailable: 3}
MAX_REQUEST_BYTES = 4096  # a SegmentRequest is ~100 bytes; anything bigger is not one
MAX_WAIT_S = 120.0  # a caller cannot hold a server's snapshot longer than this
_ITEMSIZE = {"fp32": 4, "fp16": 2, "bf16": 2}


class _Closed(Exception):
    """The other side closed the connection between frames."""


async def _recv_exact(loop: asyncio.AbstractEventLoop, sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = await loop.sock_recv_into(sock, view[got:])
        if n == 0:
            raise _Closed() if got == 0 else ConnectionError("connection closed mid-frame")
        got += n


async def _recv_bytes(loop: asyncio.AbstractEventLoop, sock: socket.socket, n: int) -> bytes:
    buffer = bytearray(n)
    await _recv_exact(loop, sock, memoryview(buffer))
    return bytes(buffer)


def _recv_blocking(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("connection closed mid-segment")
        got += n


_READERS = ThreadPoolExecutor(max_workers=8, thread_name_prefix="peerd-bulk")


async def _recv_payload(sock: socket.socket, view: memoryview) -> None:
    """Receive a segment's values in a thread: one blocking recv loop costs far
    less than an event-loop wake-up per socket read (docs/benchmarks.md). Its own
    threads, so the training step (in the default executor) never waits for them.
    If the caller gives up, the socket is shut down so the thread stops writing
    into `view` before this returns."""
    sock.setblocking(True)
    thread = asyncio.get_running_loop().run_in_executor(_READERS, _recv_blocking, sock, view)
    try:
        await asyncio.shield(thread)
    except asyncio.CancelledError:
        sock.shutdown(socket.SHUT_RDWR)
        await asyncio.gather(thread, return_exceptions=True)
        raise
    finally:
        sock.setblocking(False)


def split_address(address: str) -> tuple[str, int]:
    """("host", port) from "host:port" or "[v6]:port"."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


class BulkServer:
    """Serves a SegmentServer's segments on a plain TCP port."""

    def __init__(self, segments: SegmentServer) -> None:
        self._segments = segments
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

    async def _serve(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                size, = _LENGTH.unpack(await _recv_bytes(loop, conn, _LENGTH.size))
                if not 0 < size <= MAX_REQUEST_BYTES:
                    return  # not our protocol: drop the connection
                request = peer_pb2.SegmentRequest.FromString(await _recv_bytes(loop, conn, size))
                await self._answer(loop, conn, request)
        except (_Closed, ConnectionError, OSError, DecodeError):
            pass  # the client went away or spoke garbage: nothing to answer
        finally:
            conn.close()

    async def _answer(self, loop: asyncio.AbstractEventLoop, conn: socket.socket, request) -> None:
        wait_s = min(max(float(request.wait_s), 0.0), MAX_WAIT_S)  # NaN → 0
        chunks = self._segments.segment(
            request.job, request.fingerprint, request.round, request.segment, wait_s, request.stage,
            chunk_elems=1 << 62)  # the whole segment in one piece: one send
        started = False
        try:
            async with aclosing(chunks):
                async for _, total, data in chunks:
                    await loop.sock_sendall(conn, _OK.pack(0, total))
                    started = True
                    # Sends stay on the event loop: a thread blocked on a full send
                    # buffer could hold the threads the partner's reads need.
                    await loop.sock_sendall(conn, memoryview(data).cast("B"))
        except PeerdError as exc:
            if started:
                raise ConnectionError("failed mid-segment") from exc
            kind = next((k for cls, k in _KIND.items() if isinstance(exc, cls)), 3)
            message = str(exc).encode()[:4096]
            current = getattr(exc, "current_round", -1)
            await loop.sock_sendall(conn, _ERROR.pack(kind, current, len(message)) + message)


class BulkClient:
    """Fetches segments over bulk lanes, keeping idle connections for reuse."""

    def __init__(self, wire: str = "fp32") -> None:
        self._wire = wire
        self._idle: dict[tuple[str, int], list[socket.socket]] = {}

    async def fetch(self, host: str, port: int, request, out: torch.Tensor, timeout: float) -> None:
        key = (host, port)
        idle = self._idle.get(key)
        sock = idle.pop() if idle else None
        reusable = False
        try:
            async with asyncio.timeout(timeout):
                if sock is None:
                    sock = await self._connect(host, port)
                reusable = await self._exchange(sock, request, out)
        except TimeoutError:
            raise PeerUnavailable(f"{host}:{port}: deadline exceeded") from None
        except (ConnectionError, OSError) as exc:
            raise PeerUnavailable(f"{host}:{port}: {exc}") from None
        finally:
            if sock is not None:
                if reusable:
                    self._idle.setdefault(key, []).append(sock)
                else:
                    sock.close()

    async def _connect(self, host: str, port: int) -> socket.socket:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            await asyncio.get_running_loop().sock_connect(sock, (host, port))
        except BaseException:
            sock.close()
            raise
        return sock

    async def _exchange(self, sock: socket.socket, request, out: torch.Tensor) -> bool:
        """One request and its whole reply; True if the connection is clean for
        another request. A refusal is raised after its frame is read."""
        loop = asyncio.get_running_loop()
        body = request.SerializeToString()
        await loop.sock_sendall(sock, _LENGTH.pack(len(body)) + body)
        kind = (await _recv_bytes(loop, sock, 1))[0]
        if kind != 0:
            rest = await _recv_bytes(loop, sock, _ERROR.size - 1)
            _, current, size = _ERROR.unpack(bytes([kind]) + rest)
            message = (await _recv_bytes(loop, sock, min(size, 4096))).decode(errors="replace")
            if kind == 2:
                raise RoundMismatch(message, current)
            raise (JobMismatch if kind == 1 else PeerUnavailable)(message)
        total, = struct.unpack("<Q", await _recv_bytes(loop, sock, 8))
        if total != out.numel():
            # The values that follow are not read: the connection is dropped (returns not reached).
            raise JobMismatch(f"partner sent a segment of {total} elements, expected {out.numel()}")
        if self._wire == "fp32":
            await _recv_payload(sock, memoryview(out.numpy()).cast("B"))  # straight into the tensor
        else:
            raw = bytearray(total * _ITEMSIZE[self._wire])
            await _recv_payload(sock, memoryview(raw))
            fill_values(out, 0, total, raw, 0, self._wire)
        return True

    def close(self) -> None:
        for sockets in self._idle.values():
            for sock in sockets:
                sock.close()
        self._idle.clear()
