"""Test certificates made at test time with the openssl command line tool."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from peerd.security.tls import TlsMaterial, TlsSettings, load_tls

needs_openssl = pytest.mark.skipif(shutil.which("openssl") is None, reason="the openssl tool is not installed")


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(directory: Path, name: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2", "-subj", f"/CN={name}", cwd=directory)
    return directory / f"{name}.pem"


def make_leaf(directory: Path, ca: str, name: str) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 (and the name "peerd"), for servers and clients, signed by `ca`."""
    (directory / f"{name}.ext").write_text(
        "subjectAltName = IP:127.0.0.1, DNS:peerd\nextendedKeyUsage = serverAuth, clientAuth\n")
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=directory)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-days", "2", "-out", f"{name}.pem", "-extfile", f"{name}.ext", cwd=directory)
    return directory / f"{name}.pem", directory / f"{name}.key"


def settings(directory: Path, ca: str, name: str) -> TlsSettings:
    cert, key = make_leaf(directory, ca, name)
    return TlsSettings(cert, key, directory / f"{ca}.pem")


def material(directory: Path, ca: str, name: str) -> TlsMaterial:
    return load_tls(settings(directory, ca, name))
