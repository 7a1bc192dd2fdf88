"""`peerd cluster`: a local cluster of real daemons on 127.0.0.1 training one job.

Each peer is a separate `peerd` daemon process with its own state directory and
control socket; they find each other through zeroconf (on 127.0.0.1 only), each
supervises its own worker, and the workers train the job by segment gossip.
This command only starts them, joins them to the job, shows their progress and
stops them; it takes no part in the training. This module holds the cluster
(`LocalCluster`, also the tests' and benchmarks' harness) and the built-in jobs;
the command line is peerd.cli.cluster.
"""

from __future__ import annotations

import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import tomli_w
from rich.console import Console

from peerd.control.client import ControlClient
from peerd.errors import PeerdError

POLL_S = 0.5
START_TIMEOUT_S = 30.0
DISCOVERY_TIMEOUT_S = 20.0


def default_job() -> Path:
    return builtin_job("mnist")


def builtin_job(name: str) -> Path:
    return Path(str(resources.files("peerd.examples").joinpath(f"{name}.toml")))


def job_with(path: Path, **tables: dict[str, object]) -> str:
    """A job file's text with values replaced or added, table by table, e.g.
    job_with(default_job(), job={"epochs": 2}): the tests' and benchmarks' jobs."""
    data = tomllib.loads(path.read_text())
    for table, values in tables.items():
        data.setdefault(table, {}).update(values)
    return tomli_w.dumps(data)


BUILTIN_JOBS = {"mnist": "a LeNet-sized CNN on 5,000 MNIST digits (SGD, accuracy)",
                "charlm": "a character-level transformer on Python's own source (AdamW, bf16, val_loss)",
                "digits-noniid": "the CNN in local-data mode, each peer holding the digits of a few classes only "
                                 "(split into per-peer data roots)"}


@dataclass
class LocalDaemon:
    """One daemon of a local cluster: its directory, control socket and process."""

    index: int
    dir: Path
    socket: Path
    process: subprocess.Popen | None = None
    locality: str = ""  # rack label, for hierarchical grouping
    slowdown: float = 1.0
    metrics_port: int = 0  # its /metrics and live page; 0: none

    @property
    def peer_id(self) -> str:
        return f"peer-{self.index}"

    @property
    def page_url(self) -> str:
        """Its live page (docs/operations.md, "The live page"); "" without a metrics port."""
        return f"http://127.0.0.1:{self.metrics_port}/" if self.metrics_port else ""


Settings = Callable[["LocalDaemon"], dict[str, dict[str, object]]]


def _write_config(peer: LocalDaemon, realm: str, settings: Settings | None = None) -> None:
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
    if peer.metrics_port:
        tables["metrics"] = {"port": peer.metrics_port}
    for table, values in (settings(peer) if settings else {}).items():
        tables.setdefault(table, {}).update(values)
    (peer.dir / "peerd.toml").write_text(tomli_w.dumps(tables))


class LocalCluster:
    """N daemons as subprocesses; always stopped, by PID, on exit."""

    def __init__(
        self, n: int, out: Path, localities: Sequence[str] = (), slowdowns: tuple[float, ...] | None = None,
        settings: Settings | None = None, wrap: Sequence[str] = (), metrics: bool = False,
    ) -> None:
        """`settings(peer)` adds or replaces config values per peer, e.g.
        {"worker": {"restart_backoff_s": 5.0}}; `wrap` runs each daemon under a
        command, e.g. ("ip", "netns", "exec", NAME); `metrics`: each daemon serves
        /metrics and its live page on a free port of 127.0.0.1 (LocalDaemon.page_url)."""
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
        self.peers = [LocalDaemon(i, out / f"peer-{i}", self._sockets / f"peer-{i}.sock", slowdown=f)
                      for i, f in enumerate(slowdowns)]
        for peer, locality in zip(self.peers, localities):
            peer.locality = locality
        for peer, port in zip(self.peers, free_ports(n) if metrics else ()):
            peer.metrics_port = port

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

    def start(self, peer: LocalDaemon) -> None:
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

    def client(self, peer: LocalDaemon) -> ControlClient:
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


def free_ports(n: int) -> list[int]:
    """`n` distinct ports of 127.0.0.1 that were free a moment ago: all bound at
    once, so the kernel cannot hand out one twice."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


DIGITS_MODULE = "peerd.examples.digits_local"  # the built-in job whose data peerd cluster splits itself


def data_roots(peers: int | None, roots: Sequence[Path] = (), data_dir: Path | None = None) -> list[Path] | None:
    """Each peer's data root from the command line, peer-0's first: `roots` (one
    per peer, in order) or `data_dir`/peer-K/; None when neither is given. With
    `peers` None the count is taken from them (docs/operations.md, "Try it on one machine")."""
    if roots and data_dir is not None:
        raise PeerdError("give --data-root once per peer or --data-dir, not both")
    if roots:
        if peers is not None and len(roots) != peers:
            raise PeerdError(f"--data-root given {len(roots)} time{'s' * (len(roots) != 1)} for --peers {peers}: "
                             "give one data root per peer, peer-0's first")
        found = [Path(r).expanduser().resolve() for r in roots]
        for k, root in enumerate(found):
            if not root.is_dir():
                raise PeerdError(f"--data-root {root} (peer-{k}'s) is not a directory")
        return found
    if data_dir is None:
        return None
    base = Path(data_dir).expanduser().resolve()
    if not base.is_dir():
        raise PeerdError(f"--data-dir {base} is not a directory")
    present = {d.name for d in base.iterdir() if d.is_dir() and re.fullmatch(r"peer-(0|[1-9][0-9]*)", d.name)}
    if peers is None:
        peers = len(present)
        if not peers:
            raise PeerdError(f"--data-dir {base} holds no peer-0/ folder: it needs one folder per peer, "
                             "peer-0/, peer-1/, ... each that peer's data root")
    missing = [f"peer-{k}/" for k in range(peers) if f"peer-{k}" not in present]
    if missing:
        extra = sorted(present - {f"peer-{k}" for k in range(peers)}, key=lambda n: int(n[5:]))
        told = f" (it has {', '.join(n + '/' for n in extra)})" if extra else ""
        raise PeerdError(f"--data-dir {base} lacks {', '.join(missing)}{told}: it needs one folder per peer, "
                         f"peer-0/ … peer-{peers - 1}/")
    return [base / f"peer-{k}" for k in range(peers)]


def local_data_settings(spec, out: Path, peers: int, workers: int = 1,
                        roots: Sequence[Path] | None = None) -> Settings | None:
    """A local-data job: each peer's data root and the job secret (made in `out`).
    `roots`: one per peer (`data_roots`); without them only the built-in digits
    job has data peerd can split (by label, into `out`/peer-K/data). None for a
    shared-data job."""
    if spec.data_mode != "local":
        if roots is not None:
            raise PeerdError(f"job {spec.name!r} reads shared data (data_mode = 'shared'): every peer reads the "
                             "whole data set, and --data-root/--data-dir are for data_mode = 'local' jobs")
        return None
    if workers > 1:
        raise PeerdError("--workers > 1 with local data: every worker of a daemon would read the same data")
    if roots is not None:
        if len(roots) != peers:
            raise PeerdError(f"{len(roots)} data roots for {peers} peers: give one data root per peer")
        roots = list(roots)
    elif spec.module == DIGITS_MODULE:
        from peerd.examples.noniid import write_split

        roots = [out / f"peer-{k}" / "data" for k in range(peers)]
        try:
            write_split(roots)
        except ValueError as exc:
            raise PeerdError(str(exc)) from None
    else:
        raise PeerdError(f"job {spec.name!r} keeps its data on each peer (data_mode = 'local'): give each of the "
                         f"{peers} peers its data root, --data-dir DIR (holding peer-0/ … peer-{peers - 1}/) or "
                         "--data-root DIR once per peer; only the built-in digits-noniid job's data peerd cluster "
                         "splits itself" + (" (the job's [data] root would be one directory for all of them)"
                                            if spec.data_loading.root else ""))
    from peerd.security.auth import create_secret_file

    secret = out / "job.secret"
    create_secret_file(secret, overwrite=True)
    return lambda peer: {"data": {"root": str(roots[peer.index])}, "auth": {"job_secret_file": str(secret)}}


def cluster_job_text(text: str, spec, members: int, own_roots: bool) -> tuple[str, list[str]]:
    """The job file peerd cluster hands its daemons, and what it changed: [job]
    min_peers = `members` unless the job sets it (the peers start together), and
    with per-peer data roots (`own_roots`) no [data] root of the job's, which
    would name one directory for every peer."""
    data = tomllib.loads(text)
    job, notes = data.setdefault("job", {}), []
    if "min_peers" in job:
        if spec.min_peers > members:
            raise PeerdError(f"job {spec.name!r} sets min_peers = {spec.min_peers}, more than the cluster's "
                             f"workers ({members}): it would never start (lower it, or raise --peers)")
    else:
        job["min_peers"] = members
        notes.append(f"min_peers = {members}: the workers start together")
    if own_roots and "root" in data.get("data", {}):
        del data["data"]["root"]
        if not data["data"]:
            del data["data"]
        notes.append("the job's [data] root is left out: each peer reads its own data root")
    return tomli_w.dumps(data), notes
