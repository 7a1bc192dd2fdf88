"""The peerd daemon: wiring of discovery, membership, job supervision and the
gRPC services, with a fixed start and stop order."""

from __future__ import annotations

import asyncio
import grp
import importlib.machinery
import importlib.util
import json
import logging
import os
import secrets
import socket
import sys
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2
from grpc_health.v1.health import aio as health_aio

from peerd import __version__
from peerd.config import DaemonConfig
from peerd.core.membership import ACTIVE_STATES, JobEntry, Membership, PeerRecord
from peerd.core.workers import member_ids, split_threads, worker_devices
from peerd.daemon.devices import local_gpus
from peerd.daemon.discovery import Discovery
from peerd.daemon.jobs import ENDED, JOINED, LocalJob, WorkerLaunch, WorkerProcess
from peerd.daemon.localdata import check_local_job
from peerd.daemon.metrics import MetricsServer, make_registry
from peerd.daemon.notify import sd_notify, watchdog_interval_s
from peerd.daemon.standby import Standby
from peerd.auth import Authenticator, load_secret
from peerd.daemon.services import (
    GET_JOB_SPEC, HELLO, ControlServicer, PeerClient, PeerServicer, SupervisorServicer, hello_request,
    start_peer_server,
)
from peerd.errors import ConfigError, JobMismatch, PeerUnavailable, PeerdError, UnknownJob
from peerd.jobspec import JobSpec, parse_job
from peerd.proto.v1 import control_pb2, control_pb2_grpc, peer_pb2
from peerd.tls import load_tls

log = logging.getLogger("peerd")
HELLO_TIMEOUT_S = 2.0
SOCKET_GROUP = "peerd"
SHUTDOWN_RESERVE_S = 5.0  # of daemon.stop_timeout_s, kept for unannouncing and stopping the servers


def load_peer_id(config: DaemonConfig) -> str:
    """The configured id, or one made on first start and kept in state_dir."""
    if config.peer_id:
        return config.peer_id
    path = config.state_dir / "peer_id"
    if path.exists():
        return path.read_text().strip()
    host = "".join(c if c.isalnum() else "-" for c in socket.gethostname())[:40].strip("-") or "peer"
    peer_id = f"{host}-{secrets.token_hex(3)}"
    config.state_dir.mkdir(parents=True, exist_ok=True)
    _write_atomic(path, peer_id + "\n")
    return peer_id


class Daemon:
    def __init__(self, config: DaemonConfig) -> None:
        self.config = config
        self.peer_id = load_peer_id(config)
        self.started = time.monotonic()
        self.membership = Membership(self.peer_id, config.peer_timeout_s)
        self._worker_changed = asyncio.Event()  # a worker started or stopped serving: Hello now
        self._pulling: set[str] = set()  # peers asked out of turn, until they answer
        # One worker per device for every job; `[worker] devices = "auto"` counts the GPUs once, here.
        self.devices = worker_devices(config.worker_devices, 0 if config.worker_devices else local_gpus())
        self.members = member_ids(self.peer_id, len(self.devices))
        self.standby = Standby(len(self.devices)) if config.worker_standby else None
        self.jobs: dict[str, LocalJob] = {}
        self.peer_address = ""
        self._addresses: dict[str, str] = {}  # peer id -> Peer service address
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._health = health_aio.HealthServicer()
        self._peer_server: grpc.aio.Server | None = None
        self._control_server: grpc.aio.Server | None = None
        self._discovery: Discovery | None = None
        self._metrics: MetricsServer | None = None
        self._status = ""  # last STATUS= sent to systemd
        self._heard_of: dict[str, float] = {}  # peer id -> when a Hello (not zeroconf) told us its address
        self._tasks: list[asyncio.Task] = []
        self._announced: dict[str, str] = {}
        self._closed = False
        self._closing: set[asyncio.Task] = set()  # channel closes in flight
        # Read at start, so a missing or bad file stops the daemon with its name (exit 2).
        realm_auth = Authenticator(load_secret(config.realm_secret_file)) if config.realm_secret_file else None
        self._tls = load_tls(config.tls) if config.tls else None
        self._peers = PeerClient(realm_auth, self._tls)
        self.peer_servicer = PeerServicer(self, realm_auth)
        if config.job_secret_file:
            load_secret(config.job_secret_file)

    # ---- lifecycle -------------------------------------------------------

    async def start(self) -> None:
        self.config.state_dir.mkdir(parents=True, exist_ok=True)
        await self._start_peer_server()
        await self._start_control_server()
        if self.config.metrics_port:
            self._metrics = MetricsServer(make_registry(self), self.config.metrics_host, self.config.metrics_port)
            await self._metrics.start()
            log.info("metrics on http://%s/metrics", self._metrics.address)
        self._announced = self._txt()
        if self.config.zeroconf:
            host, port = self.peer_address.rsplit(":", 1)
            self._discovery = Discovery(
                self.peer_id, self.config.realm, self.config.host, int(port), self.config.interfaces,
                on_found=self.learn_address, on_lost=self._lost,
            )
            await self._discovery.start(self._announced)
        if self.config.seeds:
            log.info("seed peers: %s", ", ".join(self.config.seeds))
        await self._health.set("", health_pb2.HealthCheckResponse.SERVING)
        if self.standby is not None:
            await self.standby.start()
        self._tasks.append(asyncio.create_task(self._hello_loop(), name="hello"))
        self._tasks.append(asyncio.create_task(self._resume_jobs(), name="resume"))
        interval = watchdog_interval_s()
        if interval:
            self._tasks.append(asyncio.create_task(self._watchdog(interval), name="watchdog"))
        sd_notify(f"READY=1\nSTATUS=serving as {self.peer_id} on {self.peer_address}")
        log.info("peerd %s serving as %s: peer %s, control %s; %d worker(s) per job on %s",
                 __version__, self.peer_id, self.peer_address, self.config.control_socket, len(self.devices),
                 ", ".join(self.devices))

    async def _start_peer_server(self) -> None:
        self._peer_server, self.peer_address = await start_peer_server(
            self.peer_servicer, self._health, self.config.host, self.config.peer_port, self._tls)

    async def _start_control_server(self) -> None:
        path = self.config.control_socket
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            if await _socket_answers(path):
                raise ConfigError(f"another peerd is already serving {path}")
            path.unlink()  # left by a daemon that died
        server = grpc.aio.server()
        control_pb2_grpc.add_ControlServicer_to_server(ControlServicer(self), server)
        control_pb2_grpc.add_SupervisorServicer_to_server(SupervisorServicer(self), server)
        if server.add_insecure_port(f"unix:{path}") == 0:
            raise ConfigError(f"cannot bind the control socket {path}")
        await server.start()
        os.chmod(path, 0o660)
        _give_to_group(path, SOCKET_GROUP)
        self._control_server = server

    async def aclose(self) -> None:
        """Stop in order, within daemon.stop_timeout_s: health NOT_SERVING; each
        job's worker ends its round, checkpoints and exits (killed if it overruns);
        unannounced from zeroconf; servers down. Jobs stay joined: the next start
        resumes them."""
        if self._closed:
            return
        self._closed = True
        started = time.monotonic()
        sd_notify("STOPPING=1\nSTATUS=stopping: finishing rounds and checkpointing")
        log.info("stopping: health NOT_SERVING, then %d job(s), zeroconf, servers", len(self.jobs))
        await self._health.enter_graceful_shutdown()
        await asyncio.gather(*(job.stop(drain=False) for job in self.jobs.values()))
        if self.standby is not None:
            await self.standby.aclose()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        sd_notify("STATUS=stopping: leaving zeroconf")
        if self._discovery is not None:
            try:
                await asyncio.wait_for(self._discovery.aclose(), SHUTDOWN_RESERVE_S / 2)
            except TimeoutError:
                log.warning("zeroconf did not close in %.1fs", SHUTDOWN_RESERVE_S / 2)
        if self._metrics is not None:
            await self._metrics.aclose()
        await asyncio.gather(*(server.stop(grace=1.0) for server in (self._peer_server, self._control_server)
                               if server is not None))
        await asyncio.gather(*self._closing, *(c.close() for c in self._channels.values()), return_exceptions=True)
        if self._control_server is not None:  # only remove a socket this daemon made
            self.config.control_socket.unlink(missing_ok=True)
        log.info("peerd %s stopped in %.1fs", self.peer_id, time.monotonic() - started)

    async def _watchdog(self, interval: float) -> None:
        while True:  # pinged from the loop itself: a hung loop stops the pings
            sd_notify("WATCHDOG=1")
            await asyncio.sleep(interval)

    # ---- membership --------------------------------------------------------

    def learn_address(self, peer_id: str, address: str, via: str = "zeroconf") -> None:
        """A peer's address from zeroconf, or (via="hello") from a Hello: its own
        request, or a reply listing the peers the replier knows. Addresses heard
        of by Hello are dropped again when the peer stops answering."""
        if peer_id == self.peer_id:
            return
        if via == "zeroconf":
            self._heard_of.pop(peer_id, None)
        elif peer_id not in self._addresses or peer_id in self._heard_of:
            self._heard_of[peer_id] = time.monotonic()
        if self._addresses.get(peer_id) != address:
            log.info("found peer %s at %s (%s)", peer_id, address, via)
            self._forget_address(peer_id)  # a restarted peer comes back on another port
            self._addresses[peer_id] = address

    def _lost(self, peer_id: str) -> None:
        log.info("peer %s withdrew its announcement", peer_id)
        self._forget_address(peer_id)
        self.membership.forget(peer_id)

    def _forget_address(self, peer_id: str) -> None:
        address = self._addresses.pop(peer_id, None)
        if address is not None and address not in self._addresses.values():
            channel = self._channels.pop(address, None)
            if channel is not None:
                task = asyncio.ensure_future(channel.close())
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)

    async def _hello_loop(self) -> None:
        changed = False
        while True:
            try:
                await self._hello_all(changed)
            except Exception:  # one bad round must not stop discovery for good
                log.exception("hello round failed")
            try:  # every interval, or at once (asking the others back) when a worker starts or stops serving
                await asyncio.wait_for(self._worker_changed.wait(), self.config.hello_interval_s)
            except TimeoutError:
                pass
            changed = self._worker_changed.is_set()
            self._worker_changed.clear()

    async def _hello_all(self, changed: bool = False) -> None:
        known = set(self._addresses.values())
        seeds = [a for a in self.config.seeds if a not in known and a != self.peer_address]
        await asyncio.gather(*(self._hello(p, a, changed) for p, a in list(self._addresses.items())),
                             *(self._hello("", a, changed) for a in seeds))
        now = time.monotonic()
        for peer_id in self.membership.expire(now):
            log.warning("peer %s timed out", peer_id)
        for peer_id, since in list(self._heard_of.items()):
            if self.membership.get(peer_id) is None and now - since > self.config.peer_timeout_s:
                self._heard_of.pop(peer_id)
                self._forget_address(peer_id)  # heard of, but silent: not tried forever
        await self._announce_if_changed()
        self._notify_status()

    def _notify_status(self) -> None:
        jobs = ", ".join(f"{n} {j.state}" for n, j in sorted(self.jobs.items())) or "none"
        status = f"serving as {self.peer_id} on {self.peer_address}: {len(self.membership.peers())} peers; jobs: {jobs}"
        if status != self._status:
            self._status = status
            sd_notify(f"STATUS={status}")

    def _channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = self._peers.channel(address)
        return channel

    def pull_soon(self, peer_id: str) -> None:
        """A peer says its workers changed: ask it now rather than at the next
        interval (one ask in flight per peer), so a leave or a join reaches the
        other workers' views within a Hello round trip."""
        address = self._addresses.get(peer_id)
        if address is None or peer_id in self._pulling:
            return
        self._pulling.add(peer_id)
        task = asyncio.create_task(self._hello(peer_id, address))
        task.add_done_callback(lambda _: self._pulling.discard(peer_id))
        self._closing.add(task)  # awaited on shutdown like a channel close
        task.add_done_callback(self._closing.discard)

    async def _hello(self, peer_id: str, address: str, changed: bool = False) -> None:
        try:
            reply = await self._peers.call(
                self._channel(address), HELLO,
                hello_request(self.peer_id, self.peer_address, self.config.realm, changed),
                peer_pb2.HelloReply, HELLO_TIMEOUT_S)
        except PeerdError as exc:
            log.debug("hello to %s at %s failed: %s", peer_id, address, exc)
            return  # silence counts against it through the membership timeout
        if reply.realm != self.config.realm:
            if peer_id:
                self._forget_address(peer_id)
            return
        if not peer_id:  # a seed: now we know who answers there
            if reply.peer_id == self.peer_id or not reply.peer_id:
                return
            self.learn_address(reply.peer_id, address, via="hello")
        for known in reply.known:  # passed onward: discovery reaches beyond the seeds
            if known.peer_id and known.address and known.peer_id not in self._addresses:
                self.learn_address(known.peer_id, known.address, via="hello")
        jobs = tuple(
            JobEntry(j.name, j.spec_fingerprint, j.worker_address, j.round, j.state, j.phase, j.lr, j.global_batch,
                     j.samples_per_s, j.local_batch, j.share, j.member, j.device, j.data_samples)
            for j in reply.jobs
        )
        record = PeerRecord(reply.peer_id, address, reply.locality, reply.version, jobs, time.monotonic())
        if self.membership.observe(record):
            log.info("peer %s joined the view (%d known)", reply.peer_id, len(self.membership.peers()))

    def hello_reply(self) -> peer_pb2.HelloReply:
        return peer_pb2.HelloReply(
            peer_id=self.peer_id, version=__version__, locality=self.config.locality, realm=self.config.realm,
            known=[peer_pb2.KnownPeer(peer_id=r.peer_id, address=r.address) for r in self.membership.peers()],
            jobs=[self._job_ad(j, w) for j in self.jobs.values() for w in j.workers],
        )

    def _job_ad(self, job: LocalJob, w: WorkerProcess) -> peer_pb2.JobAd:
        p = w.progress
        return peer_pb2.JobAd(
            name=job.spec.name, spec_fingerprint=job.spec.fingerprint, worker_address=w.address, round=p.round,
            state=w.state, phase=p.phase, lr=p.lr, global_batch=p.global_batch, samples_per_s=p.samples_per_s,
            local_batch=p.local_batch, share=p.share, device=w.device, data_samples=p.data_samples,
            member=w.member if w.member != self.peer_id else "",  # a single worker's ad is as before
        )

    def _txt(self) -> dict[str, str]:
        running = sorted(n for n, j in self.jobs.items() if j.state in ACTIVE_STATES)
        # Informative: Hello replies are what peers act on (TXT values are short and may lag).
        data_plane = ",".join(f"{n}@{w.address}" for n in running for w in self.jobs[n].workers if w.address)
        return {"id": self.peer_id, "v": __version__, "realm": self.config.realm, "addr": self.peer_address,
                "loc": self.config.locality, "jobs": ",".join(running), "dp": data_plane[:200]}

    async def _announce_if_changed(self) -> None:
        txt = self._txt()
        if txt != self._announced and self._discovery is not None:
            await self._discovery.update(txt)
            self._announced = txt

    # ---- jobs ------------------------------------------------------------

    async def _resume_jobs(self) -> None:
        """Rejoin the jobs this peer was in when the daemon stopped or died.

        Waits a few Hello rounds first, so the workers see the running peers and
        take the job's state from them instead of starting over."""
        pending = [d for d in sorted((self.config.state_dir / "jobs").glob("*"))
                   if (d / JOINED).exists() and not (d / ENDED).exists()]
        if not pending:
            return
        await asyncio.sleep(3 * self.config.hello_interval_s + HELLO_TIMEOUT_S)
        for job_dir in pending:
            try:
                spec_dir = json.loads((job_dir / JOINED).read_text()).get("spec_dir", "")
                spec = await self.join((job_dir / "job.toml").read_text(), spec_dir)
                log.info("resumed job %s", spec.name)
            except (OSError, ValueError, PeerdError) as exc:
                log.error("could not resume the job in %s: %s", job_dir, exc)

    async def join_by_name(self, name: str) -> JobSpec:
        """Join a job running on the LAN, with the spec taken from a peer that runs it."""
        specs = {fp: peers for (n, fp), peers in self.membership.jobs().items() if n == name}
        if not specs:
            raise UnknownJob(f"no peer in realm {self.config.realm!r} runs job {name!r} (`peerctl jobs` lists them)")
        if len(specs) > 1:
            raise JobMismatch(f"job {name!r} runs with {len(specs)} different specs on the LAN; join with a job file")
        [(fingerprint, peers)] = specs.items()
        for peer_id in peers:
            record = self.membership.get(peer_id)
            try:
                reply = await self._peers.call(
                    self._channel(record.address), GET_JOB_SPEC, peer_pb2.JobSpecRequest(name=name),
                    peer_pb2.JobSpecReply, HELLO_TIMEOUT_S)
                spec = parse_job(reply.spec_toml, f"job spec from {peer_id}")
            except PeerdError as exc:
                log.warning("could not get the spec of %s from %s: %s", name, peer_id, exc)
                continue
            if spec.fingerprint != fingerprint:
                log.warning("%s sent a spec of %s that does not match its fingerprint; ignored", peer_id, name)
                continue
            return await self.join(reply.spec_toml, "")
        raise PeerUnavailable(f"none of {', '.join(peers)} sent the spec of job {name!r}")

    def job_spec(self, name: str) -> peer_pb2.JobSpecReply:
        job = self._job(name)
        return peer_pb2.JobSpecReply(name=name, spec_toml=(job.job_dir / "job.toml").read_text(),
                                     spec_fingerprint=job.spec.fingerprint)

    async def join(self, spec_toml: str, spec_dir: str) -> JobSpec:
        spec = parse_job(spec_toml, "job spec")
        for entry in filter(None, (spec.module, spec.model, spec.data)):
            check_importable(entry, spec_dir)
        secret_file = spec.secret_path(spec_dir) or self.config.job_secret_file
        data_root = check_local_job(spec, spec_dir, secret_file, self.config.data_root)
        if secret_file is not None:
            load_secret(secret_file)  # refuse the join now, not in a restarting worker
        current = self.jobs.get(spec.name)
        if current is not None and current.state not in ("finished", "failed", "stopped"):
            raise ConfigError(f"this peer already runs job {spec.name!r} (state {current.state})")
        for (name, fingerprint), peers in self.membership.jobs().items():
            if name == spec.name and fingerprint != spec.fingerprint:
                raise JobMismatch(
                    f"job {spec.name!r} runs on {', '.join(peers)} with another spec "
                    f"(fingerprint {fingerprint}, yours {spec.fingerprint}); use the same job file"
                )
        job_dir = self.config.state_dir / "jobs" / spec.name
        job_dir.mkdir(parents=True, exist_ok=True)
        spec_path = job_dir / "job.toml"
        _write_atomic(spec_path, spec_toml)
        _write_atomic(job_dir / JOINED, json.dumps({"spec_dir": spec_dir}) + "\n")
        (job_dir / ENDED).unlink(missing_ok=True)
        count = len(self.devices)
        launches = [
            WorkerLaunch(
                control_address=f"unix:{self.config.control_socket}", peer_id=member,
                host=self.config.host, threads=split_threads(self.config.worker_threads, count), device=device,
                spec_path=spec_path, spec_dir=spec_dir, log_path=_worker_dir(job_dir, k, count) / "worker.log",
                secret_file=secret_file, tls=self.config.tls, slowdown=self.config.slowdown,
                log_format=self.config.log_format, data_root=data_root,
            )
            for k, (member, device) in enumerate(zip(self.members, self.devices))
        ]
        job = LocalJob.create(spec, job_dir, launches, self.config.restart_backoff_s,
                              self.config.restart_backoff_max_s,
                              stop_grace_s=max(1.0, self.config.stop_timeout_s - SHUTDOWN_RESERVE_S),
                              standby=self.standby)
        self.jobs[spec.name] = job
        job.start()
        log.info("joined job %s (fingerprint %s)", spec.name, spec.fingerprint)
        return spec

    async def leave(self, name: str, drain: bool) -> None:
        job = self._job(name)
        await job.stop(drain)
        del self.jobs[name]
        (job.job_dir / JOINED).unlink(missing_ok=True)  # left on purpose: not resumed
        await self._announce_if_changed()
        log.info("left job %s%s", name, " after draining" if drain else "")

    def _job(self, name: str) -> LocalJob:
        job = self.jobs.get(name)
        if job is None:
            raise UnknownJob(f"this peer does not run job {name!r}")
        return job

    def worker_heartbeat(self, report: control_pb2.WorkerReport) -> control_pb2.WorkerView:
        job = self._job(report.job)
        worker = job.worker(report.member)
        if worker is None:
            raise UnknownJob(f"this peer runs no worker {report.member!r} of job {report.job!r}")
        serving = worker.address
        worker.on_heartbeat(report)
        if worker.address != serving:  # joined or leaving: the others should know now, not in a second
            self._worker_changed.set()
        name, fingerprint = job.spec.name, job.spec.fingerprint
        peers = [control_pb2.PeerEndpoint(peer_id=w.member, address=w.address, locality=w.locality, daemon=w.daemon)
                 for w in self.membership.job_workers(name, fingerprint)]
        # This daemon's own workers: the one reporting, and its siblings of the job.
        mine = [w for w in job.workers if w is worker or w.state in ACTIVE_STATES]
        peers += [control_pb2.PeerEndpoint(peer_id=w.member, address=w.address, locality=self.config.locality,
                                           daemon=self.peer_id) for w in mine if w.address]
        members = [*self.membership.job_members(name, fingerprint), *(w.member for w in mine)]
        settled = time.monotonic() - self.started >= self.config.peer_timeout_s
        speeds = {**self.membership.job_speeds(name, fingerprint),
                  **{w.member: w.progress.samples_per_s for w in mine if w is not worker}}
        sizes = {**self.membership.job_data_sizes(name, fingerprint),
                 **{w.member: w.progress.data_samples for w in mine if w is not worker}}
        return control_pb2.WorkerView(
            peers=peers, members=members, stop=worker.stop_requested, settled=settled,
            speeds=[control_pb2.MemberSpeed(peer_id=p, samples_per_s=v, data_samples=sizes.get(p, 0))
                    for p, v in speeds.items()])

    # ---- control API -------------------------------------------------------

    def status(self) -> control_pb2.StatusReply:
        return control_pb2.StatusReply(
            peer_id=self.peer_id, version=__version__, uptime_s=time.monotonic() - self.started,
            peer_address=self.peer_address, locality=self.config.locality,
            peers_known=len(self.membership.peers()),
            jobs=[self._local_job(j) for j in self.jobs.values()],
        )

    def _local_job(self, job: LocalJob) -> control_pb2.LocalJob:
        first = job.first
        workers = [
            control_pb2.LocalWorker(member=w.member, device=w.device, state=w.state, pid=w.pid, restarts=w.restarts,
                                    progress=w.progress, log_path=str(w.launch.log_path), address=w.address)
            for w in job.workers
        ]
        return control_pb2.LocalJob(
            name=job.spec.name, state=job.state, spec_fingerprint=job.spec.fingerprint, worker_pid=first.pid,
            restarts=sum(w.restarts for w in job.workers), progress=first.progress,
            log_path=str(first.launch.log_path), workers=workers,
            view_size=len(self.membership.job_view(job.spec.name, job.spec.fingerprint)) + len(job.workers),
        )

    def peer_states(self) -> dict[str, str]:
        """Peer id -> "alive", or "suspected" when it missed the last two Hellos."""
        now = time.monotonic()
        suspect_after = 2 * self.config.hello_interval_s + HELLO_TIMEOUT_S
        return {r.peer_id: "suspected" if now - r.last_seen > suspect_after else "alive"
                for r in self.membership.peers()}

    def list_peers(self) -> control_pb2.ListPeersReply:
        now = time.monotonic()
        states = self.peer_states()
        return control_pb2.ListPeersReply(peers=[
            control_pb2.PeerInfo(
                peer_id=r.peer_id, address=r.address, locality=r.locality, version=r.version,
                jobs=sorted({j.name for j in r.jobs}), last_seen_s=now - r.last_seen,
                state=states.get(r.peer_id, "alive"),
                job_states=[control_pb2.PeerJob(name=j.name, state=j.state, phase=j.phase, round=j.round,
                                                lr=j.lr, global_batch=j.global_batch, samples_per_s=j.speed,
                                                local_batch=j.local_batch, share=j.share,
                                                member=j.member or r.peer_id, device=j.device) for j in r.jobs],
            )
            for r in self.membership.peers()
        ])

    def list_jobs(self) -> control_pb2.ListJobsReply:
        jobs = self.membership.jobs()
        for name, j in self.jobs.items():
            if j.state in ACTIVE_STATES:
                jobs.setdefault((name, j.spec.fingerprint), []).insert(0, self.peer_id)
        return control_pb2.ListJobsReply(jobs=[
            control_pb2.JobInfo(name=name, spec_fingerprint=fp, peer_ids=peers,
                                local=self.peer_id in peers)
            for (name, fp), peers in sorted(jobs.items())
        ])


def _worker_dir(job_dir: Path, k: int, count: int) -> Path:
    """Where worker k keeps its log, checkpoints and model: the job's directory
    for a single worker (as before several were possible), else worker-<k>/."""
    return job_dir if count == 1 else job_dir / f"worker-{k}"


def _give_to_group(path: Path, group: str) -> None:
    """Make `group` the socket's group, so its members may use peerctl."""
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        log.info("no group %r on this machine: %s keeps its group (gid %d)", group, path, path.stat().st_gid)
        return
    try:
        os.chown(path, -1, gid)
    except OSError as exc:
        log.warning("cannot give %s to group %r: %s", path, group, exc.strerror)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def check_importable(entry: str, spec_dir: str) -> None:
    """Fail a join early, with the module's name, when the job's code is not on
    this machine. Only locates the top-level package: the daemon imports no job code."""
    module = entry.partition(":")[0]
    top = module.split(".")[0]
    search = [spec_dir, *sys.path] if spec_dir else sys.path
    if importlib.machinery.PathFinder.find_spec(top, search) is None and importlib.util.find_spec(top) is None:
        raise ConfigError(
            f"the job's code is not on this machine: no module named {top!r} (for {entry!r}); "
            "install it, or put it next to the job file"
        )


async def _socket_answers(path: Path) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_unix_connection(str(path)), 1.0)
    except (OSError, TimeoutError):
        return False
    writer.close()
    return True


async def serve(config: DaemonConfig, stop: asyncio.Event) -> None:
    daemon = Daemon(config)
    try:
        await daemon.start()
        await stop.wait()
    finally:
        await daemon.aclose()
