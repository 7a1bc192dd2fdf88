"""Optional mutual TLS for every gRPC connection between machines (docs/operations.md);
the workers' bulk lane takes the same material (peerd.worker.wire.bulk_tls).

Every peer holds a certificate signed by the lab's CA and accepts only peers
whose certificate that CA signed; the control socket (local) stays plain.
"""

from __future__ import annotations

import re

from dataclasses import dataclass
from pathlib import Path

import grpc

from peerd.errors import ConfigError


@dataclass(frozen=True)
class TlsSettings:
    cert_file: Path
    key_file: Path
    ca_file: Path
    server_name: str = ""  # "": check the peer's certificate against the address dialled

    def argv(self) -> list[str]:
        """Worker command-line options carrying these settings."""
        args = ["--tls-cert", str(self.cert_file), "--tls-key", str(self.key_file), "--tls-ca", str(self.ca_file)]
        return args + (["--tls-server-name", self.server_name] if self.server_name else [])


@dataclass(frozen=True)
class TlsMaterial:
    cert: bytes
    key: bytes
    ca: bytes
    server_name: str


def load_tls(settings: TlsSettings) -> TlsMaterial:
    def read(path: Path, what: str, marker: bytes) -> bytes:
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read the TLS {what} {path}: {exc.strerror}") from None
        if marker not in data:
            raise ConfigError(f"the TLS {what} {path} is not PEM (no '{marker.decode()}' line)")
        return data

    return TlsMaterial(
        cert=read(settings.cert_file, "certificate", b"-----BEGIN CERTIFICATE-----"),
        key=read(settings.key_file, "key", b"PRIVATE KEY-----"),
        ca=read(settings.ca_file, "CA certificate", b"-----BEGIN CERTIFICATE-----"),
        server_name=settings.server_name,
    )


def open_channel(address: str, tls: TlsMaterial | None, options: list[tuple[str, object]]) -> grpc.aio.Channel:
    if tls is None:
        return grpc.aio.insecure_channel(address, options=options)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=tls.ca, private_key=tls.key, certificate_chain=tls.cert)
    if tls.server_name:
        options = [*options, ("grpc.ssl_target_name_override", tls.server_name)]
    return grpc.aio.secure_channel(address, credentials, options=options)


def add_port(server: grpc.aio.Server, address: str, tls: TlsMaterial | None) -> int:
    """Bind `address`, with mutual TLS when configured; the port bound, 0 on failure."""
    if tls is None:
        return server.add_insecure_port(address)
    credentials = grpc.ssl_server_credentials(
        [(tls.key, tls.cert)], root_certificates=tls.ca, require_client_auth=True)
    return server.add_secure_port(address, credentials)


_HANDSHAKE = re.compile(r"tls handshake failed[^:]*:(?:.*?OPENSSL_internal:)?\s*([A-Z0-9_]+(?:: [^:]+)?)", re.IGNORECASE)


def handshake_refusal(message: str) -> str | None:
    """The reason in a gRPC error for a failed TLS handshake (for example
    "CERTIFICATE_VERIFY_FAILED: unable to get local issuer certificate": the
    peer's certificate is not of this lab's CA), or None for any other error."""
    found = _HANDSHAKE.search(message)
    return found.group(1).strip() if found else None
