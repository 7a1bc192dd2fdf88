"""Proof of a shared secret on every request, and on every reply (docs/protocol.md).

A caller signs each request with HMAC-SHA256 over the method, a timestamp, a
random nonce and a digest of the request message, and sends the proof in the
gRPC metadata key `peerd-auth`. The callee checks the MAC, refuses a timestamp
outside ±`window_s` of its own clock, and refuses a nonce it has already seen
in that window. Streaming replies carry their own proof in the trailing
metadata key `peerd-auth-reply`: a MAC over the request's MAC and every reply
message, so a peer without the secret can neither ask nor answer.

Pure of gRPC: the edges (peerd.worker.wire.transport, peerd.daemon.services) read
and write the metadata and turn `AuthError` into UNAUTHENTICATED.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from peerd.errors import ConfigError, Unauthenticated

AUTH_KEY = "peerd-auth"
REPLY_KEY = "peerd-auth-reply"
VERSION = "v1"
WINDOW_S = 30.0
NONCE_CACHE = 100_000
MIN_SECRET_BYTES = 16
MAX_SECRET_BYTES = 4096


AuthError = Unauthenticated  # raised with a reason: "missing", "bad_mac", "stale", "replayed", ...


def load_secret(path: Path) -> bytes:
    """The secret bytes in `path` (surrounding whitespace stripped); ConfigError
    when the file is missing, too short, or readable by every user."""
    try:
        info = path.stat()
        data = path.read_bytes().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read secret file {path}: {exc.strerror}") from None
    if info.st_mode & stat.S_IROTH:
        raise ConfigError(f"secret file {path} is readable by every user; chmod 0600 or 0640 it")
    if not MIN_SECRET_BYTES <= len(data) <= MAX_SECRET_BYTES:
        raise ConfigError(
            f"secret file {path} holds {len(data)} bytes; expected {MIN_SECRET_BYTES}..{MAX_SECRET_BYTES} "
            "(e.g. `head -c 32 /dev/urandom | base64 > FILE`)"
        )
    return data


def create_secret_file(path: Path, overwrite: bool = False) -> None:
    """A fresh random secret (256 bits) in `path`, readable by its owner only
    (0600, whatever the umask or an old file's mode); an existing file is kept
    unless `overwrite`."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if overwrite else os.O_EXCL)
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        raise ConfigError(f"{path} exists; keep it (every peer must hold the same secret), "
                          "or replace it with --force") from None
    except OSError as exc:
        raise ConfigError(f"cannot write secret file {path}: {exc.strerror}") from None
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(secrets.token_urlsafe(32) + "\n")
        f.flush()
        os.fsync(f.fileno())


def new_secret_file(path: Path) -> None:
    """Write a fresh random secret, mode 0600 (tests and `peerd` docs)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_urlsafe(32) + "\n")


def _request_mac(key: bytes, method: str, audience: str, ts_ms: int, nonce: str, body: bytes) -> str:
    text = f"peerd-auth-{VERSION}\n{method}\n{audience}\n{ts_ms}\n{nonce}\n".encode() + hashlib.sha256(body).digest()
    return hmac.new(key, text, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Proof:
    """A checked request proof: its MAC keys the reply proof."""

    mac: str


class ReplyMac:
    """Running MAC over the messages of one reply stream, bound to its request."""

    def __init__(self, key: bytes, request_mac: str) -> None:
        self._mac = hmac.new(key, f"peerd-auth-{VERSION}-reply\n{request_mac}\n".encode(), hashlib.sha256)

    def update(self, message) -> None:
        """Cover a whole reply message."""
        view = memoryview(message).cast("B")
        self._mac.update(view.nbytes.to_bytes(8, "little"))
        self._mac.update(view)

    def update_fields(self, *fields) -> None:
        """Cover a reply message by its fields (bulk payloads by their length only:
        see docs/protocol.md for why that is enough)."""
        self.update(repr(fields).encode())

    def digest(self, trailer: str = "") -> str:
        """The reply proof; `trailer` binds status details the caller acts on (a round)."""
        mac = self._mac.copy()
        mac.update(b"\xff" * 8 + trailer.encode())
        return mac.hexdigest()

    def check(self, received: str | None, trailer: str = "") -> None:
        if not received:
            raise AuthError("the reply carries no proof of the shared secret", "reply_missing")
        if not hmac.compare_digest(received.encode(), self.digest(trailer).encode()):
            raise AuthError("the reply's proof does not match the shared secret", "reply_bad_mac")


class NonceCache:
    """Nonces seen within the window, bounded: when full, the oldest entry is
    dropped and requests no newer than it are refused from then on."""

    def __init__(self, window_s: float = WINDOW_S, capacity: int = NONCE_CACHE) -> None:
        self._window_ms = int(window_s * 1000)
        self._capacity = capacity
        self._seen: OrderedDict[str, int] = OrderedDict()  # nonce -> timestamp, oldest first seen
        self._floor_ms = -1

    def __len__(self) -> int:
        return len(self._seen)

    def admit(self, nonce: str, ts_ms: int, now_ms: int) -> bool:
        """True the first time a nonce is seen (within the window); False on a replay."""
        while self._seen:
            oldest, seen_ts = next(iter(self._seen.items()))
            if seen_ts + self._window_ms >= now_ms:
                break
            del self._seen[oldest]
        if ts_ms <= self._floor_ms or nonce in self._seen:
            return False
        if len(self._seen) >= self._capacity:
            _, dropped_ts = self._seen.popitem(last=False)
            self._floor_ms = max(self._floor_ms, dropped_ts)
            if ts_ms <= self._floor_ms:
                return False
        self._seen[nonce] = ts_ms
        return True


class Authenticator:
    """Signs requests and checks them, with one secret and one clock."""

    def __init__(
        self, secret: bytes, clock: Callable[[], float] = time.time,
        window_s: float = WINDOW_S, capacity: int = NONCE_CACHE,
    ) -> None:
        self._key = hmac.new(secret, b"peerd key v1", hashlib.sha256).digest()
        self._clock = clock
        self._window_ms = int(window_s * 1000)
        self._nonces = NonceCache(window_s, capacity)

    def sign(self, method: str, body: bytes, audience: str = "") -> tuple[tuple[str, str], ReplyMac]:
        """The metadata pair for a request to `audience` (the callee's address, or
        "" for any), and the MAC its reply must carry."""
        ts_ms = int(self._clock() * 1000)
        nonce = secrets.token_hex(16)
        mac = _request_mac(self._key, method, audience, ts_ms, nonce, body)
        return (AUTH_KEY, f"{VERSION}:{ts_ms}:{nonce}:{mac}"), ReplyMac(self._key, mac)

    def verify(self, method: str, body: bytes, header: str | None, audience: str = "") -> ReplyMac:
        """Check a request's proof, made for `audience` (this callee's address, or
        "" for any); raises AuthError. Returns the reply's MAC."""
        if not header:
            raise AuthError("the request carries no proof of the shared secret", "missing")
        parts = header.split(":")
        if len(parts) != 4 or parts[0] != VERSION or not parts[1].isdigit() or len(parts[1]) > 15 \
                or len(parts[2]) != 32 or len(parts[3]) != 64:
            raise AuthError("malformed peerd-auth metadata", "malformed")
        _, ts_text, nonce, mac = parts
        ts_ms = int(ts_text)
        expected = _request_mac(self._key, method, audience, ts_ms, nonce, body)
        if not hmac.compare_digest(mac.encode(), expected.encode()):
            raise AuthError("the request's proof does not match the shared secret", "bad_mac")
        now_ms = int(self._clock() * 1000)
        if abs(now_ms - ts_ms) > self._window_ms:
            raise AuthError(
                f"the request's timestamp is {(ts_ms - now_ms) / 1000:+.1f}s off this peer's clock "
                f"(allowed ±{self._window_ms / 1000:.0f}s; check NTP)", "stale")
        if not self._nonces.admit(nonce, ts_ms, now_ms):
            raise AuthError("replayed request (nonce already seen)", "replayed")
        return ReplyMac(self._key, mac)


def metadata_value(metadata, key: str) -> str | None:
    """The first value of `key` in gRPC metadata (a sequence of pairs or None)."""
    for k, v in metadata or ():
        if k == key:
            return v if isinstance(v, str) else None
    return None
