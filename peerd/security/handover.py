"""What a worker's data plane is secured with, as the daemon handed it over."""

from __future__ import annotations

from dataclasses import dataclass

from peerd.security.auth import Authenticator
from peerd.security.tls import TlsMaterial


@dataclass(frozen=True)
class Security:
    """The job secret and the TLS material: both absent means an open data plane."""

    auth: Authenticator | None = None
    tls: TlsMaterial | None = None
