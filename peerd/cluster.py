"""`peerd cluster`: a local cluster of real daemons on 127.0.0.1 training one job.

Each peer is a separate `peerd` daemon process with its own state directory and
control socket; they find each other through zeroconf (on 127.0.0.1 only), each
supervises its own worker, and the workers train the job by segment gossip.
This command only starts them, joins them to the job, shows their progress and
stops them; it takes no part in the training.
"""

from __future__ import annotations

import argparse
import csv
import math
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import tomli_w
from rich import box
from rich.console import Console
from rich.live import Live
from rich.table import Table

from peerd.client import ControlClient
from peerd.core.codes import ENDED_STATES, ExitCode
from peerd.errors import PeerdError
from peerd.interrupts import raise_interrupt
from peerd.jobspec import load_job

POLL_S = 0.5
START_TIMEOUT_S = 30.0
DISCOVERY_TIMEOUT_S = 20.0


def default_job() -> Path:
    return builtin_job("mnist")


def builtin_job(name: str) -> Path:
    return Path(str(resources.files("peerd.examples").joinpath(f"{name}.toml")))


BUILTIN_JOBS = {"mnist": "a LeNet-sized CNN on 5,000 MNIST digits (SGD, accuracy)",
                "charlm": "a character-level transformer on Python's own source (AdamW, bf16, val_loss)",
                "digits-noniid": "the CNN in local-data mode, each peer holding the digits of a few classes only "
                                 "(split into per-peer data roots)"}


def _job_file(text: str) -> Path:
    """A job file, or the short name of a built-in job."""
    return builtin_job(text) if text in BUILTIN_JOBS else Path(text)


def _label(metric: str) -> str:
    return "test accuracy" if metric == "accuracy" else metric


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--peers", type=int, default=3, help="number of daemons (default 3)")
    parser.add_argument("--job", type=_job_file, default=None, metavar="FILE|NAME",
                        help="a job file, or a built-in job: " + "; ".join(f"{k}: {v}" for k, v in BUILTIN_JOBS.items())
                        + " (default: mnist)")
    parser.add_argument("--out", type=Path, default=None,
                        help="where logs, history.csv and progress.png go (default: runs/cluster-TIMESTAMP)")
    parser.add_argument("--slowdowns", type=_slowdowns, default=None, metavar="F,F,...",
                        help="testing knob: per-peer slowdown factors, e.g. 1,1,2,4 (a peer with F sleeps "
                             "(F-1)× each step's compute time); default: all at full speed")
    parser.add_argument("--workers", type=_workers, default=1,
                        help='workers per daemon, each a member of the job on the CPU ([worker] devices = '
                             '["cpu", ...]); they form the innermost group in hierarchical mode (default 1)')
    parser.add_argument("--time-limit", type=float, default=900.0,
                        help="stop everything after this many seconds (default 900)")


def _workers(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not 1 <= value <= 16:
        raise argparse.ArgumentTypeError(f"workers per daemon must be in 1..16, got {value}")
    return value


def _slowdowns(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {text!r}") from None
    if not all(1.0 <= v <= 1000.0 for v in values):
        raise argparse.ArgumentTypeError(f"slowdowns must be in 1..1000, got {text!r}")
    return values


@dataclass
class Peer:
    index: int
    dir: Path
    socket: Path
    process: subprocess.Popen | None = None
    locality: str = ""  # rack label, for hierarchical grouping
    slowdown: float = 1.0

    @property
    def peer_id(self) -> str:
        return f"peer-{self.index}"


Settings = Callable[["Peer"], dict[str, dict[str, object]]]


def _write_config(peer: Peer, realm: str, settings: Settings | None = None) -> None:
    tables: dict[str, dict[str, object]] = {
        "daemon": {"state_dir": str(peer.dir / "state"), "control_socket": str(peer.socket),
                   "peer_id": peer.peer_id, "locality": peer.locality,
                   "host": "127.0.0.1"},
        # mDNS stays on loopback; the realm hides other local clusters on this machine.
        "discovery": {"interfaces": ["127.0.0.1"], "realm": realm},
    }
    # No standby worker: every daemon here starts at once, on one machine, and a
    # spare importing torch each would only slow the others (settings can turn it on).
    tables["worker"] = {"standby": False}
    if peer.slowdown != 1.0:  # testing knob: emulates a slower device
        tables["worker"]["slowdown"] = peer.slowdown
    for table, values in (settings(peer) if settings else {}).items():
        tables.setdefault(table, {}).update(values)
    (peer.dir / "peerd.toml").write_text(tomli_w.dumps(tables))


class LocalCluster:
    """N daemons as subprocesses; always stopped, by PID, on exit."""

    def __init__(
        self, n: int, out: Path, localities: Sequence[str] = (), slowdowns: tuple[float, ...] | None = None,
        settings: Settings | None = None, wrap: Sequence[str] = (),
    ) -> None:
        """`settings(peer)` adds or replaces config values per peer, e.g.
        {"metrics": {"port": 9464}}; `wrap` runs each daemon under a command,
        e.g. ("ip", "netns", "exec", NAME)."""
        if n < 1:
            raise PeerdError("--peers must be at least 1")
        if localities and len(localities) != n:
            raise PeerdError(f"{len(localities)} localities for {n} peers")
        slowdowns = tuple(slowdowns or (1.0,) * n)
        if len(slowdowns) != n:
            raise PeerdError(f"{len(slowdowns)} slowdowns given for {n} peers")
        self.out = out
        self._settings = settings
        self._wrap = list(wrap)
        # Unix socket paths are limited to ~107 bytes, so they live in a short temp dir.
        self._sockets = Path(tempfile.mkdtemp(prefix="peerd-"))
        self.realm = f"local-{secrets.token_hex(4)}"
        self.peers = [Peer(i, out / f"peer-{i}", self._sockets / f"peer-{i}.sock", slowdown=f)
                      for i, f in enumerate(slowdowns)]
        for peer, locality in zip(self.peers, localities):
            peer.locality = locality

    def __enter__(self) -> LocalCluster:
        try:
            for peer in self.peers:
                peer.dir.mkdir(parents=True, exist_ok=True)
                _write_config(peer, self.realm, self._settings)
                self.start(peer)
        except BaseException:
            self.close()
            raise
        return self

    def start(self, peer: Peer) -> None:
        """Start (or restart, after it died) the daemon of `peer`."""
        if peer.process is not None and peer.process.poll() is None:
            raise PeerdError(f"{peer.peer_id} is already running")
        with open(peer.dir / "daemon.log", "ab") as log:
            peer.process = subprocess.Popen(
                [*self._wrap, sys.executable, "-m", "peerd.cli.daemon", "--config", str(peer.dir / "peerd.toml")],
                stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True,
            )

    def __exit__(self, *exc) -> None:
        self.close()

    def client(self, peer: Peer) -> ControlClient:
        return ControlClient(peer.socket, timeout_s=5.0)

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        for peer in self.peers:
            while True:
                if peer.process.poll() is not None:
                    raise PeerdError(f"{peer.peer_id} exited with {peer.process.returncode}; see {peer.dir / 'daemon.log'}")
                try:
                    with self.client(peer) as c:
                        c.status()
                    break
                except PeerdError:
                    if time.monotonic() > deadline:
                        raise PeerdError(f"{peer.peer_id} did not start in {timeout_s:.0f}s; see {peer.dir / 'daemon.log'}") from None
                    time.sleep(0.2)

    def wait_discovery(self, console: Console, timeout_s: float = DISCOVERY_TIMEOUT_S) -> int:
        """Wait until every daemon sees every other; returns the fewest seen."""
        deadline, want, fewest = time.monotonic() + timeout_s, len(self.peers) - 1, 0
        while time.monotonic() < deadline:
            counts = []
            for peer in self.peers:
                with self.client(peer) as c:
                    counts.append(c.status().peers_known)
            fewest = min(counts)
            if fewest >= want:
                break
            time.sleep(POLL_S)
        console.print(f"discovery: every daemon sees {fewest}/{want} others through zeroconf")
        return fewest

    def close(self) -> None:
        running = [p for p in self.peers if p.process is not None and p.process.poll() is None]
        for peer in running:
            peer.process.send_signal(signal.SIGTERM)
        for peer in running:
            try:
                peer.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                peer.process.kill()
                peer.process.wait()
        shutil.rmtree(self._sockets, ignore_errors=True)


def _table(rows: list[dict], elapsed: float, metric: str) -> Table:
    table = Table(title=f"peerd local cluster — {elapsed:.0f}s", box=box.SIMPLE_HEAD, padding=(0, 1))
    short = "acc" if metric == "accuracy" else metric
    for column in ("peer", "state", "epoch", "step", "round", "loss", "smpl/s", "partners", "disagree", short):
        table.add_column(column, justify="left" if column in ("peer", "state") else "right", no_wrap=True)
    for r in rows:
        table.add_row(r["peer"], r["state"], f"{r['epoch']:.0f}", str(r["step"]), str(r["round"]), _f(r["loss"], 3),
                      _f(r["samples_per_s"], 0), r["partners"], _f(r["disagreement"], 4), _f(r["metric"], 4))
    return table


def _f(value: float, digits: int) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def local_data_settings(spec, out: Path, peers: int, workers: int = 1) -> Settings | None:
    """A local-data job: each peer's data root and the job secret, made in `out`.
    Only the built-in digits job has data peerd can split (by label); None for
    a shared-data job."""
    if spec.data_mode != "local":
        return None
    if spec.module != "peerd.examples.digits_local":
        raise PeerdError(f"job {spec.name!r} keeps its data on each peer (data_mode = 'local'); peerd cluster "
                         "prepares such data only for the built-in digits-noniid job (--job digits-noniid)")
    if workers > 1:
        raise PeerdError("--workers > 1 with local data: every worker of a daemon would read the same data")
    from peerd.auth import create_secret_file
    from peerd.examples.noniid import write_split

    roots = [out / f"peer-{k}" / "data" for k in range(peers)]
    try:
        write_split(roots)
    except ValueError as exc:
        raise PeerdError(str(exc)) from None
    secret = out / "job.secret"
    create_secret_file(secret, overwrite=True)
    return lambda peer: {"data": {"root": str(roots[peer.index])}, "auth": {"job_secret_file": str(secret)}}


def _poll(cluster: LocalCluster, job: str, elapsed: float) -> list[dict]:
    """One row per worker (a daemon may run several), or per daemon while it has none."""
    rows = []
    for peer in cluster.peers:
        row = {"t": round(elapsed, 2), "peer": peer.peer_id, "state": "down", "epoch": 0, "step": 0, "round": 0,
               "loss": math.nan, "samples_per_s": math.nan, "partners": "-", "disagreement": math.nan,
               "metric": math.nan, "consensus": math.nan}
        try:
            with cluster.client(peer) as c:
                jobs = {j.name: j for j in c.status().jobs}
        except PeerdError:
            rows.append(row)
            continue
        j = jobs.get(job)
        if j is None:
            rows.append(row)
            continue
        workers = [(w.member, w.state, w.progress) for w in j.workers] or [(peer.peer_id, j.state, j.progress)]
        for member, state, p in workers:
            rows.append({**row, "peer": member or peer.peer_id, "state": state, "epoch": p.epoch, "step": p.step,
                         "round": p.round, "loss": p.loss, "samples_per_s": p.samples_per_s,
                         "partners": f"{p.partners_reached}/{p.partners_planned}",
                         "disagreement": p.disagreement, "metric": p.metric,
                         "consensus": p.metrics.get(f"consensus_{p.metric_name}", math.nan)})
    return rows


def _plot(history: list[dict], path: Path, metric: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    for peer in sorted({r["peer"] for r in history}):
        rows = [r for r in history if r["peer"] == peer and r["step"] > 0]
        ax_loss.plot([r["t"] for r in rows], [r["loss"] for r in rows], label=peer)
        acc = [r for r in rows if not math.isnan(r["metric"])]
        ax_acc.plot([r["t"] for r in acc], [r["metric"] for r in acc], marker=".", label=peer)
    ax_loss.set(xlabel="seconds", ylabel="training loss (EMA)", title="loss per peer", yscale="log")
    ax_acc.set(xlabel="seconds", ylabel=_label(metric), title=f"{_label(metric)} per peer")
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _write_history(history: list[dict], path: Path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(history[0]))
        writer.writeheader()
        writer.writerows(history)


def run_cluster(args: argparse.Namespace) -> int:
    console = Console()
    job_path = args.job or default_job()
    out = args.out or Path("runs") / time.strftime("cluster-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    try:
        spec, text = load_job(job_path)
    except PeerdError as exc:
        console.print(f"[red]peerd cluster: {exc}")
        return ExitCode.CONFIG
    console.print(f"starting {args.peers} peerd daemons on 127.0.0.1 for job [bold]{spec.name}[/] ({job_path}); logs in {out}")
    history: list[dict] = []
    rows: list[dict] = []
    started = time.monotonic()
    previous = signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        local = local_data_settings(spec, out, args.peers, args.workers)

        def settings(peer: Peer) -> dict[str, dict[str, object]]:
            tables = local(peer) if local else {}
            if args.workers > 1:
                tables["worker"] = {"devices": ["cpu"] * args.workers}
            return tables

        if local:
            console.print(f"local data: the digits split by label into {out}/peer-N/data; a job secret in {out}")
        with LocalCluster(args.peers, out, slowdowns=args.slowdowns, settings=settings) as cluster:
            cluster.wait_ready()
            cluster.wait_discovery(console)
            for peer in cluster.peers:
                with cluster.client(peer) as c:
                    c.join(text, str(job_path.resolve().parent))
            console.print(f"all {args.peers} peers joined {spec.name}; training "
                          f"({spec.epochs:g} epochs over the {'union of the peers' if local else 'shared'} data)")
            rows = _follow(cluster, spec, started, args.time_limit, history, console)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: stopped every daemon")
        return 130
    except PeerdError as exc:
        console.print(f"[red]peerd cluster: {exc}")
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)
        if history:
            _write_history(history, out / "history.csv")
            _plot(history, out / "progress.png", spec.metric)
    return _summary(rows, out, time.monotonic() - started, console, spec.metric)


def _follow(cluster: LocalCluster, spec, started: float, limit: float, history: list[dict],
            console: Console) -> list[dict]:
    job, short = spec.name, "acc" if spec.metric == "accuracy" else spec.metric
    live = console.is_terminal
    last_print = 0.0
    rows: list[dict] = []
    with Live(console=console, auto_refresh=False, transient=False) if live else _NoLive() as view:
        while True:
            elapsed = time.monotonic() - started
            rows = _poll(cluster, job, elapsed)
            history.extend(rows)
            if live:
                view.update(_table(rows, elapsed, spec.metric), refresh=True)
            elif elapsed - last_print >= 5.0:
                last_print = elapsed
                console.print(f"[{elapsed:5.0f}s] " + " | ".join(
                    f"{r['peer']} {r['state']} ep {r['epoch']} step {r['step']} loss {_f(r['loss'], 3)} "
                    f"{_f(r['samples_per_s'], 0)}/s partners {r['partners']} {short} {_f(r['metric'], 3)}"
                    for r in rows))
            if all(r["state"] in ENDED_STATES for r in rows):
                return rows
            if elapsed > limit:
                console.print(f"[yellow]time limit of {limit:.0f}s reached")
                return rows
            time.sleep(POLL_S)


class _NoLive:
    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


def _summary(rows: list[dict], out: Path, elapsed: float, console: Console, metric: str) -> int:
    finished = [r for r in rows if r["state"] == "finished" and not math.isnan(r["metric"])]
    label = _label(metric)
    for r in rows:
        consensus = f" (own model), {_f(r['consensus'], 4)} (consensus)" if not math.isnan(r["consensus"]) else ""
        console.print(f"{r['peer']}: {r['state']}, {r['step']} steps, {label} {_f(r['metric'], 4)}{consensus}")
    console.print(f"history: {out / 'history.csv'}; plot: {out / 'progress.png'}")
    if not finished or len(finished) < len(rows):
        console.print(f"[red]not every peer finished ({len(finished)}/{len(rows)}); see the logs in {out}")
        return 1
    mean = sum(r["metric"] for r in finished) / len(finished)
    console.print(f"[bold green]{label} reached: {mean:.4f} (mean of {len(finished)} peers) in {elapsed:.0f}s")
    return 0
