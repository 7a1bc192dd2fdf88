"""The jobs this daemon runs: joining (checks, files, workers), leaving, and what
each of its workers is told of the job's other workers."""

from __future__ import annotations

import asyncio
import importlib.machinery
import importlib.util
import json
import logging
import os
import sys
import time
from pathlib import Path

from peerd.security.auth import Authenticator, load_secret
from peerd.settings.config import DaemonConfig
from peerd.core.bundle import digest
from peerd.core.codes import ACTIVE_STATES, ENDED_STATES, WorkerState
from peerd.core.membership import Membership
from peerd.core.restarts import CrashLimit
from peerd.core.workers import split_threads
from peerd.core.intrahost import wanted
from peerd.control.rendezvous import Rendezvous
from peerd.daemon.process import descends_from
from peerd.daemon.jobs import ENDED, JOINED, LocalJob, RestartPolicy, WorkerLaunch, WorkerProcess
from peerd.daemon.localdata import check_local_job
from peerd.daemon.standby import Standby
from peerd.daemon.codestore import CodeStore
from peerd.daemon.results import Finished, ResultFiles, Saved, finished_job, saved_model
from peerd.errors import ConfigError, JobMismatch, PeerUnavailable, Unauthenticated, UnknownJob
from peerd.settings.jobspec import JobSpec, parse_job, with_code
from peerd.proto.v1 import control_pb2, peer_pb2

log = logging.getLogger("peerd")
SHUTDOWN_RESERVE_S = 5.0  # of daemon.stop_timeout_s, kept for unannouncing and stopping the servers


class JobRegistry:
    def __init__(self, config: DaemonConfig, peer_id: str, devices: list[str], members: list[str],
                 membership: Membership, standby: Standby | None) -> None:
        self.config, self.peer_id, self.devices, self.members = config, peer_id, devices, members
        self.membership, self.standby = membership, standby
        self.jobs: dict[str, LocalJob] = {}
        self.code = CodeStore(config.state_dir / "code")
        self.results = ResultFiles()
        self.finished = self._load_finished()  # by name: jobs finished before this daemon started

    def get(self, name: str) -> LocalJob:
        job = self.jobs.get(name)
        if job is None:
            raise UnknownJob(f"this peer does not run job {name!r}")
        return job

    def active(self) -> list[str]:
        """Names of the jobs a worker here is active in, sorted."""
        return sorted(n for n, j in self.jobs.items() if j.state in ACTIVE_STATES)

    def to_resume(self) -> list[Path]:
        """The directories of the jobs this peer was in when the daemon stopped or died."""
        return [d for d in sorted((self.config.state_dir / "jobs").glob("*"))
                if (d / JOINED).exists() and not (d / ENDED).exists()]

    def spec_reply(self, name: str) -> peer_pb2.JobSpecReply:
        job = self.get(name)
        return peer_pb2.JobSpecReply(name=name, spec_toml=(job.job_dir / "job.toml").read_text(),
                                     spec_fingerprint=job.spec.fingerprint)

    def code_secret(self, name: str, code: str) -> bytes:
        """The job secret a peer must prove to be sent bundle `code` of job `name`."""
        job = self.get(name)
        if not code or job.spec.code != code or not self.code.tar(code).is_file():
            raise UnknownJob(f"this peer holds no code bundle {code[:12]!r} of job {name!r}")
        if job.first.launch.secret_file is None:
            raise Unauthenticated(f"job {name!r} has no job secret here: its code goes only to peers that prove one",
                                  "no_secret")
        return load_secret(job.first.launch.secret_file)

    def _load_finished(self) -> dict[str, Finished]:
        count, out = len(self.members), {}
        for d in sorted((self.config.state_dir / "jobs").glob("*")):
            candidates = [Saved(_worker_dir(d, k, count) / "model.pt", m) for k, m in enumerate(self.members)]
            found = finished_job(d, candidates, self.config.job_secret_file)
            if found is not None:
                out[found.spec.name] = found
        return out

    def result(self, name: str, spec_fingerprint: str) -> tuple[Saved, bytes | None]:
        """The model a worker here saved when job `name` finished (in this
        daemon's life or an earlier one), and the job secret a peer must prove
        to be sent it (None: the job has none)."""
        job, kept = self.jobs.get(name), self.finished.get(name)
        if job is not None:
            spec, saved, secret = job.spec, saved_model(job), job.first.launch.secret_file
        elif kept is not None:
            spec, saved, secret = kept.spec, kept.saved, kept.secret_file
        else:
            raise UnknownJob(f"this peer does not hold job {name!r}")
        if saved is None or spec.fingerprint != spec_fingerprint:
            raise UnknownJob(f"this peer holds no finished model of job {name!r} with that spec")
        return saved, load_secret(secret) if secret is not None else None

    def result_auth(self, name: str) -> Authenticator | None:
        """The job secret's authenticator for taking the job's model from a peer."""
        secret = self.get(name).first.launch.secret_file
        return Authenticator(load_secret(secret)) if secret is not None else None

    def join(self, spec_toml: str, spec_dir: str, start: bool = True, fetched: bool = False,
             by_name: bool = False) -> JobSpec:
        """`start` False: the job is kept, held, its workers not started: the
        machine is not free for it now (peerd.daemon.availability). `fetched`: its
        code came from a peer and runs from the store; else from `spec_dir`.
        `by_name`: the job file is a peer's (peerctl join NAME)."""
        spec = parse_job(spec_toml, "job spec")
        by_name = by_name or fetched
        secret_file = spec.secret_here(spec_dir, self.config.job_secret_file, by_name)
        spec_toml, spec, code_dir, bundle = self._code(spec_toml, spec, spec_dir, secret_file, fetched)
        self._check_joinable(spec, secret_file)
        data_root = check_local_job(spec, spec_dir, secret_file, self.config.data_root)
        if bundle:  # kept once every check passed: a refused join leaves nothing in the store
            self.code.hold(bundle)
        tensorboard = spec.tensorboard_dir(spec_dir) or self.config.tensorboard  # the job's own wins
        job_dir = self.config.state_dir / "jobs" / spec.name
        job_dir.mkdir(parents=True, exist_ok=True)
        spec_path = job_dir / "job.toml"
        resumed = (job_dir / JOINED).exists() and not (job_dir / ENDED).exists()  # a restart or a hold
        write_atomic(spec_path, spec_toml)
        joined = {"spec_dir": spec_dir, "fetched": fetched, "by_name": by_name}
        write_atomic(job_dir / JOINED, json.dumps(joined) + "\n")
        (job_dir / ENDED).unlink(missing_ok=True)
        # The workers of one daemon average their group stage on torch.distributed
        # (gloo on CPUs, NCCL on GPUs), re-formed when one of them restarts.
        rendezvous = Rendezvous(job_dir, len(self.devices)) if wanted(self.devices, spec.gossip.mode) else None
        if rendezvous is not None:
            rendezvous.bump()
        launches = self._launches(job_dir, spec_path, code_dir, secret_file, rendezvous, data_root,
                                  tensorboard.absolute() / spec.name if tensorboard else None)
        restarts = RestartPolicy(self.config.restart_backoff_s, self.config.restart_backoff_max_s,
                                 CrashLimit(self.config.max_crashes, self.config.crash_window_s))
        job = LocalJob.create(spec, job_dir, launches, restarts,
                              stop_grace_s=max(1.0, self.config.stop_timeout_s - SHUTDOWN_RESERVE_S),
                              standby=self.standby, on_restart=rendezvous.bump if rendezvous else lambda: None)
        job.carry_reasons(resumed)
        self.jobs[spec.name] = job
        if start:
            job.start()
        else:
            job.held = True
            for w in job.workers:
                w.state = WorkerState.STOPPED
        log.info("joined job %s (fingerprint %s)%s", spec.name, spec.fingerprint,
                 "" if start else "; held until the machine is free for it")
        return spec

    def _code(self, text: str, spec: JobSpec, spec_dir: str, secret: Path | None,
              fetched: bool) -> tuple[str, JobSpec, str, bytes]:
        """Where the job's code runs from, and the job with its bundle named: one
        fetched from a peer runs from the store, checked again now; a job file's
        code from its directory, bundled (to serve it, returned) and named in the job."""
        if fetched:
            code_dir = str(self.code.materialize(spec.code))
            check_code(spec, code_dir)
            return text, spec, code_dir, b""
        check_code(spec, spec_dir)
        tls = self.config.tls
        bundle = self.code.build(spec, spec_dir, {"job secret": secret, "realm secret": self.config.realm_secret_file,
                                                  "TLS key": tls.key_file if tls else None})
        code = digest(bundle) if bundle else ""
        if spec.code and code != spec.code:
            raise JobMismatch(f"job {spec.name!r} runs code bundle {spec.code}, but its code in {spec_dir} makes "
                              f"{code or 'none'}: the job's code differs here (join by name to fetch it)")
        if code and not spec.code:
            text = with_code(text, code)
            spec = parse_job(text, "job spec")
        return text, spec, spec_dir, bundle

    def _check_joinable(self, spec: JobSpec, secret_file: Path | None) -> None:
        """Refuse a join now, not in a restarting worker."""
        if secret_file is not None:
            load_secret(secret_file)
        current = self.jobs.get(spec.name)
        if current is not None and current.state not in ENDED_STATES:
            raise ConfigError(f"this peer already runs job {spec.name!r} (state {current.state})")
        for (name, fingerprint), peers in self.membership.jobs().items():
            if name == spec.name and fingerprint != spec.fingerprint:
                raise JobMismatch(
                    f"job {spec.name!r} runs on {', '.join(peers)} with another spec "
                    f"(fingerprint {fingerprint}, yours {spec.fingerprint}); use the same job file"
                    + (f" and code (yours is bundle {spec.code[:12]}), or join it by name" if spec.code else "")
                )

    def _launches(self, job_dir: Path, spec_path: Path, spec_dir: str, secret_file: Path | None,
                  rendezvous: Rendezvous | None = None, data_root: str = "",
                  tensorboard: Path | None = None) -> list[WorkerLaunch]:
        """`tensorboard`: the job's TensorBoard directory, each worker a run in it
        (absolute: a script job's worker runs in a directory of its own)."""
        count = len(self.devices)
        return [
            WorkerLaunch(
                control_address=f"unix:{self.config.control_socket}", peer_id=member,
                host=self.config.host, threads=split_threads(self.config.worker_threads, count), device=device,
                spec_path=spec_path, spec_dir=spec_dir, log_path=_worker_dir(job_dir, k, count) / "worker.log",
                secret_file=secret_file, tls=self.config.tls, slowdown=self.config.slowdown,
                slowdown_clock=self.config.slowdown_clock, step_overhead_s=self.config.step_overhead_s,
                log_format=self.config.log_format, intrahost=rendezvous.slot(k) if rendezvous else None,
                data_root=data_root, tensorboard=str(tensorboard / member) if tensorboard else "",
            )
            for k, (member, device) in enumerate(zip(self.members, self.devices))
        ]

    async def leave(self, name: str, drain: bool) -> None:
        job = self.get(name)
        await job.stop(drain)
        del self.jobs[name]
        (job.job_dir / JOINED).unlink(missing_ok=True)  # left on purpose: not resumed
        log.info("left job %s%s", name, " after draining" if drain else "")

    async def export(self, name: str, path: str, timeout_s: float) -> control_pb2.ExportReply:
        """Ask the job's (first) worker to write its model to `path` at its next
        round boundary, and wait until it says it did."""
        if not os.path.isabs(path):
            raise ConfigError(f"export path {path!r}: give an absolute path (it is written by the worker)")
        if not os.path.isdir(os.path.dirname(path)):
            raise ConfigError(f"export path {path!r}: no such directory")
        job = self.get(name)
        worker = job.first
        if worker.state != WorkerState.RUNNING:
            raise ConfigError(f"job {name!r} is {worker.state}, not running: its model is in "
                              f"{worker.launch.log_path.parent / 'model.pt'} once it finishes")
        worker.export_path = path
        deadline = time.monotonic() + timeout_s
        try:
            while worker.progress.exported != path:
                if time.monotonic() > deadline or worker.state != WorkerState.RUNNING:
                    raise PeerUnavailable(f"job {name!r}: the worker did not write {path} within {timeout_s:.0f} s "
                                          f"(state {worker.state}); see {worker.launch.log_path}")
                await asyncio.sleep(0.1)
        finally:
            worker.export_path = ""
        p = worker.progress
        return control_pb2.ExportReply(path=path, round=p.exported_round, step=p.step)

    def worker_view(self, report: control_pb2.WorkerReport, settled: bool) -> tuple[control_pb2.WorkerView, bool]:
        """What a worker's heartbeat gets back: the job's other workers, here and on
        the peers; and whether this report started or stopped its serving."""
        job = self.get(report.job)
        worker = job.worker(report.member)
        if worker is None:
            raise UnknownJob(f"this peer runs no worker {report.member!r} of job {report.job!r}")
        if report.pid and worker.supervised and not descends_from(report.pid, worker.pid):
            # A worker left running by an earlier life of this daemon (killed -9): not this one's.
            raise UnknownJob(f"pid {report.pid} is not this daemon's worker {worker.member!r} of job "
                             f"{report.job!r} (that is pid {worker.pid or 'none yet'}): a worker of an earlier "
                             "run of the daemon; stop it")
        serving = worker.address
        worker.on_heartbeat(report)
        name, fingerprint = job.spec.name, job.spec.fingerprint
        peers = [control_pb2.PeerEndpoint(peer_id=w.member, address=w.address, locality=w.locality, daemon=w.daemon)
                 for w in self.membership.job_workers(name, fingerprint)]
        # This daemon's own workers: the one reporting, and its siblings of the job.
        mine = [w for w in job.workers if w is worker or w.state in ACTIVE_STATES]
        peers += [control_pb2.PeerEndpoint(peer_id=w.member, address=w.address, locality=self.config.locality,
                                           daemon=self.peer_id) for w in mine if w.address]
        members = [*self.membership.job_members(name, fingerprint), *(w.member for w in mine)]
        speeds = {**self.membership.job_speeds(name, fingerprint),
                  **{w.member: w.progress.samples_per_s for w in mine if w is not worker}}
        costs = {**self.membership.job_step_costs(name, fingerprint),
                 **{w.member: (w.progress.fixed_s, w.progress.per_sample_s) for w in mine if w is not worker}}
        sizes = {**self.membership.job_data_sizes(name, fingerprint),
                 **{w.member: w.progress.data_samples for w in mine if w is not worker}}
        progress = {**self.membership.job_progress(name, fingerprint),
                    **{w.member: w.progress.job_progress for w in mine if w is not worker}}
        terms = {**self.membership.job_terms(name, fingerprint),
                 **{w.member: w.progress.epochs_read for w in job.workers if w is not worker}}
        finished = [*self.membership.job_finished(name, fingerprint),
                    *(w.member for w in job.workers if w.state == WorkerState.FINISHED)]
        view = control_pb2.WorkerView(
            peers=peers, members=members, stop=worker.stop_requested, stop_reason=worker.stop_reason, settled=settled, export_path=worker.export_path,
            finished=finished,
            speeds=[control_pb2.MemberSpeed(peer_id=p, samples_per_s=speeds.get(p, 0.0), data_samples=sizes.get(p, 0),
                                            progress=progress.get(p, 0.0), fixed_s=costs.get(p, (0.0, 0.0))[0],
                                            per_sample_s=costs.get(p, (0.0, 0.0))[1], epochs_read=terms.get(p, 0.0))
                    for p in speeds.keys() | {p for p, t in terms.items() if t > 0}])
        return view, worker.address != serving

    def local_job(self, job: LocalJob) -> control_pb2.LocalJob:
        first = job.first
        workers = [
            control_pb2.LocalWorker(member=w.member, device=w.device, state=_shown(job, w.state), pid=w.pid,
                                    restarts=w.restarts,
                                    progress=w.progress, log_path=str(w.launch.log_path), address=w.address,
                                    message=w.why)
            for w in job.workers
        ]
        return control_pb2.LocalJob(
            name=job.spec.name, state=_shown(job, job.state), spec_fingerprint=job.spec.fingerprint,
            worker_pid=first.pid,
            restarts=sum(w.restarts for w in job.workers), progress=first.progress,
            log_path=str(first.launch.log_path), workers=workers, message=first.why,
            view_size=len(self.membership.job_view(job.spec.name, job.spec.fingerprint)) + len(job.workers),
        )

    def job_ads(self) -> list[peer_pb2.JobAd]:
        """Each worker of each job, as a Hello reply tells the peers; and the jobs
        that finished here before this daemon started, whose model it keeps."""
        kept = [peer_pb2.JobAd(name=f.spec.name, spec_fingerprint=f.spec.fingerprint, state=WorkerState.FINISHED,
                               member=f.saved.member if f.saved.member != self.peer_id else "")
                for name, f in self.finished.items() if name not in self.jobs]
        return [self._job_ad(j, w) for j in self.jobs.values() for w in j.workers] + kept

    def _job_ad(self, job: LocalJob, w: WorkerProcess) -> peer_pb2.JobAd:
        p = w.progress
        return peer_pb2.JobAd(
            name=job.spec.name, spec_fingerprint=job.spec.fingerprint, worker_address=w.address, round=p.round,
            state=_shown(job, w.state), phase=p.phase, lr=p.lr, global_batch=p.global_batch, samples_per_s=p.samples_per_s,
            fixed_s=p.fixed_s, per_sample_s=p.per_sample_s,
            local_batch=p.local_batch, share=p.share, device=w.device, data_samples=p.data_samples,
            progress=p.job_progress, epochs_read=p.epochs_read, loss=p.loss, metric=p.metric,
            disagreement=p.disagreement, segment_misses=p.segment_misses, rejected=sum(p.rejected.values()),
            collapsed=p.collapsed,
            member=w.member if w.member != self.peer_id else "",  # a single worker's ad is as before
        )


def _shown(job: LocalJob, state: WorkerState) -> str:
    """A held job's stopped workers are "paused": they left for the machine's
    owner and come back (not in ACTIVE_STATES: the others plan without them)."""
    return WorkerState.PAUSED if job.held and state == WorkerState.STOPPED else state


def _worker_dir(job_dir: Path, k: int, count: int) -> Path:
    """Where worker k keeps its log, checkpoints and model: the job's directory
    for a single worker (as before several were possible), else worker-<k>/."""
    return job_dir if count == 1 else job_dir / f"worker-{k}"


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def check_code(spec: JobSpec, code_dir: str) -> None:
    """The job's script and modules are where its worker will look for them."""
    for entry in filter(None, (spec.module, spec.model, spec.data)):
        check_importable(entry, code_dir)
    if spec.script and not spec.script_path(code_dir).is_file():
        raise ConfigError(f"job.script = {spec.script!r}: no such file {spec.script_path(code_dir)} on this "
                          "machine (a relative path is taken from the job file's directory)")


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
