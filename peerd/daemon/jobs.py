"""Supervising the worker processes of one job (one per configured device).

A worker that crashes is restarted with exponential backoff, until it crashed
[worker] max_crashes times within crash_window_s: then it fails. One that exits 0
after finishing its epochs, or exits 2 because its job cannot load, is not
restarted. The daemon never shares a process with torch, so a crashing job cannot
take it down. Why a worker failed or crashed, its last error line and the last
lines of its traceback (peerd.daemon.reason), is kept for peerctl status
(docs/operations.md, "When a worker crashes").
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from peerd.core.codes import ACTIVE_STATES, WorkerState
from peerd.core.intrahost import IntraHostSlot
from peerd.core.restarts import NO_LIMIT, Backoff, CrashLimit, ExitAction, RestartHistory, after_exit
from peerd.daemon.process import RELAY_LINE_LIMIT, exit_name
from peerd.daemon.reason import TracebackTail, error_line, keep, kept
from peerd.control.lifeline import parent_env
from peerd.daemon.standby import Standby
from peerd.settings.jobspec import JobSpec
from peerd.control.progress import empty_progress
from peerd.proto.v1 import control_pb2
from peerd.security.tls import TlsSettings

log = logging.getLogger("peerd.jobs")
JOINED = "joined.json"  # in the job's directory while this peer is in the job: resumed on restart
ENDED = "ended"  # the job finished or failed here: not resumed
STOP_GRACE_S = 10.0
DRAIN_TIMEOUT_S = 120.0
GIVE_WAY_TIMEOUT_S = 30.0  # the owner waits for a drain this long at most, then the worker gets SIGTERM


@dataclass(frozen=True)
class WorkerLaunch:
    """Everything needed to start a worker; the same on each restart."""

    control_address: str
    peer_id: str
    host: str
    threads: int
    spec_path: Path
    spec_dir: str
    log_path: Path
    device: str = "cpu"  # the torch device it trains on ([worker] device)
    secret_file: Path | None = None  # the job secret: the worker reads it (never on its command line)
    tls: TlsSettings | None = None
    slowdown: float = 1.0  # testing knob (DaemonConfig.slowdown, .slowdown_clock)
    slowdown_clock: str = "wall"
    step_overhead_s: float = 0.0  # testing knob (DaemonConfig.step_overhead_s)
    log_format: str = "text"
    intrahost: IntraHostSlot | None = None  # its place in the daemon's intra-host group (peerd.worker.intrahost.group)
    data_root: str = ""  # data_mode = "local": where this peer's data is (peerd.daemon.localdata)
    tensorboard: str = ""  # its TensorBoard run directory, DIR/JOB/MEMBER ([log] tensorboard); "": none

    def argv(self) -> list[str]:
        args = [
            sys.executable, "-m", "peerd.worker",
            "--control", self.control_address, "--spec", str(self.spec_path),
            "--spec-dir", self.spec_dir, "--peer-id", self.peer_id,
            "--host", self.host, "--threads", str(self.threads), "--device", self.device,
            "--out-dir", str(self.log_path.parent), "--slowdown", repr(self.slowdown),
            "--slowdown-clock", self.slowdown_clock, "--step-overhead-s", repr(self.step_overhead_s),
            "--log-format", self.log_format,
        ]
        if self.secret_file is not None:
            args += ["--secret-file", str(self.secret_file)]
        if self.intrahost is not None:
            args += self.intrahost.argv()
        if self.data_root:
            args += ["--data-root", self.data_root]
        if self.tensorboard:
            args += ["--tensorboard", self.tensorboard]
        return args + (self.tls.argv() if self.tls else [])


@dataclass(frozen=True)
class RestartPolicy:
    """When a crashed worker is started again, and when it is not ([worker]
    restart_backoff_s, restart_backoff_max_s, max_crashes, crash_window_s)."""

    backoff_s: float
    backoff_max_s: float
    crash_limit: CrashLimit = NO_LIMIT  # the crash that reaches it is not restarted: the worker fails

    def backoff(self) -> Backoff:
        return Backoff(self.backoff_s, self.backoff_max_s)


@dataclass
class WorkerProcess:
    """One worker of a job: started, watched, restarted on its own."""

    job: str
    member: str  # its id in the job (WorkerLaunch.peer_id)
    launch: WorkerLaunch
    restart_policy: RestartPolicy
    stop_grace_s: float = STOP_GRACE_S  # after SIGTERM, how long the worker may take to checkpoint and exit
    on_end: Callable[[], None] = lambda: None  # it finished or failed: not restarted
    on_restart: Callable[[], object] = lambda: None  # called before a restarted worker starts
    clock: Callable[[], float] = time.monotonic
    state: WorkerState = WorkerState.STARTING
    restarts: int = 0
    address: str = ""
    fingerprint: str = ""
    progress: control_pb2.Progress = field(default_factory=empty_progress)
    stop_requested: bool = False  # drain: the worker leaves after its current round
    stop_reason: str = ""  # why, for the worker's log (WorkerView.stop_reason)
    message: str = ""  # its last error line: why it failed or crashed (peerctl status)
    traceback: tuple[str, ...] = ()  # the last lines of its last traceback, with `message`
    export_path: str = ""  # peerctl export: the file the worker should write its model to
    standby: Standby | None = None  # a spare process to start the worker in ([worker] standby)
    _process: asyncio.subprocess.Process | None = None
    _task: asyncio.Task | None = None
    _stopping: bool = False
    _run_message: str = ""  # the last error line of the run under way
    _tail: TracebackTail = field(default_factory=lambda: TracebackTail())

    @property
    def pid(self) -> int:
        return self._process.pid if self._process and self._process.returncode is None else 0

    @property
    def supervised(self) -> bool:
        """Whether this daemon runs (or is starting) the worker's process itself."""
        return self._task is not None

    @property
    def device(self) -> str:
        return self.launch.device

    @property
    def why(self) -> str:
        """What the control API shows as the worker's message: the error line,
        then the last lines of the traceback before it, one a line; "" once it runs."""
        return "\n".join(filter(None, (self.message, *self.traceback)))

    def start(self) -> None:
        self._task = asyncio.create_task(self._supervise(), name=f"job:{self.job}:{self.member}")

    async def _supervise(self) -> None:
        """Run the worker; after each exit, carry out what restarts.after_exit decides."""
        backoff, history = self.restart_policy.backoff(), RestartHistory()
        while not self._stopping:
            self.state, self.address = WorkerState.STARTING, ""
            if self.restarts:
                self.on_restart()  # e.g. a new intra-host group generation for the restarted worker
            code = await self._run_once()
            self.address = ""
            stopped = self._stopping or self.stop_requested
            action = after_exit(code, stopped, history, backoff, self.clock(), self.restart_policy.crash_limit)
            self.state, history, self.restarts = action.state, action.history, action.history.restarts
            if not stopped and action.state != WorkerState.FINISHED:
                self._say_why(code)
            if not action.restarts:
                self._log_end(action)
            if not stopped:  # beside its log too: a resumed job shows it (LocalJob.carry_reasons)
                keep(self.launch.log_path.parent, self.why)
            if not action.restarts:
                if action.state != WorkerState.STOPPED:
                    self.on_end()
                return
            log.warning("worker %s of %s exited with %s; restart %d in %.1fs: %s",
                        self.member, self.job, code, self.restarts, action.delay_s, self.message)
            await asyncio.sleep(max(0.0, action.restart_at - self.clock()))

    def _say_why(self, code: int) -> None:
        """After a crash or failure: this run's error line and traceback; when it
        printed no error line, its traceback's last line, else how it exited."""
        lines = self._tail.lines
        self.message = self._run_message or (lines[-1].strip() if lines else f"exited with {exit_name(code)}")
        self.traceback = lines

    def _log_end(self, action: ExitAction) -> None:
        if self.state == WorkerState.FINISHED:
            log.info("job %s: worker %s finished: %s %.4f", self.job, self.member,
                     self.progress.metric_name or "metric", self.progress.metric)
        elif action.gave_up:
            crashes, window_s = len(action.history.crashes), self.restart_policy.crash_limit.window_s
            log.error("job %s: worker %s crashed %s in %.0fs; not restarting it: the job failed here "
                      "(last error: %s; see %s)", self.job, self.member, _times(crashes), window_s,
                      self.message, self.launch.log_path)
            self.message = f"crashed {_times(crashes)} in {window_s:g}s, not restarted; last: {self.message}"
        elif self.state == WorkerState.FAILED:
            log.error("job %s cannot run (see %s); not restarting: %s", self.job, self.launch.log_path,
                      self.message)

    async def _run_once(self) -> int:
        self.launch.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._run_message, self._tail = "", TracebackTail()
        with open(self.launch.log_path, "ab") as out:
            argv = self.launch.argv()
            self._process = await self.standby.launch(argv) if self.standby is not None else None
            how = "from the standby"
            if self._process is None:
                how = "new"
                self._process = await asyncio.create_subprocess_exec(
                    *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.STDOUT, env=parent_env(), start_new_session=True,
                    limit=RELAY_LINE_LIMIT,
                )
            log.info("job %s: worker %s pid %d started on %s (%s)", self.job, self.member, self._process.pid,
                     self.device, how)
            await _relay(self._process.stdout, out, self._on_line)
            return await self._process.wait()

    def _on_line(self, line: bytes) -> None:
        """A line of the worker's output: an error line or a traceback becomes
        its message (the previous run's stays until this one says why)."""
        message, changed = error_line(line), self._tail.feed(line)
        if not message and not changed:
            return
        lines = self._tail.lines
        self._run_message = message or self._run_message
        self.message = self._run_message or (lines[-1].strip() if lines else "")
        self.traceback = lines

    def on_heartbeat(self, report: control_pb2.WorkerReport) -> None:
        self.address = report.address
        self.fingerprint = report.fingerprint
        self.progress = report.progress
        if self.state == WorkerState.STARTING and report.address:
            self.state = WorkerState.RUNNING
            self.message, self.traceback, self._run_message = "", (), ""
            keep(self.launch.log_path.parent, "")

    async def stop(self, drain: bool, drain_timeout_s: float = DRAIN_TIMEOUT_S,
                   reason: str = "the operator asked") -> None:
        """Drain: let the worker finish its round and leave (saying `reason`). Otherwise stop it now."""
        if drain and self.pid:
            self.stop_requested, self.stop_reason = True, reason
            try:
                await asyncio.wait_for(asyncio.shield(self._task), drain_timeout_s)
                return
            except TimeoutError:
                log.warning("job %s: worker %s did not drain in %.0fs; stopping it", self.job, self.member,
                            drain_timeout_s)
        self._stopping = True
        await self._terminate()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self.state not in (WorkerState.FINISHED, WorkerState.FAILED):
            self.state = WorkerState.STOPPED

    async def _terminate(self) -> None:
        process = self._process
        if process is None or process.returncode is not None:
            return
        process.send_signal(signal.SIGTERM)  # the worker ends its round, checkpoints and exits
        try:
            await asyncio.wait_for(process.wait(), self.stop_grace_s)
        except TimeoutError:
            log.warning("worker pid %d ignored SIGTERM; killing it", process.pid)
            process.kill()
            await process.wait()


@dataclass
class LocalJob:
    """A job on this daemon: one worker per configured device, each its own member of the job."""

    spec: JobSpec
    job_dir: Path
    workers: list[WorkerProcess]
    held: bool = False  # left while the machine is not free: joined again when it is (peerd.daemon.availability)

    @classmethod
    def create(cls, spec: JobSpec, job_dir: Path, launches: list[WorkerLaunch], restart_policy: RestartPolicy,
               stop_grace_s: float = STOP_GRACE_S, standby: Standby | None = None,
               on_restart: Callable[[], object] = lambda: None) -> LocalJob:
        job = cls(spec, job_dir, [])
        job.workers = [WorkerProcess(spec.name, launch.peer_id, launch, restart_policy, stop_grace_s,
                                     on_end=job._worker_ended, on_restart=on_restart, standby=standby)
                       for launch in launches]
        return job

    @property
    def state(self) -> WorkerState:
        """The job's state here: active while any worker is; else failed if one
        failed, finished if all finished, stopped otherwise."""
        states = {w.state for w in self.workers}
        for active in ACTIVE_STATES:
            if active in states:
                return active
        if WorkerState.FAILED in states:
            return WorkerState.FAILED
        return WorkerState.FINISHED if states == {WorkerState.FINISHED} else WorkerState.STOPPED

    @property
    def first(self) -> WorkerProcess:
        return self.workers[0]

    def worker(self, member: str) -> WorkerProcess | None:
        """The worker with that id; "" (an older worker): the first."""
        if not member:
            return self.first
        return next((w for w in self.workers if w.member == member), None)

    def start(self) -> None:
        for w in self.workers:
            w.start()

    def carry_reasons(self, resumed: bool) -> None:
        """A job whose state survived (resumed after a daemon restart, joined again
        after a hold) shows why each worker's last run ended until it runs again;
        a new join starts without (peerd.daemon.reason)."""
        for w in self.workers:
            if resumed:
                w.message, w.traceback = kept(w.launch.log_path.parent)
            else:
                keep(w.launch.log_path.parent, "")

    def _worker_ended(self) -> None:
        # A daemon restarted later resumes only jobs that neither ended nor were left.
        if all(w.state in (WorkerState.FINISHED, WorkerState.FAILED) for w in self.workers):
            (self.job_dir / ENDED).write_text(self.state + "\n")

    async def stop(self, drain: bool) -> None:
        """Stop (or drain) every worker of the job, together."""
        await asyncio.gather(*(w.stop(drain) for w in self.workers))

    async def give_way(self, reason: str) -> None:
        """The machine's owner needs it: a training worker drains (its round
        finished, its share handed on, as `peerctl leave --drain`); one that has
        not trained yet stops at once on SIGTERM, with nothing to hand on."""
        self.held = True
        await asyncio.gather(*(w.stop(drain=w.progress.training, drain_timeout_s=GIVE_WAY_TIMEOUT_S,
                                      reason=reason) for w in self.workers))


def _times(count: int) -> str:
    return "once" if count == 1 else f"{count} times"


async def _relay(stream: asyncio.StreamReader, out, on_line=lambda line: None) -> None:
    """Copy the worker's output, line by line, to its log file and to the
    daemon's stderr (journald under systemd), until the worker closes it; each
    line goes to `on_line` too (its error lines and traceback: peerctl status)."""
    while True:
        try:
            line = await stream.readline()
        except ValueError:  # a line over the limit: pass on what is buffered
            line = await stream.read(RELAY_LINE_LIMIT)
        if not line:
            return
        out.write(line)
        out.flush()
        on_line(line)
        try:
            sys.stderr.write(line.decode(errors="replace"))
            sys.stderr.flush()
        except OSError:
            pass  # nobody reads the daemon's stderr: the file still has the line
