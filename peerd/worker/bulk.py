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
import threading
from contextlib import aclosing

import torch
from google.protobuf.message import DecodeError

from peerd.errors import InvalidMessage, JobMismatch, PeerdError, PeerUnavailable, RoundMismatch
from peerd.proto.v1 import peer_pb2
from peerd.worker.codec import all_finite, fill_values
from peerd.worker.snapshots import SegmentServer

_LENGTH = struct.Struct("<I")
_OK = struct.Struct("<BQ")
_ERROR = struct.Struct("<BqI")
_KIND = {JobMismatch: 1, RoundMismatch: 2, PeerUnavailable: 3}
MAX_REQUEST_BYTES = 4096  # a SegmentRequest is ~100 bytes; anything bigger is not one
MAX_WAIT_S = 120.0  # a caller cannot hold a server's snapshot longer than this
_ITEMSIZE = {"fp32": 4, "fp16": 2, "bf16": 2}


class _Closed(ConnectionError):
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


def _read_reply(sock: socket.socket, into: memoryview | None, expected: int, itemsize: int):
    """One whole reply frame, read with blocking calls: ("error", kind, round,
    message), ("length", total) for a segment of the wrong size (its values left
    unread), or ("ok", raw) with the values in `into` (raw is None) or in raw."""
    head = bytearray(_OK.size)
    _recv_blocking(sock, memoryview(head)[:1])
    if head[0] != 0:
        rest = bytearray(_ERROR.size - 1)
        _recv_blocking(sock, memoryview(rest))
        _, current, size = _ERROR.unpack(bytes(head[:1]) + rest)
        message = bytearray(min(size, 4096))
        _recv_blocking(sock, memoryview(message))
        return "error", head[0], current, message.decode(errors="replace")
    _recv_blocking(sock, memoryview(head)[1:])
    _, total = _OK.unpack(head)
    if total != expected:
        return "length", total
    raw = None if into is not None else bytearray(total * itemsize)
    _recv_blocking(sock, into if into is not None else memoryview(raw))
    return "ok", raw


async def _in_thread(sock: socket.socket, work, timeout: float):
    """Run `work()` (blocking reads on `sock`) in a thread of its own: one
    blocking loop costs far less than an event-loop wake-up per socket read
    (docs/benchmarks.md), and the training step (in the default executor) never
    waits behind it. The thread is a daemon with the fetch's timeout on its
    socket, so it can neither outlive the deadline nor hold the process at exit;
    if the caller gives up first, the socket is shut down so the thread stops
    writing into the caller's buffer before this returns."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def settle(value, exc: BaseException | None) -> None:
        if not done.done():
            done.set_exception(exc) if exc else done.set_result(value)

    def run() -> None:
        value, exc = None, None
        try:
            value = work()
        except BaseException as e:  # handed to the awaiting task
            exc = e
        try:
            loop.call_soon_threadsafe(settle, value, exc)
        except RuntimeError:
            pass  # the loop is gone: nobody waits any more

    sock.settimeout(max(timeout, 0.001))
    threading.Thread(target=run, name="peerd-bulk-recv", daemon=True).start()
    try:
        return await asyncio.shield(done)
    except asyncio.CancelledError:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        await asyncio.gather(done, return_exceptions=True)
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
        # One transfer at a time per partner and stage: concurrent streams from one
        # peer share the same link anyway, and their receive threads fight over the
        # GIL (8 at once took ~2x as long as 1 after another: docs/benchmarks.md).
        # Per stage, because a hierarchical stage-2 fetch waits for the partner to
        # finish stage 1, which may need this peer's stage-1 fetch to go through.
        self._busy: dict[tuple[str, int, int], asyncio.Lock] = {}

    async def fetch(self, host: str, port: int, request, out: torch.Tensor, timeout: float) -> None:
        key = (host, port)
        try:
            async with asyncio.timeout(timeout):
                await self._busy.setdefault((*key, request.stage), asyncio.Lock()).acquire()
        except TimeoutError:
            raise PeerUnavailable(f"{host}:{port}: deadline exceeded waiting for the partner's lane") from None
        try:
            await self._fetch(key, request, out, max(timeout, 0.0))
        finally:
            self._busy[(*key, request.stage)].release()

    async def _fetch(self, key: tuple[str, int], request, out: torch.Tensor, timeout: float) -> None:
        host, port = key
        idle = self._idle.get(key)
        sock = idle.pop() if idle else None
        reusable = False
        try:
            async with asyncio.timeout(timeout):
                if sock is not None:
                    try:
                        reusable = await self._exchange(sock, request, out, timeout)
                        return
                    except ConnectionError:  # the partner closed this idle connection (it went away): once more, fresh
                        sock.close()
                sock = await self._connect(host, port)
                reusable = await self._exchange(sock, request, out, timeout)
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

    async def _exchange(self, sock: socket.socket, request, out: torch.Tensor, timeout: float) -> bool:
        """One request and its whole reply; True if the connection is clean for
        another request. A refusal is raised after its frame is read."""
        loop = asyncio.get_running_loop()
        body = request.SerializeToString()
        await loop.sock_sendall(sock, _LENGTH.pack(len(body)) + body)
        into = memoryview(out.numpy()).cast("B") if self._wire == "fp32" else None  # straight into the tensor
        reply = await _in_thread(sock, lambda: _read_reply(sock, into, out.numel(), _ITEMSIZE[self._wire]), timeout)
        if reply[0] == "error":
            _, kind, current, message = reply
            if kind == 2:
                raise RoundMismatch(message, current)
            raise (JobMismatch if kind == 1 else PeerUnavailable)(message)
        if reply[0] == "length":
            # The values that follow are not read: the connection is dropped (returns not reached).
            raise InvalidMessage(f"partner sent a segment of {reply[1]} elements, expected {out.numel()}",
                                 "wrong_length")
        raw = reply[1]
        if raw is None:
            if not all_finite(out):
                raise InvalidMessage("partner sent non-finite values", "non_finite")
        else:
            fill_values(out, 0, out.numel(), raw, 0, self._wire)
        return True

    def close(self) -> None:
        for sockets in self._idle.values():
            for sock in sockets:
                sock.close()
        self._idle.clear()
