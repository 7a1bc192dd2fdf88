"""One error family for peerd. Edges translate: gRPC servicers turn these into
status codes, clients turn status codes back into these, CLIs print them."""

from __future__ import annotations


class PeerdError(Exception):
    """Base of every error peerd raises on purpose; the message says what to fix."""


class ConfigError(PeerdError):
    """A config or job file is missing, malformed or has a bad value."""


class JobMismatch(PeerdError):
    """A peer runs the same job name with a different spec or model shape."""


class RoundMismatch(PeerdError):
    """A partner no longer holds (or will not reach) the requested round."""

    def __init__(self, message: str, current_round: int) -> None:
        super().__init__(message)
        self.current_round = current_round


class PeerUnavailable(PeerdError):
    """A partner did not answer before the deadline or refused the connection."""


class Unauthenticated(PeerUnavailable):
    """A request or reply without valid proof of the shared secret (peerd.security.auth).
    A peer that keeps failing it is suspected like one that does not answer."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason  # "missing", "bad_mac", "stale", "replayed", "reply_missing", ...


class InvalidMessage(PeerUnavailable):
    """A partner sent something malformed: wrong length, offset, segment, non-finite values."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class NonFiniteAverage(InvalidMessage):
    """A partner's values made the round's own average non-finite: refused by the
    round, which checks what it averages (the bulk lane leaves stages 0 and 1 to it)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "non_finite")


class DaemonNotRunning(PeerdError):
    """peerctl found no daemon behind the control socket."""


class UnknownJob(PeerdError):
    """A request named a job this daemon does not run."""
