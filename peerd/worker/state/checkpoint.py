"""Atomic, checksummed checkpoints of a worker's training state.

A checkpoint is one file, `ckpt-<round>.peerd`:

    PEERDCK2\\n
    {"job": ..., "fingerprint": ..., "round": ..., "step": ..., "progress": ...,
     "numel": ..., "extra_bytes": ..., "sha256": ...}\\n
    <numel little-endian float32: the training state's vector>
    <extra_bytes: the state's extra part (peerd.worker.state.trainstate)>

`sha256` covers the header (without the sha256 key, as canonical JSON) and the
payload, so a flipped bit anywhere is caught. A file is written to a temporary
name, fsynced, renamed into place and the directory fsynced: a crash leaves
either the old set of checkpoints or the new one, never half a file under a
checkpoint's name. The newest `keep` are kept.

Loading tries the newest first and skips (with a log line) any file that is
truncated, fails its checksum, holds non-finite values, or belongs to another
job or fingerprint; a bad checkpoint is never loaded.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from peerd.worker.wire.codec import all_finite
from peerd.worker.state.pull import StateMeta

log = logging.getLogger("peerd.worker.state.checkpoint")

MAGIC = b"PEERDCK2\n"
KEEP = 2
_NAME = re.compile(r"^ckpt-(\d{10})\.peerd$")
_MAX_HEADER = 4096


class CheckpointError(ValueError):
    """A checkpoint file that must not be loaded; the message says why."""


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    meta: StateMeta
    vector: torch.Tensor  # the training state's vector (its extra part is in meta)


def _digest(header: dict, payload: bytes | memoryview) -> str:
    h = hashlib.sha256(json.dumps(header, sort_keys=True, separators=(",", ":")).encode())
    h.update(payload)
    return h.hexdigest()


def _payload(vector: torch.Tensor) -> memoryview:
    """The values as little-endian fp32 bytes, without a copy on a little-endian host."""
    values = vector.detach().to(torch.float32).contiguous().numpy().astype("<f4", copy=False)
    return memoryview(values).cast("B")


def _head(job: str, fingerprint: str, meta: StateMeta, payload: memoryview) -> bytes:
    header = {"job": job, "fingerprint": fingerprint, "round": meta.round, "step": meta.step,
              "progress": meta.progress, "numel": len(payload) // 4, "extra_bytes": len(meta.extra)}
    h = hashlib.sha256(json.dumps(header, sort_keys=True, separators=(",", ":")).encode())
    h.update(payload)
    h.update(meta.extra)
    header["sha256"] = h.hexdigest()
    return MAGIC + json.dumps(header, sort_keys=True).encode() + b"\n"


def encode(job: str, fingerprint: str, meta: StateMeta, vector: torch.Tensor) -> bytes:
    payload = _payload(vector)
    return _head(job, fingerprint, meta, payload) + payload.tobytes() + meta.extra


def decode(data: bytes | bytearray, job: str, fingerprint: str, numel: int) -> tuple[StateMeta, torch.Tensor]:
    """The state in `data`, or CheckpointError saying what is wrong with it.
    The tensor returned shares the memory of `data` when it is a bytearray."""
    if not isinstance(data, bytearray):
        data = bytearray(data)  # torch wants a writable buffer
    if not data.startswith(MAGIC):
        raise CheckpointError("not a peerd checkpoint (bad magic)")
    end = data.find(b"\n", len(MAGIC), len(MAGIC) + _MAX_HEADER)
    if end < 0:
        raise CheckpointError("truncated or malformed header")
    try:
        header = json.loads(data[len(MAGIC) : end])
        sha = header.pop("sha256")
        meta = StateMeta(int(header["round"]), int(header["step"]), float(header["progress"]))
        stored_numel, extra_bytes = int(header["numel"]), int(header["extra_bytes"])
    except (ValueError, KeyError, TypeError, AttributeError):
        raise CheckpointError("malformed header") from None
    if header.get("job") != job or header.get("fingerprint") != fingerprint:
        raise CheckpointError(f"of job {header.get('job')!r} fingerprint {header.get('fingerprint')}, "
                              f"not {job!r} {fingerprint}")
    if stored_numel != numel:
        raise CheckpointError(f"holds {stored_numel} values, the model needs {numel}")
    payload = memoryview(data)[end + 1 :]
    if extra_bytes < 0 or len(payload) != 4 * numel + extra_bytes:
        raise CheckpointError(f"truncated: {len(payload)} payload bytes, expected {4 * numel + extra_bytes}")
    if _digest(header, payload) != sha:
        raise CheckpointError("checksum mismatch (the file is corrupt)")
    if not math.isfinite(meta.progress) or meta.progress < 0 or meta.round < 0 or meta.step < 0:
        raise CheckpointError("bad round, step or progress")
    meta = StateMeta(meta.round, meta.step, meta.progress, bytes(payload[4 * numel :]))
    vector = torch.frombuffer(payload[: 4 * numel], dtype=torch.float32)
    if not all_finite(vector):
        raise CheckpointError("holds non-finite values")
    return meta, vector


class CheckpointDir:
    """The checkpoints of one job on this peer (state_dir/jobs/NAME/checkpoints)."""

    def __init__(self, path: Path, job: str, fingerprint: str, numel: int, keep: int = KEEP) -> None:
        self.path = path
        self.job = job
        self.fingerprint = fingerprint
        self.numel = numel
        self.keep = keep

    def files(self) -> list[Path]:
        """Checkpoint files, newest (highest round) first."""
        if not self.path.is_dir():
            return []
        named = [(int(m.group(1)), p) for p in self.path.iterdir() if (m := _NAME.match(p.name))]
        return [p for _, p in sorted(named, reverse=True)]

    def save(self, meta: StateMeta, vector: torch.Tensor) -> Path:
        """Write a checkpoint atomically and durably; drop all but the newest `keep`."""
        if vector.numel() != self.numel:
            raise ValueError(f"state of {vector.numel()} values, expected {self.numel}")
        self.path.mkdir(parents=True, exist_ok=True)
        payload = _payload(vector)
        head = _head(self.job, self.fingerprint, meta, payload)
        final = self.path / f"ckpt-{meta.round:010d}.peerd"
        tmp = self.path / f".{final.name}.tmp"
        with open(tmp, "wb") as f:
            f.write(head)
            f.write(payload)
            f.write(meta.extra)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        _fsync_dir(self.path)
        for old in self.files()[self.keep :]:
            old.unlink(missing_ok=True)
        return final

    def load_newest(self) -> Checkpoint | None:
        """The newest valid checkpoint; bad ones are logged and skipped."""
        for path in self.files():
            try:
                meta, vector = decode(_read(path), self.job, self.fingerprint, self.numel)
            except OSError as exc:
                log.warning("checkpoint %s unreadable (%s); skipped", path, exc.strerror)
                continue
            except CheckpointError as exc:
                log.warning("checkpoint %s is bad: %s; skipped", path, exc)
                continue
            return Checkpoint(path, meta, vector)
        return None


def verify_checkpoint(path: Path) -> StateMeta:
    """Check a checkpoint file against its own header (job, fingerprint, size,
    checksum, finite values), for tools that do not know the job: the soak
    harness, an operator's script. Raises CheckpointError; returns its meta."""
    data = _read(path)
    end = data.find(b"\n", len(MAGIC), len(MAGIC) + _MAX_HEADER)
    try:
        header = json.loads(data[len(MAGIC) : end]) if data.startswith(MAGIC) and end > 0 else {}
        job, fingerprint, numel = str(header["job"]), str(header["fingerprint"]), int(header["numel"])
    except (ValueError, KeyError, TypeError):
        raise CheckpointError("not a peerd checkpoint, or a malformed header") from None
    return decode(data, job, fingerprint, numel)[0]


def _read(path: Path) -> bytearray:
    with open(path, "rb") as f:
        data = bytearray(os.fstat(f.fileno()).st_size)
        got = f.readinto(data)
    return data[:got] if got < len(data) else data


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
