"""The peerd daemon: wiring of discovery, the Hello client and its peer
directory (peerd.daemon.hello), the job registry (peerd.daemon.registry) and
the gRPC services, with a fixed start and stop order."""

from __future__ import annotations

import asyncio
import grp
import json
import logging
import os
import secrets
import socket
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2
from grpc_health.v1.health import aio as health_aio

from peerd import __version__
from peerd.security.auth import Authenticator, load_secret
from peerd.settings.config import DaemonConfig, resolve_host
from peerd.core.codes import ACTIVE_STATES
from peerd.core.relay import settle_s, suspect_after
from peerd.core.membership import Membership, liveness
from peerd.core.names import peer_id_from_hostname, split_host_port, valid_peer_id
from peerd.core.workers import member_ids, worker_devices
from peerd.daemon.availability import Availability
from peerd.daemon.byname import ByName
from peerd.daemon.devices import local_gpus
from peerd.daemon.discovery import Discovery
from peerd.daemon.hello import HELLO_TIMEOUT_S, HelloClient
from peerd.daemon.history import History, point_of_entry, point_of_progress
from peerd.daemon.jobs import JOINED, LocalJob
from peerd.daemon.metrics import MetricsServer, make_registry, metrics_route
from peerd.daemon.notify import sd_notify, watchdog_interval_s
from peerd.daemon.registry import SHUTDOWN_RESERVE_S, JobRegistry, write_atomic
from peerd.daemon.results import take_result
from peerd.daemon.services import ControlServicer, PeerServicer, SupervisorServicer, start_peer_server
from peerd.daemon.standby import Standby
from peerd.daemon.web import page_routes
from peerd.errors import ConfigError, PeerdError, UnknownJob
from peerd.settings.jobspec import JobSpec
from peerd.proto.v1 import control_pb2, control_pb2_grpc, peer_pb2
from peerd.security.tls import load_tls

log = logging.getLogger("peerd")
EXPORT_TIMEOUT_S = 120.0  # a worker writes an export at its next round boundary
SOCKET_GROUP = "peerd"


def load_peer_id(config: DaemonConfig) -> str:
    """The configured id, or one made on first start and kept in state_dir."""
    if config.peer_id:
        return config.peer_id
    path = config.state_dir / "peer_id"
    if path.exists() and valid_peer_id(kept := path.read_text().strip()):
        return kept  # else one a peer would refuse (made from a non-ASCII hostname): make it anew
    peer_id = peer_id_from_hostname(socket.gethostname(), secrets.token_hex(3))
    config.state_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(path, peer_id + "\n")
    return peer_id


class Daemon:
    """Wires the parts together and starts and stops them in a fixed order: the
    Hello client (with the peer directory), the job registry, zeroconf, the Peer
    and control servers, metrics. Answers the control API and Hello."""

    def __init__(self, config: DaemonConfig) -> None:
        # host = "auto" is picked once, here: everything below binds and advertises the copy.
        config, self.host_pick = resolve_host(config)
        if self.host_pick is not None:
            log.info("host auto: %s", self.host_pick.describe())
        self.config = config
        self.peer_id = load_peer_id(config)
        self.started = time.monotonic()
        self.membership = Membership(self.peer_id, config.peer_timeout_s)
        self.history = History()  # the page's curves, from heartbeats and Hellos
        # One worker per device for every job; `[worker] devices = "auto"` counts the GPUs once, here.
        self.devices = worker_devices(config.worker_devices, 0 if config.worker_devices else local_gpus())
        self.members = member_ids(self.peer_id, len(self.devices))
        self.standby = Standby(len(self.devices)) if config.worker_standby else None
        self.registry = JobRegistry(config, self.peer_id, self.devices, self.members, self.membership, self.standby)
        self._health = health_aio.HealthServicer()
        self._peer_server: grpc.aio.Server | None = None
        self._control_server: grpc.aio.Server | None = None
        self._discovery: Discovery | None = None
        self._metrics: MetricsServer | None = None
        self._status = ""  # last STATUS= sent to systemd
        self._tasks: list[asyncio.Task] = []
        self._announced: dict[str, str] = {}
        self._closed = False
        # Read at start, so a missing or bad file stops the daemon with its name (exit 2).
        realm_auth = Authenticator(load_secret(config.realm_secret_file)) if config.realm_secret_file else None
        self._tls = load_tls(config.tls) if config.tls else None
        self.hello = HelloClient(self.peer_id, config, self.membership, realm_auth, self._tls)
        self.directory = self.hello.directory
        self.peer_servicer = PeerServicer(config.realm, self.hello, self.hello_reply, self.registry, realm_auth,
                                          address=lambda: self.hello.peer_address)
        self.by_name = ByName(config, self.membership, self.hello, self.registry.code, self.join)
        if config.job_secret_file:
            load_secret(config.job_secret_file)
        self.availability = Availability(config.availability, config.state_dir, self, gpus_seen=local_gpus())

    @property
    def jobs(self) -> dict[str, LocalJob]:
        return self.registry.jobs

    @property
    def peer_address(self) -> str:
        return self.hello.peer_address

    # ---- lifecycle -------------------------------------------------------

    async def start(self) -> None:
        self.config.state_dir.mkdir(parents=True, exist_ok=True)
        self._peer_server, self.hello.peer_address = await start_peer_server(
            self.peer_servicer, self._health, self.config.host, self.config.peer_port, self._tls)
        self._control_server = await self._start_control_server()
        if self.config.metrics_port:
            routes = {"/metrics": metrics_route(make_registry(self)), **page_routes(self)}
            self._metrics = MetricsServer(routes, self.config.metrics_host, self.config.metrics_port)
            await self._metrics.start()
            log.info("metrics on http://%s/metrics, the live page on http://%s/", self._metrics.address,
                     self._metrics.address)
        self._announced = self._txt()
        if self.config.zeroconf:
            self._discovery = Discovery(
                self.peer_id, self.config.realm, self.config.host, split_host_port(self.peer_address)[1],
                self.config.interfaces, on_found=self.hello.learn_address, on_lost=self.hello.lost,
            )
            await self._discovery.start(self._announced)
        if self.config.seeds:
            log.info("seed peers: %s", ", ".join(self.config.seeds))
        await self._health.set("", health_pb2.HealthCheckResponse.SERVING)
        if self.standby is not None:
            await self.standby.start()
        self._tasks.append(asyncio.create_task(self.availability.run(), name="availability"))
        self._tasks.append(asyncio.create_task(self.hello.run(self._after_hello_round), name="hello"))
        self._tasks.append(asyncio.create_task(self._resume_jobs(), name="resume"))
        interval = watchdog_interval_s()
        if interval:
            self._tasks.append(asyncio.create_task(self._watchdog(interval), name="watchdog"))
        sd_notify(f"READY=1\nSTATUS=serving as {self.peer_id} on {self.peer_address}")
        log.info("peerd %s serving as %s: peer %s, control %s; %d worker(s) per job on %s",
                 __version__, self.peer_id, self.peer_address, self.config.control_socket, len(self.devices),
                 ", ".join(self.devices))

    async def _start_control_server(self) -> grpc.aio.Server:
        path = self.config.control_socket
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            if await _socket_answers(path):
                raise ConfigError(f"another peerd is already serving {path}")
            path.unlink()  # left by a daemon that died
        server = grpc.aio.server()
        control_pb2_grpc.add_ControlServicer_to_server(ControlServicer(self), server)
        control_pb2_grpc.add_SupervisorServicer_to_server(SupervisorServicer(self.worker_heartbeat, self.take_result), server)
        if server.add_insecure_port(f"unix:{path}") == 0:
            raise ConfigError(f"cannot bind the control socket {path}")
        await server.start()
        os.chmod(path, 0o660)
        _give_to_group(path, SOCKET_GROUP)
        return server

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
        for task in self._tasks:  # no job is joined again from here on
            if task.get_name() == "availability":
                task.cancel()
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
        await self.hello.aclose()
        if self._control_server is not None:  # only remove a socket this daemon made
            self.config.control_socket.unlink(missing_ok=True)
        log.info("peerd %s stopped in %.1fs", self.peer_id, time.monotonic() - started)

    async def _watchdog(self, interval: float) -> None:
        while True:  # pinged from the loop itself: a hung loop stops the pings
            sd_notify("WATCHDOG=1")
            await asyncio.sleep(interval)

    # ---- discovery -------------------------------------------------------

    async def _after_hello_round(self) -> None:
        await self._announce_if_changed()
        self._notify_status()
        self._record_peers()

    def _record_peers(self) -> None:
        """The peers' workers as their last Hello told: points of the page's curves."""
        self.history.record_all((e.name, e.member or r.peer_id, point_of_entry(r.last_seen, e))
                                for r in self.membership.peers() for e in r.jobs)
        self.history.forget(time.monotonic())

    def _notify_status(self) -> None:
        jobs = ", ".join(f"{n} {j.state}" for n, j in sorted(self.jobs.items())) or "none"
        status = f"serving as {self.peer_id} on {self.peer_address}: {len(self.membership.peers())} peers; jobs: {jobs}"
        if not self.availability.training:
            status += f"; not training: {self.availability.not_training}"
        if status != self._status:
            self._status = status
            sd_notify(f"STATUS={status}")

    def hello_reply(self, relay: bool = False) -> peer_pb2.HelloReply:
        """This daemon's own record; with `relay`, its records of the peers too."""
        reply = peer_pb2.HelloReply(
            peer_id=self.peer_id, version=__version__, locality=self.config.locality, realm=self.config.realm,
            known=[peer_pb2.KnownPeer(peer_id=r.peer_id, address=r.address) for r in self.membership.peers()],
            jobs=self.registry.job_ads(), not_training=self.availability.not_training,
        )
        if relay:
            reply.peers.extend(self.hello.records.states(self.membership, time.monotonic()))
        return self.hello.records.stamp(reply)

    def _txt(self) -> dict[str, str]:
        running = self.registry.active()
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
        pending = self.registry.to_resume()
        if not pending:
            return
        await asyncio.sleep(3 * self.config.hello_interval_s + HELLO_TIMEOUT_S)
        for job_dir in pending:
            await self._rejoin(job_dir, "resumed")

    async def _rejoin(self, job_dir: Path, how: str) -> None:
        """Join again the job kept in `job_dir` (its job.toml and joined.json)."""
        try:
            joined = json.loads((job_dir / JOINED).read_text())
            spec = await self.join((job_dir / "job.toml").read_text(), joined.get("spec_dir", ""),
                                   bool(joined.get("fetched")), bool(joined.get("by_name")))
            log.info("%s job %s", how, spec.name)
        except (OSError, ValueError, PeerdError) as exc:
            log.error("could not join the job in %s again: %s", job_dir, exc)

    async def hold_jobs(self, reason: str) -> int:
        """The machine is not free: every active job's workers give way; the jobs stay."""
        jobs = [j for j in self.jobs.values() if j.state in ACTIVE_STATES]
        if jobs:
            log.info("leaving %s: %s", ", ".join(j.spec.name for j in jobs), reason)
        await asyncio.gather(*(j.give_way(reason) for j in jobs))
        await self._announce_if_changed()
        return len(jobs)

    async def release_jobs(self) -> int:
        """The machine is free again: the held jobs are joined again, as on a restart."""
        held = [j for j in self.jobs.values() if j.held]
        for job in held:
            await self._rejoin(job.job_dir, "joined again")
        return len(held)

    async def pause(self, for_s: float) -> str:
        return await self.availability.pause(for_s)

    async def resume(self) -> str:
        return await self.availability.resume()

    async def join_by_name(self, name: str, spec_dir: str = "", accept_code: str = "") -> JobSpec:
        """Join a job running on the LAN, its spec and code as peerd.daemon.byname
        finds them; `spec_dir`: where the job's relative paths are on this machine."""
        return await self.by_name.join(name, spec_dir, accept_code)

    async def fetch_code(self, name: str, spec_dir: str) -> control_pb2.FetchCodeReply:
        return await self.by_name.fetch_code(name, spec_dir)

    async def join(self, spec_toml: str, spec_dir: str, fetched: bool = False, by_name: bool = False) -> JobSpec:
        return self.registry.join(spec_toml, spec_dir, start=self.availability.training, fetched=fetched,
                                  by_name=by_name)

    async def export(self, name: str, path: str) -> control_pb2.ExportReply:
        return await self.registry.export(name, path, EXPORT_TIMEOUT_S)

    async def leave(self, name: str, drain: bool) -> None:
        await self.registry.leave(name, drain)
        await self._announce_if_changed()

    def worker_heartbeat(self, report: control_pb2.WorkerReport) -> control_pb2.WorkerView:
        c = self.config
        settled = time.monotonic() - self.started >= settle_s(self.hello.realm_size, c.peer_timeout_s,
                                                              c.hello_interval_s, c.full_mesh_max)
        view, serving_changed = self.registry.worker_view(report, settled)
        self.history.record(report.job, report.member or self.peer_id,
                            point_of_progress(time.monotonic(), report.progress))
        if serving_changed:  # joined or leaving: the others should know now, not in a second
            self.hello.worker_changed.set()
        return view

    async def take_result(self, request: control_pb2.ResultRequest) -> control_pb2.ResultReply:
        """A worker here is back after its job ended elsewhere: the job's model from
        the daemons whose workers finished it (peerd.daemon.results)."""
        job = self.registry.get(request.job)
        worker = job.worker(request.member)
        if worker is None:
            raise UnknownJob(f"this peer runs no worker {request.member!r} of job {request.job!r}")
        name, fingerprint = job.spec.name, job.spec.fingerprint
        asked = self.membership.daemons_of(name, fingerprint, getattr(request, "from"))
        holders = [*self.membership.result_holders(name, fingerprint), *asked]
        holders = sorted(set(holders), key=holders.index)
        auth = self.registry.result_auth(job.spec.name)
        return await take_result(lambda peer, req: self.hello.job_result(peer, req, auth), job, worker, holders,
                                 request)

    # ---- control API -------------------------------------------------------

    def status(self) -> control_pb2.StatusReply:
        return control_pb2.StatusReply(
            peer_id=self.peer_id, version=__version__, uptime_s=time.monotonic() - self.started,
            peer_address=self.peer_address, locality=self.config.locality,
            peers_known=len(self.membership.peers()),
            jobs=[self.registry.local_job(j) for j in self.jobs.values()],
            not_training=self.availability.not_training,
        )

    def peer_states(self) -> dict[str, str]:
        """Peer id -> "alive", or "suspected" when it missed the last two Hellos
        (in a full mesh; when relaying, no news for the spread allowance)."""
        peers = self.membership.peers()
        after = suspect_after(len(peers) + 1, self.config.hello_interval_s, HELLO_TIMEOUT_S,
                              self.config.full_mesh_max)
        return liveness(peers, time.monotonic(), after)

    def list_peers(self) -> control_pb2.ListPeersReply:
        now = time.monotonic()
        states = self.peer_states()
        return control_pb2.ListPeersReply(peers=[
            control_pb2.PeerInfo(
                peer_id=r.peer_id, address=r.address, locality=r.locality, version=r.version,
                jobs=sorted({j.name for j in r.jobs}), last_seen_s=now - r.last_seen,
                state=states.get(r.peer_id, "alive"), not_training=r.not_training,
                job_states=[control_pb2.PeerJob(name=j.name, state=j.state, phase=j.phase, round=j.round,
                                                lr=j.lr, global_batch=j.global_batch, samples_per_s=j.speed,
                                                local_batch=j.local_batch, share=j.share,
                                                member=j.member or r.peer_id, device=j.device,
                                                epochs=j.progress, loss=j.loss, metric=j.metric,
                                                disagreement=j.disagreement, segment_misses=j.segment_misses,
                                                rejected=j.rejected, collapsed=j.collapsed) for j in r.jobs],
            )
            for r in self.membership.peers()
        ])

    def list_jobs(self) -> control_pb2.ListJobsReply:
        jobs = self.membership.jobs()
        for name in self.registry.active():
            jobs.setdefault((name, self.jobs[name].spec.fingerprint), []).insert(0, self.peer_id)
        return control_pb2.ListJobsReply(jobs=[
            control_pb2.JobInfo(name=name, spec_fingerprint=fp, peer_ids=peers,
                                local=self.peer_id in peers)
            for (name, fp), peers in sorted(jobs.items())
        ])


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
