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
                [with a job secret: u32 m, m bytes of proof, as in gRPC's peerd-auth]
  reply, ok:    u8 0, u64 elements, then the values in the job's wire dtype
  reply, error: u8 kind (BulkError: 1 job mismatch, 2 round mismatch, 3 unavailable,
                4 unauthenticated), i64 the server's round, u32 n, n bytes of UTF-8 message
                [with a job secret, either reply ends in the 32-byte reply proof]
"""

from __future__ import annotations

import asyncio
import enum
import hmac
import os
import queue
import socket
import struct
import threading
import time
from contextlib import aclosing

import torch
from google.protobuf.message import DecodeError

from peerd.auth import Authenticator, ReplyMac
from peerd.errors import InvalidMessage, JobMismatch, PeerdError, PeerUnavailable, RoundMismatch, Unauthenticated
from peerd.proto.v1 import peer_pb2
from peerd.worker.codec import all_finite, fill_values
from peerd.worker.snapshots import SegmentServer

_LENGTH = struct.Struct("<I")
_OK = struct.Struct("<BQ")
_ERROR = struct.Struct("<BqI")


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
IDLE_S = 60.0  # a connection unused this long is closed (its reader thread ends)
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


def _read_reply(sock: socket.socket, into: memoryview | None, expected: int, itemsize: int, mac_bytes: int):
    """One whole reply frame, read with blocking calls: ("error", kind, round,
    message, mac), ("length", total) for a segment of the wrong size (its values
    left unread), or ("ok", raw, total, mac) with the values in `into` (raw is
    None) or in raw. `mac` is the reply proof (b"" when mac_bytes is 0)."""
    head = bytearray(_OK.size)
    _recv_blocking(sock, memoryview(head)[:1])
    if head[0] != 0:
        rest = bytearray(_ERROR.size - 1)
        _recv_blocking(sock, memoryview(rest))
        _, current, size = _ERROR.unpack(bytes(head[:1]) + rest)
        if size > 4096:
            raise ConnectionError(f"error message of {size} bytes")
        message = bytearray(size)
        _recv_blocking(sock, memoryview(message))
        mac = _recv_mac(sock, mac_bytes if head[0] != BulkError.UNAUTHENTICATED else 0)  # a refused proof gets none back
        return "error", head[0], current, message.decode(errors="replace"), mac
    _recv_blocking(sock, memoryview(head)[1:])
    _, total = _OK.unpack(head)
    if total != expected:
        return "length", total
    raw = None if into is not None else bytearray(total * itemsize)
    _recv_blocking(sock, into if into is not None else memoryview(raw))
    return "ok", raw, total, _recv_mac(sock, mac_bytes)


def _recv_mac(sock: socket.socket, n: int) -> bytes:
    mac = bytearray(n)
    _recv_blocking(sock, memoryview(mac))
    return bytes(mac)


def _reply_fields(request, total: int, itemsize: int) -> tuple:
    """What an ok reply's proof covers: the values by their count and length, as
    gRPC's reply proof covers its chunks (docs/protocol.md)."""
    return (request.round, request.segment, 0, total, total * itemsize)


def _mac_ok(expected_hex: str, received: bytes) -> bool:
    return len(received) == MAC_BYTES and hmac.compare_digest(bytes.fromhex(expected_hex), received)


class BulkServer:
    """Serves a SegmentServer's segments on a plain TCP port. With `auth`, every
    request must carry proof of the job secret made for `audience` (the worker's
    gRPC exchange address, which callers dial), and every reply carries one."""

    def __init__(self, segments: SegmentServer, auth: Authenticator | None = None,
                 rejections=None) -> None:
        self._segments = segments
        self._auth = auth
        self._rejections = rejections
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

    async def _serve(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                size, = _LENGTH.unpack(await _recv_bytes(loop, conn, _LENGTH.size))
                if not 0 < size <= MAX_REQUEST_BYTES:
                    return  # not our protocol: drop the connection
                body = await _recv_bytes(loop, conn, size)
                reply = None
                if self._auth is not None:
                    proof_size, = _LENGTH.unpack(await _recv_bytes(loop, conn, _LENGTH.size))
                    if proof_size > MAX_PROOF_BYTES:
                        return
                    proof = (await _recv_bytes(loop, conn, proof_size)).decode(errors="replace")
                    try:
                        reply = self._auth.verify(BULK_METHOD, body, proof, self.audience)
                    except Unauthenticated as exc:
                        self._reject(conn, exc.reason, str(exc))
                        message = str(exc).encode()[:4096]
                        await loop.sock_sendall(conn, _ERROR.pack(BulkError.UNAUTHENTICATED, -1, len(message)) + message)
                        return  # no proof to answer with: the connection ends here
                request = peer_pb2.SegmentRequest.FromString(body)
                await self._answer(loop, conn, request, reply)
        except (_Closed, ConnectionError, OSError, DecodeError):
            pass  # the client went away or spoke garbage: nothing to answer
        finally:
            conn.close()

    def _reject(self, conn: socket.socket, reason: str, detail: str) -> None:
        if self._rejections is not None:
            try:
                host = conn.getpeername()[0]
            except OSError:
                host = "unknown"
            self._rejections.record(host, reason, detail)

    async def _answer(self, loop: asyncio.AbstractEventLoop, conn: socket.socket, request,
                      reply: ReplyMac | None) -> None:
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
                    values = memoryview(data).cast("B")
                    await loop.sock_sendall(conn, values)
                    if reply is not None:
                        reply.update_fields(request.round, request.segment, 0, total, values.nbytes)
                        await loop.sock_sendall(conn, bytes.fromhex(reply.digest()))
        except PeerdError as exc:
            if started:
                raise ConnectionError("failed mid-segment") from exc
            kind = next((k for cls, k in _KIND.items() if isinstance(exc, cls)), BulkError.UNAVAILABLE)
            message = str(exc).encode()[:4096]
            current = getattr(exc, "current_round", -1)
            mac = bytes.fromhex(reply.digest(f"{int(kind)}:{current}")) if reply is not None else b""
            await loop.sock_sendall(conn, _ERROR.pack(kind, current, len(message)) + message + mac)


class _Fetch:
    """One segment asked over a pipe: where its values go and who waits for them."""

    __slots__ = ("request", "frame", "out", "into", "deadline", "future", "reply")

    def __init__(self, request, frame: bytes, out: torch.Tensor, into: memoryview | None, deadline: float,
                 future: asyncio.Future, reply: ReplyMac | None) -> None:
        self.request, self.frame, self.out, self.into = request, frame, out, into
        self.deadline, self.future, self.reply = deadline, future, reply


def _retrieve(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()


def _settle(future: asyncio.Future, exc: BaseException | None) -> None:
    if not future.done():
        future.set_exception(exc) if exc else future.set_result(None)


class _Pipe:
    """One connection to a partner's lane for one stage, with requests pipelined.

    Requests go out as soon as they are asked for, so the partner never waits a
    round trip between segments; one reader thread takes the replies in order,
    straight into each caller's tensor, and checks them. A blocking loop in a
    thread costs far less than an event-loop wake-up per socket read, the
    training step (in the default executor) never waits behind it, and one
    thread per connection saves a thread start per segment. The thread ends
    when the connection breaks or stays idle for IDLE_S.
    """

    def __init__(self, sock: socket.socket, wire: str, auth: Authenticator | None) -> None:
        self._loop = asyncio.get_running_loop()
        self._wire = wire
        self._auth = auth
        self._sender = sock  # non-blocking, used by the event loop
        # The reader's own socket object on a duplicate descriptor: its timeout is
        # its own (both leave the shared descriptor non-blocking).
        self._reader = socket.socket(sock.family, sock.type, fileno=os.dup(sock.fileno()))
        self._queue: queue.SimpleQueue[_Fetch | None] = queue.SimpleQueue()  # None: stop
        self._guard = threading.Lock()  # `broken` and queueing decide together
        self.broken = False
        self._sending = asyncio.Lock()  # whole frames, in queue order
        self.stopped = self._loop.create_future()
        threading.Thread(target=self._read_loop, name="peerd-bulk-recv", daemon=True).start()

    async def fetch(self, request, out: torch.Tensor, timeout: float, audience: str) -> None:
        body = request.SerializeToString()
        frame, reply = _LENGTH.pack(len(body)) + body, None
        if self._auth is not None:
            (_, proof), reply = self._auth.sign(BULK_METHOD, body, audience=audience)
            frame += _LENGTH.pack(len(proof)) + proof.encode()
        into = memoryview(out.numpy()).cast("B") if self._wire == "fp32" else None  # straight into the tensor
        item = _Fetch(request, frame, out, into, time.monotonic() + timeout, self._loop.create_future(), reply)
        item.future.add_done_callback(_retrieve)  # settled after its caller gave up: not an error to log
        queued = False
        try:
            async with self._sending:
                with self._guard:
                    if self.broken:
                        raise ConnectionError("connection closed")
                    self._queue.put(item)
                    queued = True
                await self._loop.sock_sendall(self._sender, item.frame)
            await asyncio.shield(item.future)
        except BaseException:
            if queued and not item.future.done():
                # Given up (deadline, cancel) or failed to send with the reply still owed:
                # the connection is out of step, and the thread must stop writing into
                # `out` before the caller gets it back.
                await self.close()
            raise

    def _read_loop(self) -> None:
        item, error = None, None
        try:
            while True:
                try:
                    item = self._queue.get(timeout=IDLE_S)
                except queue.Empty:
                    return
                if item is None:
                    return
                self._reader.settimeout(max(item.deadline - time.monotonic(), 0.001))
                failure = self._receive(item)
                self._loop.call_soon_threadsafe(_settle, item.future, failure)
                item = None
        except BaseException as exc:  # the connection is gone or out of step
            error = exc
        finally:
            with self._guard:
                self.broken = True
            left = [item] if item is not None else []
            while not self._queue.empty():
                left.append(self._queue.get_nowait())
            left = [pending for pending in left if pending is not None]
            reason = ConnectionError(f"bulk lane closed: {error}") if error else ConnectionError("bulk lane closed")
            try:
                for pending in left:
                    self._loop.call_soon_threadsafe(_settle, pending.future, reason)
                self._loop.call_soon_threadsafe(_settle, self.stopped, None)
            except RuntimeError:
                pass  # the loop is gone: nobody waits any more
            self._reader.close()

    def _receive(self, item: _Fetch) -> BaseException | None:
        """Read one reply into `item`: None if it holds the values, else the error to
        raise. Raises if the connection cannot carry another reply."""
        itemsize = _ITEMSIZE[self._wire]
        mac_bytes = MAC_BYTES if item.reply is not None else 0
        reply = _read_reply(self._reader, item.into, item.out.numel(), itemsize, mac_bytes)
        if reply[0] == "error":
            _, kind, current, message, mac = reply
            if kind == BulkError.UNAUTHENTICATED:  # the partner closes the connection after this
                self._loop.call_soon_threadsafe(_settle, item.future, Unauthenticated(
                    f"partner refused this peer's proof: {message}", "refused"))
                raise ConnectionError("proof refused")
            if item.reply is not None and not _mac_ok(item.reply.digest(f"{kind}:{current}"), mac):
                return Unauthenticated("the reply's proof does not match the shared secret", "reply_bad_mac")
            if kind == BulkError.ROUND_MISMATCH:
                return RoundMismatch(message, current)
            return (JobMismatch if kind == BulkError.JOB_MISMATCH else PeerUnavailable)(message)
        if reply[0] == "length":
            # The values that follow are not read: the connection is dropped.
            self._loop.call_soon_threadsafe(_settle, item.future, InvalidMessage(
                f"partner sent a segment of {reply[1]} elements, expected {item.out.numel()}", "wrong_length"))
            raise ConnectionError("reply of the wrong length")
        _, raw, total, mac = reply
        if item.reply is not None:
            item.reply.update_fields(*_reply_fields(item.request, total, itemsize))
            if not _mac_ok(item.reply.digest(), mac):
                return Unauthenticated("the reply's proof does not match the shared secret", "reply_bad_mac")
        try:
            if raw is None:
                if not all_finite(item.out):
                    return InvalidMessage("partner sent non-finite values", "non_finite")
            else:
                fill_values(item.out, 0, item.out.numel(), raw, 0, self._wire)
        except InvalidMessage as exc:
            return exc
        return None

    async def close(self) -> None:
        """Shut the connection and wait until the reader thread has stopped, even
        if cancelled meanwhile: until then it may still copy what the kernel had
        buffered into a caller's tensor, and the caller's next round reuses that
        buffer. (A deadline cancels a fetch twice, from the client's timeout and
        from the round's; returning early on the second let a stale reader write
        into the next round's receive buffer, and garbage was averaged in: a
        partitioned peer's model went to chance accuracy in the short soak.)"""
        with self._guard:
            self.broken = True
        try:
            self._sender.shutdown(socket.SHUT_RDWR)  # wakes the reader, whatever it waits on
        except OSError:
            pass
        self._queue.put(None)  # wakes an idle reader
        cancelled = False
        while not self.stopped.done():
            try:
                await asyncio.shield(self.stopped)
            except asyncio.CancelledError:
                cancelled = True
        self._sender.close()
        if cancelled:
            raise asyncio.CancelledError


class BulkClient:
    """Fetches segments over bulk lanes: one pipelined connection per partner and
    stage. Per stage, because a hierarchical stage-2 fetch waits for the partner
    to finish stage 1, which may need this peer's stage-1 fetch to go through.
    With `auth`, requests carry proofs and replies must (docs/protocol.md)."""

    def __init__(self, wire: str = "fp32", auth: Authenticator | None = None) -> None:
        self._wire = wire
        self._auth = auth
        self._pipes: dict[tuple[str, int, int], _Pipe] = {}
        self._connecting: dict[tuple[str, int, int], asyncio.Future] = {}

    async def fetch(self, host: str, port: int, request, out: torch.Tensor, timeout: float,
                    audience: str = "") -> None:
        """Fetch one segment into `out`; `audience` is the partner's exchange
        address, which proofs name (as over gRPC)."""
        try:
            async with asyncio.timeout(timeout):
                pipe = await self._pipe((host, port, request.stage))
        except TimeoutError:
            raise PeerUnavailable(f"{host}:{port}: deadline exceeded connecting") from None
        except OSError as exc:
            raise PeerUnavailable(f"{host}:{port}: {exc}") from None
        try:
            async with asyncio.timeout(timeout):  # the reader's socket timeout is per read, not per reply
                await pipe.fetch(request, out, max(timeout, 0.0), audience)
        except TimeoutError:
            raise PeerUnavailable(f"{host}:{port}: deadline exceeded") from None
        except (ConnectionError, OSError) as exc:
            raise PeerUnavailable(f"{host}:{port}: {exc}") from None

    async def _pipe(self, key: tuple[str, int, int]) -> _Pipe:
        pipe = self._pipes.get(key)
        if pipe is not None:
            if not pipe.broken:
                return pipe
            del self._pipes[key]
            await pipe.close()  # ended by the partner or by idleness: its socket is still open here
        pending = self._connecting.get(key)
        if pending is None:  # the first caller connects; the others wait for it
            pending = asyncio.ensure_future(self._connect(key))
            pending.add_done_callback(_retrieve)  # its callers may all have timed out
            self._connecting[key] = pending
            pending.add_done_callback(lambda _: self._connecting.pop(key, None))
        pipe = await asyncio.shield(pending)
        self._pipes[key] = pipe
        return pipe

    async def _connect(self, key: tuple[str, int, int]) -> _Pipe:
        host, port, _ = key
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            await asyncio.get_running_loop().sock_connect(sock, (host, port))
            return _Pipe(sock, self._wire, self._auth)
        except BaseException:
            sock.close()
            raise

    async def aclose(self) -> None:
        pipes = list(self._pipes.values())
        self._pipes.clear()
        await asyncio.gather(*(pipe.close() for pipe in pipes), return_exceptions=True)
