"""A job's code as one content-addressed bundle (docs/operations.md, "A job's
code travels"): a deterministic tar of regular files, named by the sha256 of
its bytes. Pure: files in and out as a mapping of relative names to bytes.

The same files give the same bytes on every machine (sorted names, mtime 0,
owner 0, mode 0644, no directories or links), so the hash in the job spec
names the code exactly, and a bundle that unpacks must pack back to the very
bytes it came as.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from dataclasses import dataclass

MAX_BUNDLE_BYTES = 64 << 20  # the tar, headers included
MAX_BUNDLE_FILES = 2000
MAX_NAME_CHARS = 255
HASH_CHARS = 64  # sha256, hex


class BundleRefused(ValueError):
    """A bundle or a name in it that peerd will not build, store or run."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason  # "name", "size", "files", "mismatch", "form"


@dataclass(frozen=True)
class Limits:
    max_bytes: int = MAX_BUNDLE_BYTES
    max_files: int = MAX_BUNDLE_FILES


def mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def check_name(name: str) -> str:
    """A file's name in a bundle: a relative POSIX path that stays inside the
    directory it is unpacked in. Returned as it is; BundleRefused otherwise."""
    bad = (not isinstance(name, str) or not 0 < len(name) <= MAX_NAME_CHARS or name.startswith("/")
           or "\\" in name or any(ord(c) < 32 or c == "\x7f" for c in name)
           or any(part in ("", ".", "..") for part in name.split("/")))
    if bad:
        raise BundleRefused(f"bundle file name {name!r}: not a relative path inside the job's directory "
                            f"(no '..', no leading '/', no empty parts, at most {MAX_NAME_CHARS} characters)", "name")
    return name


def _check_tree(names: list[str]) -> None:
    """No name may be both a file and a directory of another (a/b beside a)."""
    files = set(names)
    for name in names:
        parts = name.split("/")
        for k in range(1, len(parts)):
            if "/".join(parts[:k]) in files:
                raise BundleRefused(f"bundle file {name!r} lies under the file {'/'.join(parts[:k])!r}", "name")


def pack(files: dict[str, bytes], limits: Limits = Limits()) -> bytes:
    """The bundle of `files` (name -> content): the same bytes for the same files."""
    names = sorted(check_name(n) for n in files)
    _check_tree(names)
    if len(names) > limits.max_files:
        raise BundleRefused(f"the job's code is {len(names)} files, over the limit of {limits.max_files}", "files")
    content = sum(len(files[n]) for n in names)
    if content > limits.max_bytes:
        raise BundleRefused(f"the job's code is {mib(content)}, over the limit of {mib(limits.max_bytes)}", "size")
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in names:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode, info.uid, info.gid = len(files[name]), 0, 0o644, 0, 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(files[name]))
    data = out.getvalue()
    if len(data) > limits.max_bytes:
        raise BundleRefused(f"the job's code bundle is {mib(len(data))}, over the limit of "
                            f"{mib(limits.max_bytes)}", "size")
    return data


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def valid_hash(text: str) -> bool:
    return len(text) == HASH_CHARS and all(c in "0123456789abcdef" for c in text)


def unpack(data: bytes, expected: str, limits: Limits = Limits()) -> dict[str, bytes]:
    """The files of a bundle that must hash to `expected`; BundleRefused when it
    is too large, hashes otherwise, or is not a bundle peerd itself would make."""
    if len(data) > limits.max_bytes:
        raise BundleRefused(f"the bundle is {mib(len(data))}, over the limit of {mib(limits.max_bytes)}", "size")
    got = digest(data)
    if got != expected:
        raise BundleRefused(f"the bundle's sha256 is {got}, not the job's {expected}", "mismatch")
    files: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            for member in tar:
                if not member.isreg():
                    raise BundleRefused(f"bundle entry {member.name!r} is not a regular file", "form")
                # A sparse member reads back as its claimed size, holes as zeros:
                # a few bytes of tar could fill memory before the canonical check.
                if member.type != tarfile.REGTYPE or member.sparse is not None:
                    raise BundleRefused(f"bundle entry {member.name!r} is not a plain file (sparse or typed "
                                        f"{member.type!r})", "form")
                if len(files) >= limits.max_files:
                    raise BundleRefused(f"the bundle holds over {limits.max_files} files", "files")
                name = check_name(member.name)
                if name in files:
                    raise BundleRefused(f"bundle file {name!r} appears twice", "form")
                files[name] = tar.extractfile(member).read()
    except (tarfile.TarError, EOFError) as exc:
        raise BundleRefused(f"not a tar bundle: {exc}", "form") from None
    if pack(files, limits) != data:
        raise BundleRefused("the bundle is not in peerd's canonical form (packed with other settings)", "form")
    return files
