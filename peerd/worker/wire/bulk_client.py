"""The bulk lane's client: one pipelined connection per partner and stage, a
reader thread per connection taking the replies (frames: peerd.worker.wire.bulk;
TLS: peerd.worker.wire.bulk_tls)."""

from __future__ import annotations

import asyncio
import collections
import logging
import queue
import socket
import ssl
import threading
import time

import torch

from peerd.security.auth import Authenticator, ReplyMac
from peerd.core.names import join_host_port
from peerd.errors import InvalidMessage, JobMismatch, PeerUnavailable, RoundMismatch, Unauthenticated
from peerd.security.rejections import Rejections
from peerd.worker.wire.bulk import (
    BULK_METHOD, ERROR_HEADER, LENGTH, MAC_BYTES, OK_HEADER, BulkError, mac_ok, reply_fields,
)
from peerd.worker.wire.bulk_tls import HandshakeFailed, Stream, handshake
from peerd.worker.wire.codec import ROUND_CHECKED_STAGES, fill_values, finite_by_sum
from peerd.worker.wire.values import stage_wire, wire_nbytes

log = logging.getLogger("peerd.worker")

IDLE_S = 60.0  # a connection unused this long is closed (its reader thread ends)
# Values checked as they arrive are checked in pieces this large, each right after
# it landed, while it is still in the cache: 1.7 ms of CPU per 32 MiB against 3.0
# for one pass over the whole segment after it arrived.
CHECK_BYTES = 512 * 1024


def _recv_blocking(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("connection closed mid-segment")
        got += n


def _recv_checked(sock: socket.socket, view: memoryview, values: torch.Tensor) -> bool:
    """_recv_blocking into `view` (the bytes of the float32 tensor `values`),
    checking every CHECK_BYTES piece for non-finite values as soon as it is
    in; False if one had any (the rest is still read: the connection stays in step)."""
    got, ok, piece = 0, True, CHECK_BYTES // 4
    while got < len(view):
        stop = min(got + CHECK_BYTES, len(view))
        _recv_blocking(sock, view[got:stop])
        ok = finite_by_sum(values[got // 4 : got // 4 + piece]) and ok
        got = stop
    return ok


def _read_reply(sock: socket.socket, into: memoryview | None, expected: int, wire: str, mac_bytes: int,
                checked: torch.Tensor | None = None):
    """One whole reply frame, read with blocking calls: ("error", kind, round,
    message, mac), ("length", total) for a segment of the wrong size (its values
    left unread), or ("ok", raw, total, mac, finite) with the values in `into`
    (raw is None) or in raw. `mac` is the reply proof (b"" when mac_bytes is 0).
    With `checked` (the tensor `into` views), the values are checked as they
    arrive and `finite` says whether they are all finite; else it is None."""
    head = bytearray(OK_HEADER.size)
    _recv_blocking(sock, memoryview(head)[:1])
    if head[0] != 0:
        rest = bytearray(ERROR_HEADER.size - 1)
        _recv_blocking(sock, memoryview(rest))
        _, current, size = ERROR_HEADER.unpack(bytes(head[:1]) + rest)
        if size > 4096:
            raise ConnectionError(f"error message of {size} bytes")
        message = bytearray(size)
        _recv_blocking(sock, memoryview(message))
        mac = _recv_mac(sock, mac_bytes if head[0] != BulkError.UNAUTHENTICATED else 0)  # a refused proof gets none back
        return "error", head[0], current, message.decode(errors="replace"), mac
    _recv_blocking(sock, memoryview(head)[1:])
    _, total = OK_HEADER.unpack(head)
    if total != expected:
        return "length", total
    raw = None if into is not None else bytearray(wire_nbytes(wire, total))
    finite = None
    if into is not None and checked is not None:
        finite = _recv_checked(sock, into, checked)
    else:
        _recv_blocking(sock, into if into is not None else memoryview(raw))
    return "ok", raw, total, _recv_mac(sock, mac_bytes), finite


def _recv_mac(sock: socket.socket, n: int) -> bytes:
    mac = bytearray(n)
    _recv_blocking(sock, memoryview(mac))
    return bytes(mac)


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
    when the connection breaks or stays idle for IDLE_S. Under TLS the thread
    also sends the requests (every one queued before it reads the next reply):
    OpenSSL allows one caller at a time on a connection.
    """

    def __init__(self, stream: Stream, wire: str, auth: Authenticator | None) -> None:
        self._loop = asyncio.get_running_loop()
        self._wire = wire
        self._auth = auth
        self._sender = stream  # non-blocking, used by the event loop (plain only)
        self._reader = stream.reader()  # the thread's (under TLS, the same TLS socket)
        self._sent: collections.deque[_Fetch] = collections.deque()  # TLS: sent by the thread, reply owed
        self._queue: queue.SimpleQueue[_Fetch | None] = queue.SimpleQueue()  # None: stop
        self._guard = threading.Lock()  # `broken` and queueing decide together
        self.broken = False
        self._sending = asyncio.Lock()  # whole frames, in queue order
        self.stopped = self._loop.create_future()
        threading.Thread(target=self._read_loop, name="peerd-bulk-recv", daemon=True).start()

    async def fetch(self, request, out: torch.Tensor, timeout: float, audience: str) -> None:
        body = request.SerializeToString()
        frame, reply = LENGTH.pack(len(body)) + body, None
        if self._auth is not None:
            (_, proof), reply = self._auth.sign(BULK_METHOD, body, audience=audience)
            frame += LENGTH.pack(len(proof)) + proof.encode()
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
                if not self._sender.tls:  # under TLS the thread sends it
                    await self._sender.sendall(self._loop, item.frame)
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
                    item = self._next()
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
            left += self._sent
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

    def _next(self) -> _Fetch | None:
        """The fetch whose reply comes next, None to stop; queue.Empty after IDLE_S
        idle. Under TLS this thread sends the requests: every one queued before
        it reads the next reply, so the partner never waits a round trip."""
        if not self._sender.tls:
            return self._queue.get(timeout=IDLE_S)
        block = not self._sent
        while True:
            try:
                item = self._queue.get(timeout=IDLE_S) if block else self._queue.get_nowait()
            except queue.Empty:
                if block:
                    raise
                return self._sent.popleft()
            if item is None:
                return None
            block = False
            self._sent.append(item)  # owed a reply (or a failure) from here on
            self._reader.settimeout(max(item.deadline - time.monotonic(), 0.001))
            self._reader.sendall(item.frame)

    def _receive(self, item: _Fetch) -> BaseException | None:
        """Read one reply into `item`: None if it holds the values, else the error to
        raise. Raises if the connection cannot carry another reply."""
        mac_bytes = MAC_BYTES if item.reply is not None else 0
        # Stages 0 and 1 are checked by the round, on the average it computes
        # from them: a second pass here cost 8 ms of CPU per 64 MiB.
        check = item.request.stage not in ROUND_CHECKED_STAGES
        reply = _read_reply(self._reader, item.into, item.out.numel(), self._wire, mac_bytes,
                            item.out if check else None)
        if reply[0] == "error":
            _, kind, current, message, mac = reply
            if kind == BulkError.UNAUTHENTICATED:  # the partner closes the connection after this
                self._loop.call_soon_threadsafe(_settle, item.future, Unauthenticated(
                    f"partner refused this peer's proof: {message}", "refused"))
                raise ConnectionError("proof refused")
            if item.reply is not None and not mac_ok(item.reply.digest(f"{kind}:{current}"), mac):
                return Unauthenticated("the reply's proof does not match the shared secret", "reply_bad_mac")
            if kind == BulkError.ROUND_MISMATCH:
                return RoundMismatch(message, current)
            return (JobMismatch if kind == BulkError.JOB_MISMATCH else PeerUnavailable)(message)
        if reply[0] == "length":
            # The values that follow are not read: the connection is dropped.
            self._loop.call_soon_threadsafe(_settle, item.future, InvalidMessage(
                f"partner sent a segment of {reply[1]} elements, expected {item.out.numel()}", "wrong_length"))
            raise ConnectionError("reply of the wrong length")
        _, raw, total, mac, finite = reply
        if item.reply is not None:
            item.reply.update_fields(*reply_fields(item.request, total, wire_nbytes(self._wire, total)))
            if not mac_ok(item.reply.digest(), mac):
                return Unauthenticated("the reply's proof does not match the shared secret", "reply_bad_mac")
        try:
            if raw is not None:
                fill_values(item.out, 0, item.out.numel(), raw, 0, self._wire, check_finite=False)
            if check and not (finite if finite is not None else finite_by_sum(item.out)):
                return InvalidMessage("partner sent non-finite values", "non_finite")
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
        self._sender.shutdown()  # wakes the reader, whatever it waits on
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
    With `auth`, requests carry proofs and replies must (docs/protocol.md); with
    `tls` (a client context), every connection is mutual TLS, the partner's
    certificate checked against `server_name` or else the host dialled, as gRPC
    checks it. A failed handshake is counted in `tls_refusals` and logged once per
    partner a minute."""

    def __init__(self, wire: str = "fp32", auth: Authenticator | None = None,
                 tls: ssl.SSLContext | None = None, server_name: str = "") -> None:
        self._wire = wire
        self._auth = auth
        self._tls = tls
        self._server_name = server_name
        self.tls_refusals = Rejections(log, what="TLS handshake failed on the bulk lane with")
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
            raise PeerUnavailable(f"{join_host_port(host, port)}: deadline exceeded connecting") from None
        except HandshakeFailed as exc:  # counted once, by the connect its callers share
            raise PeerUnavailable(f"{join_host_port(host, port)}: {exc}") from None
        except OSError as exc:
            raise PeerUnavailable(f"{join_host_port(host, port)}: {exc}") from None
        try:
            async with asyncio.timeout(timeout):  # the reader's socket timeout is per read, not per reply
                await pipe.fetch(request, out, max(timeout, 0.0), audience)
        except TimeoutError:
            raise PeerUnavailable(f"{join_host_port(host, port)}: deadline exceeded") from None
        except (ConnectionError, OSError) as exc:
            raise PeerUnavailable(f"{join_host_port(host, port)}: {exc}") from None

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
        return await asyncio.shield(pending)

    async def _connect(self, key: tuple[str, int, int]) -> _Pipe:
        """A new pipe, kept in _pipes by the connect itself: when every caller has
        timed out meanwhile, it is still the client's to reuse and to close (else
        its reader thread and socket outlived the client)."""
        host, port, stage = key
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            await asyncio.get_running_loop().sock_connect(sock, (host, port))
            if self._tls is not None:
                sock = self._tls.wrap_socket(sock, server_hostname=self._server_name or host,
                                             do_handshake_on_connect=False)
                await handshake(sock)
        except BaseException as exc:
            sock.close()
            if isinstance(exc, HandshakeFailed):
                self.tls_refusals.record(join_host_port(host, port), "tls", exc.reason)
            raise
        pipe = self._pipes[key] = _Pipe(Stream(sock), stage_wire(stage, self._wire), self._auth)
        return pipe

    async def aclose(self) -> None:
        connecting = list(self._connecting.values())
        for pending in connecting:
            pending.cancel()
        await asyncio.gather(*connecting, return_exceptions=True)  # none adds a pipe after this
        pipes = list(self._pipes.values())
        self._pipes.clear()
        await asyncio.gather(*(pipe.close() for pipe in pipes), return_exceptions=True)
