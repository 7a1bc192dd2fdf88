"""A job's code on disk (docs/operations.md, "A job's code travels"): what of a
job file's directory travels, and the daemon's store of bundles,
state_dir/code/HASH.tar (served to peers) and HASH/ (what a worker runs when the
code came from a peer). The bundle format and its checks: peerd.core.bundle."""

from __future__ import annotations

import json
import os
import posixpath
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from peerd.core.bundle import BundleRefused, Limits, check_name, digest, mib, pack, unpack
from peerd.errors import ConfigError
from peerd.settings.jobspec import JobSpec

CHUNK_BYTES = 1 << 20  # of a bundle per GetJobCode reply
_SKIP_DIRS = {"__pycache__", ".git"}


def travelling_paths(spec: JobSpec, spec_dir: str) -> list[str]:
    """What of `spec_dir` the job's bundle holds, as listed (files or directories):
    its script, the top-level module or package of each entry found there (code
    installed elsewhere does not travel), and [job] files."""
    root = Path(spec_dir)
    paths: list[str] = []
    if spec.script and not Path(spec.script).expanduser().is_absolute():
        script = posixpath.normpath(spec.script)
        if not script.startswith("../"):
            paths.append(script)
    for entry in filter(None, (spec.module, spec.model, spec.data)):
        top = entry.partition(":")[0].split(".")[0]
        if top == "peerd":  # peerd's own package (its built-in jobs) is on every machine
            continue
        if (root / f"{top}.py").is_file():
            paths.append(f"{top}.py")
        elif (root / top).is_dir():
            paths.append(top)
    paths += [f.rstrip("/") for f in spec.files]
    return list(dict.fromkeys(paths))


def collect(spec: JobSpec, spec_dir: str, secrets: Mapping[str, Path | None] | None = None,
            limits: Limits = Limits()) -> dict[str, bytes]:
    """The files of the job's bundle, read from `spec_dir`; ConfigError when one
    is missing, lies outside it, or is one of `secrets` (what each is: the job
    secret, the realm secret, the TLS key); BundleRefused, before anything is
    read, when they are over `limits` (data in a package's directory)."""
    if not spec_dir:
        return {}
    root = Path(spec_dir).resolve()
    found: dict[str, Path] = {}
    for listed in travelling_paths(spec, spec_dir):
        path = root / listed
        if not path.exists():
            raise ConfigError(f"the job's file {listed!r}: no such file {path} on this machine "
                              "(a relative path is taken from the job file's directory)")
        if not path.resolve().is_relative_to(root):
            raise ConfigError(f"the job's file {listed!r} leads outside the job's directory {root}: it cannot travel")
        for file in _files_under(path):
            if not file.resolve().is_relative_to(root):
                raise ConfigError(f"the job's file {file} leads outside the job's directory {root}: it cannot travel")
            found[file.relative_to(root).as_posix()] = file
    for what, secret in (secrets or {}).items():
        if secret is not None and any(file.resolve() == secret.resolve() for file in found.values()):
            raise ConfigError(f"the {what} {secret} would travel with the job's code: keep it out of [job] files "
                              "and the job's package")
    _check_sizes(found, limits)
    return {name: file.read_bytes() for name, file in found.items()}


def _check_sizes(found: dict[str, Path], limits: Limits) -> None:
    """pack's limits, from the files' sizes: a large file is refused unread."""
    if len(found) > limits.max_files:
        raise BundleRefused(f"the job's code is {len(found)} files, over the limit of {limits.max_files}", "files")
    content = sum(file.stat().st_size for file in found.values())
    if content > limits.max_bytes:
        raise BundleRefused(f"the job's code is {mib(content)}, over the limit of {mib(limits.max_bytes)}", "size")


def _files_under(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    found = []
    for folder, dirs, names in os.walk(path):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
        # Regular files only: reading a FIFO would block the daemon's event loop.
        found += [Path(folder, n) for n in sorted(names) if not n.endswith(".pyc") and Path(folder, n).is_file()]
    return found


def describe(files: dict[str, bytes] | list[str], limit: int = 8) -> str:
    names = sorted(files)
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


class CodeStore:
    """state_dir/code: bundles by hash, each checked before it is kept or run."""

    def __init__(self, root: Path, limits: Limits = Limits()) -> None:
        self.root, self.limits = root, limits

    def tar(self, code: str) -> Path:
        return self.root / f"{code}.tar"

    def dir(self, code: str) -> Path:
        return self.root / code

    def build(self, spec: JobSpec, spec_dir: str, secrets: Mapping[str, Path | None] | None = None) -> bytes:
        """The bundle of the job's code in `spec_dir`; b"" when nothing of it travels."""
        try:
            files = collect(spec, spec_dir, secrets, self.limits)
            if not files:
                return b""
            return pack(files, self.limits)
        except BundleRefused as exc:
            raise ConfigError(f"job {spec.name!r}: {exc} (it travels to the peers that join by name; keep data "
                              "out of [job] files)") from None

    def hold(self, data: bytes) -> None:
        """Keep a bundle made here, to serve it."""
        if not self.has(digest(data)):
            self._write(self.tar(digest(data)), data)

    def has(self, code: str) -> bool:
        try:
            return digest(self.tar(code).read_bytes()) == code
        except OSError:
            return False

    def keep(self, data: bytes, code: str, origin: dict[str, str]) -> dict[str, bytes]:
        """A bundle fetched from a peer: checked (BundleRefused), then kept; its files."""
        files = unpack(data, code, self.limits)
        self._write(self.tar(code), data)
        self._write(self.root / f"{code}.json", json.dumps(origin) + "\n")
        return files

    def origin(self, code: str) -> dict[str, str]:
        try:
            return json.loads((self.root / f"{code}.json").read_text())
        except (OSError, ValueError):
            return {}

    def files(self, code: str) -> dict[str, bytes]:
        return unpack(self.tar(code).read_bytes(), code, self.limits)

    def chunk(self, code: str, offset: int) -> tuple[int, bytes]:
        """The bundle's size and up to CHUNK_BYTES of it from `offset`."""
        with open(self.tar(code), "rb") as f:
            total = os.fstat(f.fileno()).st_size
            f.seek(min(offset, total))
            return total, f.read(CHUNK_BYTES)

    def materialize(self, code: str) -> Path:
        """The directory a worker runs the stored bundle from, its files checked
        against the bundle now (and rewritten from it when they differ)."""
        try:
            files = self.files(code)
        except OSError as exc:
            raise ConfigError(f"the job's code bundle {code} is not in {self.root}: {exc.strerror}") from None
        except BundleRefused as exc:
            raise ConfigError(f"the stored code bundle {self.tar(code)} is refused: {exc}") from None
        target = self.dir(code)
        if all(_holds(target, name, data) for name, data in files.items()):
            return target
        fresh = Path(tempfile.mkdtemp(prefix=f".{code[:12]}-", dir=self.root))
        for name, data in files.items():
            path = fresh / check_name(name)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        # Moved aside under a name of its own (rename replaces an empty directory):
        # a fixed name left behind by a crash would block every later rewrite.
        old = Path(tempfile.mkdtemp(prefix=f".old-{code[:12]}-", dir=self.root))
        if target.exists():
            target.rename(old)
        fresh.rename(target)
        shutil.rmtree(old, ignore_errors=True)
        return target

    def _write(self, path: Path, data: bytes | str) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)


def _holds(root: Path, name: str, data: bytes) -> bool:
    try:
        return (root / name).read_bytes() == data
    except OSError:
        return False
