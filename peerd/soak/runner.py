"""The soak run: set up the network and the peers, join them to the job, carry
out the churn schedule while sampling every peer (each event by
peerd.soak.events), and tear everything down.

Everything it makes (processes, namespaces, bridge, socket directory) is
removed in `Soak.close()`, which runs on normal exit, on exceptions, and on
Ctrl-C or SIGTERM (turned into KeyboardInterrupt by the command).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import math
import secrets
import shutil
import signal
import tempfile
import threading
import time
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path

import tomli_w

from peerd.cli.plot import metric_label
from peerd.errors import PeerdError
from peerd.settings.jobspec import JobSpec, parse_job
from peerd.soak import schedule as sch
from peerd.soak.checks import EventRecord, Sample, converged_at
from peerd.soak.events import EVENT_SLACK_S, Running, carry_out
from peerd.soak.netns import Loopback, Namespaces, namespaces_unavailable
from peerd.soak.peers import STOP_TIMEOUT_S, SoakPeer, slowdown_table

SETUP_TIMEOUT_S = 240.0  # every peer started, discovered and training


@dataclass(frozen=True)
class SoakSettings:
    peers: int = 8
    duration_s: float = 600.0
    interval_s: float = 20.0
    settle_s: float = 60.0
    down_s: float = 10.0
    seed: int = 0
    schedule: Path | None = None
    job: Path | None = None
    epochs: float = 1000.0
    bandwidth_mbit: tuple[float, ...] = (100.0, 50.0, 20.0)
    slowdowns: tuple[float, ...] = (1.0, 1.0, 1.5, 2.0)
    poll_s: float = 1.0
    converge_s: float = 60.0
    stall_s: float = 60.0
    target: float | None = None  # in the job's metric; None: peerd.soak.checks.DEFAULT_TARGETS
    loopback: bool = False
    out: Path = Path("runs/soak")
    # [discovery] full_mesh_max and fanout of every daemon; 0: the daemon's default
    # (a realm above full_mesh_max relays: docs/protocol.md, "Membership relay")
    full_mesh_max: int = 0
    fanout: int = 0
    kinds: tuple[str, ...] = sch.SEEDED_KINDS  # what a seeded schedule draws from (--kinds)


@dataclass
class Run:
    """What a run produced, for the checks and the report."""

    settings: SoakSettings
    spec: JobSpec
    network: str  # "namespaces" or the reason for the loopback fallback
    slowdown: str  # the config table that takes it, or "" when unsupported
    planned: list[sch.Event] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    events: list[EventRecord] = field(default_factory=list)
    checkpoints: list[tuple[str, bool, str]] | None = None
    interrupted: str = ""
    t_training: float = 0.0  # seconds of setup: times count from when every first peer trained


def soak_job_text(path: Path, epochs: float) -> str:
    """The job's text with `epochs` raised, so it trains for the whole soak."""
    data = tomllib.loads(path.read_text())
    data.setdefault("job", {})["epochs"] = float(epochs)
    return tomli_w.dumps(data)


class Soak:
    def __init__(self, settings: SoakSettings, job_path: Path, say) -> None:
        self.s = settings
        self.say = say
        self.tag = secrets.token_hex(2)
        self.out = settings.out
        self.job_text = soak_job_text(job_path, settings.epochs)
        self.job_dir = str(job_path.resolve().parent)
        spec = parse_job(self.job_text, str(job_path))
        why = "forced by --loopback" if settings.loopback else namespaces_unavailable()
        self.net = Loopback(self.tag) if why else Namespaces(self.tag)
        key = slowdown_table()
        self.slowdown_key = key
        self.run = Run(settings, spec, "namespaces" if not why else f"127.0.0.1 ({why})", key or "")
        self.realm = f"soak-{self.tag}"
        self._sockets = Path(tempfile.mkdtemp(prefix="peerd-soak-"))
        self.peers: dict[int, SoakPeer] = {}
        self.data_roots: list[Path] = []  # local data: the slices of the digits, peer k on slice k mod len
        self._t0 = time.monotonic()
        self._lock = threading.Lock()

    # ---- setup -------------------------------------------------------------

    def now(self) -> float:
        return time.monotonic() - self._t0

    def add_peer(self, index: int) -> SoakPeer:
        s = self.s
        rate = s.bandwidth_mbit[index % len(s.bandwidth_mbit)] if s.bandwidth_mbit else 0.0
        net = self.net.add_peer(index, rate if self.net.shaped else 0.0)
        peer = SoakPeer(index, self.out / "peers" / f"peer-{index}", self._sockets / f"p{index}.sock", net,
                        slowdown=s.slowdowns[index % len(s.slowdowns)] if self.slowdown_key and s.slowdowns else 1.0,
                        rate_mbit=rate if self.net.shaped else 0.0)
        peer.dir.mkdir(parents=True, exist_ok=True)
        peer.write_config(self.realm, self.slowdown_key, self.data_config(index), discovery=self.discovery())
        with self._lock:
            self.peers[index] = peer
        return peer

    def setup(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "job.toml").write_text(self.job_text)
        self._local_data()
        self.net.open()
        for i in range(self.s.peers):
            self.add_peer(i)
        if len(self.peers) > 1 and not self.net.multicast_crosses(0, 1):
            raise PeerdError("multicast does not cross the soak bridge: zeroconf could not work")
        for peer in self.peers.values():
            peer.start()
        for peer in self.peers.values():
            peer.wait_ready()
        self.wait(lambda: self._all_see(len(self.peers) - 1), "every daemon to discover every other")
        for peer in self.peers.values():
            self.join(peer)
        self.wait(lambda: all(s.training for s in self.sample()), "every peer to train")
        # From here on, times count from the start of churn; setup samples go negative.
        shift = self.now()
        self._t0 += shift
        self.run.t_training = shift
        self.run.samples = [replace(s, t=round(s.t - shift, 2)) for s in self.run.samples]

    def _local_data(self) -> None:
        """A local-data job: the digits in up to 10 disjoint random slices (one per
        starting peer) and a job secret. Random, not by label: a peer that leaves
        for good then takes a tenth of the data away, not whole classes, so the
        target check still means what it does with shared data. A peer that joins
        later holds the slice of its index mod the slices (another copy of one)."""
        spec = self.run.spec
        if spec.data_mode != "local":
            return
        if spec.module != "peerd.examples.digits_local":
            raise PeerdError(f"job {spec.name!r} keeps its data on each peer; the soak prepares such data "
                             "only for the built-in digits job (--job peerd/examples/digits-noniid.toml)")
        from peerd.security.auth import create_secret_file
        from peerd.examples.noniid import CLASSES, write_split

        out = self.out.resolve()  # the daemons' configs live elsewhere: absolute paths
        self.data_roots = [out / "data" / f"slice-{k}" for k in range(min(CLASSES, self.s.peers))]
        write_split(self.data_roots, by_label=False)
        create_secret_file(out / "job.secret", overwrite=True)

    def discovery(self) -> dict[str, int]:
        """The [discovery] values the settings give every daemon."""
        return {k: v for k, v in (("full_mesh_max", self.s.full_mesh_max), ("fanout", self.s.fanout)) if v}

    def data_config(self, index: int) -> str:
        if not self.data_roots:
            return ""
        root = self.data_roots[index % len(self.data_roots)]
        return f'\n[data]\nroot = "{root}"\n\n[auth]\njob_secret_file = "{self.out.resolve() / "job.secret"}"\n'

    def wait(self, predicate, what: str, timeout_s: float = SETUP_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() > deadline:
                raise PeerdError(f"timed out after {timeout_s:.0f}s waiting for {what}")
            time.sleep(self.s.poll_s)

    def _all_see(self, n: int) -> bool:
        for peer in self.peers.values():
            with peer.client() as c:
                if c.status().peers_known < n:
                    return False
        return True

    def join(self, peer: SoakPeer) -> None:
        peer.in_job = True
        with peer.client(timeout_s=30.0) as c:
            c.join(self.job_text, self.job_dir)

    # ---- sampling ----------------------------------------------------------

    def sample(self) -> list[Sample]:
        t = round(self.now(), 2)
        counters = self.net.counters()
        with self._lock:
            peers = list(self.peers.values())
        rows = [p.sample(t, self.run.spec.name, counters.get(p.index)) for p in peers]
        self.run.samples.extend(rows)
        return rows

    # ---- events ------------------------------------------------------------

    def carry_out(self, event: sch.Event) -> EventRecord:
        return carry_out(self, event)  # peerd.soak.events

    # ---- the run -----------------------------------------------------------

    def execute(self, events: list[sch.Event]) -> None:
        """Sample every poll_s; start each event when due (after the previous one ended)."""
        s = self.s
        self.run.planned = events
        pending = list(events)
        current: Running | None = None
        last_print = -math.inf
        while self.now() < s.duration_s:
            rows = self.sample()
            if current is not None and current.done:
                self.run.events.append(current.record(self.now()))
                current = None
            elif current is not None and self.now() > current.limit_s:
                raise PeerdError(f"event `{current.event.describe()}` did not finish in time")
            if current is None and pending and self.now() >= pending[0].at_s:
                event = pending.pop(0)
                current = Running(event, self.now(), self.now() + event.down_s + EVENT_SLACK_S)
                current.start(self.carry_out)
            if self.now() - last_print >= 15:
                last_print = self.now()
                self.say(_line(self.now(), rows, self.run.spec))
            time.sleep(s.poll_s)
        if current is not None:
            current.thread.join(timeout=max(0.0, current.limit_s - self.now()))
            self.run.events.append(current.record(self.now()))
        # A late event still gets its chance: views to converge, restarted peers to train.
        last_done = max((e.done_s for e in self.run.events), default=-math.inf)
        while not _settled(self.sample()) and self.now() < last_done + s.converge_s:
            time.sleep(s.poll_s)

    def find_checkpoints(self) -> list[tuple[str, bool, str]] | None:
        """Check every checkpoint with this build's verifier; None when it has none."""
        verify = None
        for name in ("peerd.worker.state.checkpoint", "peerd.worker.checkpoints", "peerd.checkpoint"):
            try:
                module = importlib.import_module(name)
            except ImportError:
                continue
            verify = getattr(module, "verify_checkpoint", None) or getattr(module, "load_checkpoint", None)
            if verify:
                break
        if verify is None:
            return None
        found = []
        for peer in self.peers.values():
            for path in sorted((peer.dir / "state").rglob("*")):
                # Dot-files are writes in progress (or cut off by a kill): never loaded.
                if path.is_file() and not path.name.startswith(".") and (
                        "ckpt" in path.name or path.name.startswith("checkpoint")):
                    try:
                        verify(path)
                        found.append((str(path), True, ""))
                    except Exception as exc:  # any failure to verify is the finding
                        found.append((str(path), False, f"{type(exc).__name__}: {exc}"))
        return found

    def close(self) -> list[str]:
        """Stop every daemon and worker this run started (all at once, bounded),
        then remove its network and sockets."""
        errors = []
        with self._lock:
            peers = list(self.peers.values())
        for peer in peers:
            peer.terminate()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for peer in peers:
            try:
                peer.reap(deadline)
            except Exception as exc:  # keep cleaning up the rest
                errors.append(f"{peer.peer_id}: {exc}")
        errors += self.net.close()
        shutil.rmtree(self._sockets, ignore_errors=True)
        return errors


def _settled(rows: list[Sample]) -> bool:
    """Views agree and every connected peer in the job trains."""
    return converged_at(rows) and all(r.training for r in rows if r.in_job and r.expected_up and r.linked)


def _line(t: float, rows: list[Sample], spec: JobSpec) -> str:
    training = [r for r in rows if r.training]
    losses = [r.loss for r in training if not math.isnan(r.loss)]
    values = [r.metric for r in training if not math.isnan(r.metric)]
    best = (min if spec.metric_mode == "min" else max)(values, default=math.nan)
    rounds = [r.round for r in training]
    return (f"[{t:5.0f}s] {len(training)}/{len(rows)} peers training, rounds "
            f"{min(rounds, default=0)}-{max(rounds, default=0)}, loss "
            f"{min(losses, default=math.nan):.3f}-{max(losses, default=math.nan):.3f}, "
            f"best {metric_label(spec.metric)} {best:.3f}")


def run_soak(settings: SoakSettings, job_path: Path, say=None) -> Run:
    """Set up, run the schedule, tear down (always). Returns what happened."""
    say = say or functools.partial(print, flush=True)  # progress shows at once, also into a file
    soak = Soak(settings, job_path, say)
    run = soak.run
    if soak.slowdown_key is None:
        say("slowdown: this build's daemon config has no `slowdown`; all peers run at full speed")
    say(f"network: {run.network}")
    try:
        kinds = _kinds(soak) if not settings.schedule else ()  # before setup: a bad choice fails at once
        soak.setup()
        events = sch.load_schedule(settings.schedule) if settings.schedule else sch.seeded(
            settings.seed, settings.peers, settings.duration_s, settings.interval_s, settings.settle_s,
            down_s=settings.down_s, kinds=kinds)
        say(f"all {settings.peers} peers training after {run.t_training:.0f}s; "
            f"{len(events)} events over {settings.duration_s:.0f}s")
        soak.execute(events)
        run.checkpoints = soak.find_checkpoints()
    except KeyboardInterrupt:
        run.interrupted = "interrupted (Ctrl-C or SIGTERM)"
    except PeerdError as exc:
        run.interrupted = f"stopped: {exc}"
    finally:
        with _signals_held():  # a second Ctrl-C must not cut the cleanup short
            errors = soak.close()
        if errors:
            run.interrupted += ("; " if run.interrupted else "") + "cleanup: " + "; ".join(errors)
    return run


@contextlib.contextmanager
def _signals_held():
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _kinds(soak: Soak) -> tuple[str, ...]:
    """The settings' kinds that this run can carry out."""
    kinds = [k for k in soak.s.kinds if (k != sch.SLOWDOWN or soak.slowdown_key) and
             (k != sch.PARTITION or soak.net.partitions)]
    if not kinds:
        raise PeerdError(f"none of the event kinds {', '.join(soak.s.kinds)} can run here (slowdown needs a "
                         "daemon config with `slowdown`, partition needs network namespaces)")
    return tuple(kinds)
