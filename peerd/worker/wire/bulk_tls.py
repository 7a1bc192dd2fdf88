"""The bulk lane's sockets, plain or under mutual TLS (docs/protocol.md, "Bulk lane").

Under TLS the lane takes the same certificates, CA and checks as gRPC's channels
(peerd.security.tls): a server accepts only clients with a certificate of the lab's CA, a
client checks the server's certificate against the host it dialled (or
`[tls] server_name`). TLS 1.3 only: its ciphers are all AEADs, and OpenSSL picks
AES-GCM first, which AES-NI makes cheap.

Sockets stay non-blocking. OpenSSL allows one caller at a time on a
connection, so each TLS connection has one user after its handshake: the
server's event loop (through `Stream`), or a client's reader thread, which then
sends the requests too (peerd.worker.wire.bulk_client). A thread's blocking
calls wait inside OpenSSL's C code, one record (16 KiB) per call.
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import tempfile

from peerd.security.tls import TlsMaterial

HANDSHAKE_TIMEOUT_S = 10.0  # a silent client cannot hold a server task longer
SEND_PIECE = 1 << 20  # bytes per SSL_write: the loop is free again between pieces


def server_context(tls: TlsMaterial) -> ssl.SSLContext:
    return _context(tls, server=True)


def client_context(tls: TlsMaterial) -> ssl.SSLContext:
    return _context(tls, server=False)


def _context(tls: TlsMaterial, server: bool) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.verify_mode = ssl.CERT_REQUIRED  # the client checks the host name too (PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cadata=tls.ca.decode())
    # ssl loads a key only from a file: a private directory, gone once loaded.
    with tempfile.TemporaryDirectory(prefix="peerd-tls-") as directory:
        cert, key = os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem")
        for path, data in ((cert, tls.cert), (key, tls.key)):
            with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
                f.write(data)
        context.load_cert_chain(cert, key)
    if server:
        context.num_tickets = 0  # a lane connection lives long: nothing to resume
    return context


def refusal(exc: BaseException) -> str:
    """Why a handshake failed, in OpenSSL's words as gRPC's log gives them."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"{exc.reason}: {exc.verify_message}"
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason)
    if isinstance(exc, TimeoutError):
        return f"no handshake within {HANDSHAKE_TIMEOUT_S:g} s"
    return str(exc) or type(exc).__name__


class HandshakeFailed(ConnectionError):
    def __init__(self, reason: str) -> None:
        super().__init__(f"TLS handshake failed: {reason}")
        self.reason = reason


async def _ready(loop: asyncio.AbstractEventLoop, sock: socket.socket, write: bool) -> None:
    done = loop.create_future()
    fd = sock.fileno()
    add, remove = (loop.add_writer, loop.remove_writer) if write else (loop.add_reader, loop.remove_reader)
    add(fd, lambda: done.done() or done.set_result(None))
    try:
        await done
    finally:
        remove(fd)


async def _retry(loop: asyncio.AbstractEventLoop, sock: ssl.SSLSocket, call):
    """call() until OpenSSL stops asking for the socket."""
    while True:
        try:
            return call()
        except ssl.SSLWantReadError:
            await _ready(loop, sock, write=False)
        except ssl.SSLWantWriteError:
            await _ready(loop, sock, write=True)


async def handshake(sock: ssl.SSLSocket) -> None:
    """The handshake of a non-blocking socket, within HANDSHAKE_TIMEOUT_S; raises
    HandshakeFailed (with OpenSSL's reason) if it does not complete."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
            await _retry(loop, sock, sock.do_handshake)
    except (ssl.SSLError, TimeoutError, OSError) as exc:
        raise HandshakeFailed(refusal(exc)) from None


class Stream:
    """A lane connection as the event loop uses it: plain, or TLS (`tls` True)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.tls = isinstance(sock, ssl.SSLSocket)

    async def recv_into(self, loop: asyncio.AbstractEventLoop, view: memoryview) -> int:
        if not self.tls:
            return await loop.sock_recv_into(self.sock, view)
        return await _retry(loop, self.sock, lambda: self.sock.recv_into(view))

    async def sendall(self, loop: asyncio.AbstractEventLoop, data) -> None:
        if not self.tls:
            return await loop.sock_sendall(self.sock, data)
        view, sent = memoryview(data).cast("B"), 0
        while sent < len(view):
            piece = view[sent : sent + SEND_PIECE]  # a retried SSL_write gets the same piece
            sent += await _retry(loop, self.sock, lambda: self.sock.send(piece))

    def shutdown(self) -> None:
        """Wake whoever waits on the connection. socket.socket's own shutdown: an
        SSLSocket's would drop its TLS state under a reader thread, which would
        then read ciphertext as values."""
        try:
            socket.socket.shutdown(self.sock, socket.SHUT_RDWR)
        except OSError:
            pass

    def reader(self) -> socket.socket:
        """A socket for one thread's blocking calls (its timeout its own, the
        descriptor left non-blocking): plain, a socket object on a duplicate
        descriptor; TLS, this stream's socket, the thread's alone from now on."""
        if not self.tls:
            return socket.socket(self.sock.family, self.sock.type, fileno=os.dup(self.sock.fileno()))
        return self.sock

    def close(self) -> None:
        self.sock.close()
