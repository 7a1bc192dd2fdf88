"""Joining a job by name (docs/operations.md, "A job's code travels"): its spec
from a peer that runs it; its code from the operator's directory, the daemon's
store, or a peer that proves the job secret (checked against the hash the spec
names); and code that came from a peer runs only once the operator confirmed its
hash."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from peerd.security.auth import Authenticator, load_secret
from peerd.settings.config import DaemonConfig
from peerd.core.bundle import BundleRefused, digest, mib, pack
from peerd.core.membership import Membership
from peerd.daemon.codestore import CodeStore, collect
from peerd.daemon.hello import HelloClient
from peerd.daemon.registry import check_code
from peerd.errors import ConfigError, JobMismatch, PeerdError, PeerUnavailable, UnknownJob
from peerd.settings.jobspec import JobSpec, parse_job
from peerd.proto.v1 import control_pb2, peer_pb2

log = logging.getLogger("peerd")
FROM_PEERS = ("stored", "fetched")  # sources of code that must be confirmed before it runs


@dataclass(frozen=True)
class Found:
    """A job found by name, and where its code is: "none" (nothing of it travels),
    "local" (the operator's directory holds the same code), "stored" or "fetched"."""

    text: str
    spec: JobSpec
    source: str = "none"
    origin: dict[str, str] = field(default_factory=dict)
    files: tuple[str, ...] = ()
    size: int = 0


class ByName:
    def __init__(self, config: DaemonConfig, membership: Membership, hello: HelloClient, store: CodeStore,
                 join: Callable[[str, str, bool, bool], Awaitable[JobSpec]]) -> None:
        self.config, self.membership, self.hello, self.store = config, membership, hello, store
        self._join = join

    async def spec(self, name: str) -> tuple[str, JobSpec, list[str]]:
        """The job's text and spec from a peer that runs it, and the peers that do."""
        specs = {fp: peers for (n, fp), peers in self.membership.jobs().items() if n == name}
        if not specs:
            raise UnknownJob(f"no peer in realm {self.config.realm!r} runs job {name!r} (`peerctl jobs` lists them)")
        if len(specs) > 1:
            raise JobMismatch(f"job {name!r} runs with {len(specs)} different specs on the LAN; join with a job file")
        [(fingerprint, peers)] = specs.items()
        for peer_id in peers:
            try:
                reply = await self.hello.job_spec(peer_id, name)
                spec = parse_job(reply.spec_toml, f"job spec from {peer_id}")
            except PeerdError as exc:
                log.warning("could not get the spec of %s from %s: %s", name, peer_id, exc)
                continue
            if spec.fingerprint != fingerprint:
                log.warning("%s sent a spec of %s that does not match its fingerprint; ignored", peer_id, name)
                continue
            return reply.spec_toml, spec, peers
        raise PeerUnavailable(f"none of {', '.join(peers)} sent the spec of job {name!r}")

    async def find(self, name: str, spec_dir: str) -> Found:
        """The job, with its code here: fetched from its peers when neither the
        operator's directory nor the store holds it and this machine has the secret."""
        text, spec, peers = await self.spec(name)
        if not spec.code:
            return Found(text, spec)
        files, why = _local(spec, spec_dir)
        if not why:
            return Found(text, spec, "local", files=tuple(sorted(files)), size=len(pack(files)))
        if self.store.has(spec.code):
            return self._found(text, spec, "stored", self.store.files(spec.code), self.store.origin(spec.code))
        secret = spec.secret_here(spec_dir, self.config.job_secret_file, by_name=True)
        if secret is None or not secret.exists():
            raise ConfigError(
                f"job {name!r}: {why}. This machine holds no job secret{f' (no file {secret})' if secret else ''}, "
                "and a job's code is only taken from peers "
                f"that prove it: put the job's code in {spec_dir} (peerctl join --dir), or give this machine the "
                "job secret ([auth] job_secret_file, or the job's secret_file there) to fetch it")
        files, origin = await self.fetch(spec, peers, Authenticator(load_secret(secret)))
        return self._found(text, spec, "fetched", files, origin)

    def _found(self, text: str, spec: JobSpec, source: str, files: dict[str, bytes],
               origin: dict[str, str]) -> Found:
        return Found(text, spec, source, origin, tuple(sorted(files)), self.store.tar(spec.code).stat().st_size)

    async def fetch_code(self, name: str, spec_dir: str) -> control_pb2.FetchCodeReply:
        found = await self.find(name, spec_dir)
        # The files the operator is asked about are there to read before the answer.
        path = str(self.store.materialize(found.spec.code)) if found.source in FROM_PEERS else ""
        return control_pb2.FetchCodeReply(
            name=name, spec_fingerprint=found.spec.fingerprint, code=found.spec.code, source=found.source,
            from_peer=found.origin.get("peer", ""), from_address=found.origin.get("address", ""),
            files=found.files, size=found.size, path=path)

    async def join(self, name: str, spec_dir: str, accept_code: str) -> JobSpec:
        """Join with the job's code where `find` puts it; code from peers only
        when `accept_code` is its hash (the operator saw and confirmed it)."""
        found = await self.find(name, spec_dir)
        code = found.spec.code
        if found.source in FROM_PEERS and accept_code != code:
            if not accept_code:
                raise ConfigError(f"job {name!r} runs code from its peers (bundle {code}, from "
                                  f"{found.origin.get('peer', 'a peer')}): `peerctl join {name}` shows it and asks "
                                  "before it runs (--yes to confirm at once)")
            raise JobMismatch(f"job {name!r} runs code bundle {code}, not the {accept_code} confirmed: refused, "
                              "nothing runs")
        return await self._join(found.text, spec_dir, found.source in FROM_PEERS, True)

    async def fetch(self, spec: JobSpec, peers: list[str], auth: Authenticator) -> tuple[dict, dict[str, str]]:
        refusals, mismatch = [], False
        for peer_id in peers:
            record = self.membership.get(peer_id)
            origin = {"peer": peer_id, "address": record.address if record else ""}
            try:
                files = self.store.keep(await self._download(peer_id, spec, auth), spec.code, origin)
            except BundleRefused as exc:
                log.warning("refused the code of job %s from %s: %s", spec.name, peer_id, exc)
                refusals.append(f"{peer_id}: {exc}")
                mismatch |= exc.reason == "mismatch"
                continue
            except PeerdError as exc:
                log.warning("could not fetch the code of job %s from %s: %s", spec.name, peer_id, exc)
                refusals.append(f"{peer_id}: {exc}")
                continue
            log.info("fetched the code of job %s from %s (bundle %s, %d files), verified", spec.name, peer_id,
                     spec.code, len(files))
            return files, origin
        kind = JobMismatch if mismatch else PeerUnavailable
        raise kind(f"job {spec.name!r}: refused, nothing runs; no peer sent its code bundle {spec.code}: "
                   + "; ".join(refusals))

    async def _download(self, peer_id: str, spec: JobSpec, auth: Authenticator) -> bytes:
        limit, parts, offset, total = self.store.limits.max_bytes, [], 0, -1
        while offset != total:
            reply = await self.hello.job_code(
                peer_id, peer_pb2.JobCodeRequest(name=spec.name, code=spec.code, offset=offset), auth)
            if total < 0:
                total = reply.total
                if total > limit:
                    raise BundleRefused(f"{peer_id} offers a code bundle of {mib(total)}, over the limit of "
                                        f"{mib(limit)}", "size")
            if reply.total != total or reply.offset != offset or not reply.data or offset + len(reply.data) > total:
                raise PeerUnavailable(f"{peer_id} sent an inconsistent range of the code bundle")
            parts.append(reply.data)
            offset += len(reply.data)
        return b"".join(parts)


def _local(spec: JobSpec, spec_dir: str) -> tuple[dict[str, bytes], str]:
    """The job's code in the operator's directory, and why it is not the job's
    ("" when it is: the same bundle)."""
    try:
        check_code(spec, spec_dir)
        files = collect(spec, spec_dir)
        code = digest(pack(files)) if files else ""
    except (ConfigError, BundleRefused) as exc:
        return {}, str(exc)
    if code == spec.code:
        return files, ""
    return files, (f"the job's code in {Path(spec_dir)} is not the job's (bundle {code or 'none'} there, "
                   f"{spec.code} in the job)")
