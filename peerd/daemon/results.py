"""A finished job's model, for its members that were away at the end
(docs/operations.md, "When a member comes back after the end").

A worker that finished writes model.pt (the job's consensus) and model.json (its
record) into its directory. Its daemon keeps them and serves them in 1 MiB
ranges to the daemons of the job's other members (`GetJobResult`, proving the
job secret both ways when the job has one). A worker that comes back after the
job ended elsewhere (a crash, a pause, a frozen or restarted daemon) asks its
own daemon to take that model (`TakeResult`): the daemon asks the daemons whose
workers finished, checks the bytes against the sender's sha256 and the record
against the worker's own state fingerprint (the same job, the same model
layout), and writes both files into the worker's directory. The worker never
ends with a model of its own that would pass for the job's.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from peerd.core.codes import WorkerState
from peerd.daemon.jobs import ENDED, JOINED, LocalJob, WorkerProcess
from peerd.errors import PeerdError, UnknownJob
from peerd.proto.v1 import control_pb2, peer_pb2
from peerd.settings.jobspec import JobSpec, parse_job

log = logging.getLogger("peerd")

CHUNK_BYTES = 1 << 20
MAX_HOLDERS = 16  # daemons asked for one take, at most
TAKEN, PENDING, NONE, SAME = "taken", "pending", "none", "same"

# (daemon peer id, request) -> one range of the result (peerd.daemon.hello.HelloClient.job_result)
FetchRange = Callable[[str, peer_pb2.JobResultRequest], Awaitable[peer_pb2.JobResultReply]]


@dataclass(frozen=True)
class Saved:
    """A model a worker of this daemon saved when its job finished."""

    path: Path  # model.pt; model.json beside it
    member: str

    @property
    def record(self) -> str:
        return self.path.with_suffix(".json").read_text()


@dataclass(frozen=True)
class Finished:
    """A job this daemon's worker finished before the daemon (re)started: not
    resumed, but kept, advertised and served, so its model outlives the restart."""

    spec: JobSpec
    saved: Saved
    secret_file: Path | None


def finished_job(job_dir: Path, candidates: list[Saved], default_secret: Path | None) -> Finished | None:
    """The job in `job_dir` if it finished here with a saved model among `candidates`."""
    try:
        if (job_dir / ENDED).read_text().strip() != WorkerState.FINISHED:
            return None
        spec = parse_job((job_dir / "job.toml").read_text(), "job spec")
        joined = json.loads((job_dir / JOINED).read_text())
        saved = next((s for s in candidates if s.path.is_file() and s.path.with_suffix(".json").is_file()), None)
        if saved is None:
            return None
        return Finished(spec, saved, spec.secret_here(joined.get("spec_dir", ""), default_secret,
                                                      bool(joined.get("by_name"))))
    except (OSError, ValueError, PeerdError) as exc:
        log.warning("the finished job in %s cannot be served: %s", job_dir, exc)
        return None


def saved_model(job: LocalJob) -> Saved | None:
    """The model one of the job's workers here saved when it finished, if any."""
    for w in job.workers:
        path = w.launch.log_path.parent / "model.pt"
        if w.state == WorkerState.FINISHED and path.is_file() and path.with_suffix(".json").is_file():
            return Saved(path, w.member)
    return None


class ResultFiles:
    """The serving side: ranges of a saved model, each with the whole file's sha256."""

    def __init__(self) -> None:
        self._hashes: dict[Path, tuple[tuple[int, int], str]] = {}

    def sha256(self, path: Path) -> str:
        st = path.stat()
        key = (st.st_mtime_ns, st.st_size)
        known = self._hashes.get(path)
        if known is None or known[0] != key:
            h = hashlib.sha256()
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(CHUNK_BYTES), b""):
                    h.update(block)
            known = self._hashes[path] = (key, h.hexdigest())
        return known[1]

    def reply(self, saved: Saved, offset: int, record_only: bool = False) -> peer_pb2.JobResultReply:
        total = saved.path.stat().st_size
        if offset > total:
            raise UnknownJob(f"offset {offset} is past the model's {total} bytes")
        data = b""
        if not record_only:
            with open(saved.path, "rb") as f:
                f.seek(offset)
                data = f.read(CHUNK_BYTES)
        return peer_pb2.JobResultReply(total=total, offset=offset, data=data, sha256=self.sha256(saved.path),
                                       record=saved.record if offset == 0 else "", member=saved.member)


class TakeRefused(PeerdError):
    """What one daemon sent could not be taken as the job's model."""


async def download(fetch: FetchRange, holder: str, name: str, spec_fingerprint: str) -> tuple[bytes, dict, str]:
    """model.pt's bytes, its record and the member that saved it, from `holder`, checked whole."""
    parts, offset, total, first = [], 0, -1, None
    while offset != total:
        reply = await fetch(holder, peer_pb2.JobResultRequest(name=name, spec_fingerprint=spec_fingerprint,
                                                              offset=offset))
        if first is None:
            first, total = reply, reply.total
        if (reply.total != total or reply.offset != offset or reply.sha256 != first.sha256
                or (not reply.data and offset < total) or offset + len(reply.data) > total):
            raise TakeRefused(f"{holder} sent an inconsistent range of the model")
        parts.append(reply.data)
        offset += len(reply.data)
    data = b"".join(parts)
    if hashlib.sha256(data).hexdigest() != first.sha256:
        raise TakeRefused(f"the model from {holder} does not match its sha256")
    try:
        record = json.loads(first.record)
    except ValueError:
        raise TakeRefused(f"{holder} sent an unreadable model record") from None
    if not isinstance(record, dict):
        raise TakeRefused(f"{holder} sent an unreadable model record")
    return data, record, first.member or holder


def write_taken(out_dir: Path, data: bytes, record: dict) -> None:
    """model.pt, then model.json, each atomically: a crash leaves the old files or the new."""
    for name, payload in (("model.pt", data), ("model.json", (json.dumps(record, indent=1, sort_keys=True)
                                                                + "\n").encode())):
        tmp = out_dir / f"{name}.tmp"
        with open(tmp, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out_dir / name)


async def same_as(fetch: FetchRange, holder: str, name: str, spec_fingerprint: str, digest: str) -> str:
    """The member whose saved model on `holder` has consensus `digest`; "" when it differs."""
    reply = await fetch(holder, peer_pb2.JobResultRequest(name=name, spec_fingerprint=spec_fingerprint,
                                                          record_only=True))
    try:
        record = json.loads(reply.record)
    except ValueError:
        raise TakeRefused(f"{holder} sent an unreadable model record") from None
    return (reply.member or holder) if isinstance(record, dict) and record.get("consensus_digest") == digest else ""


async def take_result(fetch: FetchRange, job: LocalJob, worker: WorkerProcess, holders: list[str],
                      request: control_pb2.ResultRequest) -> control_pb2.ResultReply:
    """Ask `holders` (daemons whose workers finished the job) in turn for its
    model; the first that sends a whole, matching one is written for `worker`.
    With `request.digest` (the worker's own end), the first holder with a model
    decides: the same model is not downloaded ("same"), another is taken."""
    tried = []
    for holder in holders[:MAX_HOLDERS]:
        try:
            if request.digest and (member := await same_as(fetch, holder, job.spec.name, job.spec.fingerprint,
                                                           request.digest)):
                return control_pb2.ResultReply(outcome=SAME, from_peer=member)
            data, record, member = await download(fetch, holder, job.spec.name, job.spec.fingerprint)
        except PeerdError as exc:
            tried.append(f"{holder}: {exc}")
            continue
        if record.get("fingerprint") != request.fingerprint:
            tried.append(f"{holder}: its model is of another state layout ({record.get('fingerprint')!r})")
            continue
        record["taken_from"] = member
        await asyncio.to_thread(write_taken, worker.launch.log_path.parent, data, record)
        log.info("took the model of job %s from %s (%s, %d bytes, consensus %s) for worker %s", job.spec.name,
                 holder, member, len(data), record.get("consensus_digest", "?"), worker.member)
        return control_pb2.ResultReply(outcome=TAKEN, from_peer=member, record=json.dumps(record))
    if not holders:
        return control_pb2.ResultReply(outcome=PENDING, detail="no member's daemon holds the job's model yet")
    return control_pb2.ResultReply(outcome=NONE, detail="; ".join(tried))
