"""A throwaway lab CA and one certificate per rank for 127.0.0.1 (or the ranks'
own addresses), made with the openssl tool as docs/operations.md ("Secrets and
TLS") makes them."""

from __future__ import annotations

import subprocess
from pathlib import Path

from peerd.security.tls import TlsSettings


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_pki(directory: Path, names: list[str], ips: tuple[str, ...] = ("127.0.0.1",)) -> dict[str, TlsSettings]:
    """A CA in `directory` and a certificate (server and client auth, for every
    address in `ips`) per name, signed by it."""
    directory.mkdir(parents=True, exist_ok=True)
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=bench-ca",
             cwd=directory)
    settings = {}
    for name in names:
        alt = ", ".join(f"IP:{ip}" for ip in ips)
        (directory / f"{name}.ext").write_text(f"subjectAltName = {alt}\n"
                                               "extendedKeyUsage = serverAuth, clientAuth\n")
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=directory)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-days", "2", "-out", f"{name}.pem", "-extfile", f"{name}.ext", cwd=directory)
        settings[name] = TlsSettings(directory / f"{name}.pem", directory / f"{name}.key", directory / "ca.pem")
    return settings
