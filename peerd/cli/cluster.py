"""`peerd cluster`: the command line around peerd.cli.localcluster.LocalCluster. Starts
N daemons on 127.0.0.1, joins each to one job, shows their progress (a live
table on a terminal, a line every 5 s elsewhere), writes history.csv and
progress.png (and TensorBoard's event files in OUT/tensorboard), and stops them
all on exit, Ctrl+C or SIGTERM.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import math
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from rich import box
from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from peerd.cli.plot import metric_label, plot_progress
from peerd.cli.localcluster import (BUILTIN_JOBS, POLL_S, LocalCluster, LocalDaemon, Settings, builtin_job, cluster_job_text,
                           data_roots, default_job, local_data_settings)
from peerd.core.codes import ENDED_STATES, ExitCode
from peerd.errors import PeerdError
from peerd.cli.interrupts import raise_interrupt
from peerd.settings.jobspec import load_job


def _job_file(text: str) -> Path:
    """A job file, or the short name of a built-in job."""
    return builtin_job(text) if text in BUILTIN_JOBS else Path(text)


DESCRIPTION = """\
Start N peerd daemons on 127.0.0.1, join each to one job, show their progress,
and stop them all at the end (or on Ctrl+C). The workers start together: the job
handed to the daemons (OUT/job.toml) gets [job] min_peers = peers × workers per
daemon unless it sets min_peers itself. Each worker's curves go to
OUT/tensorboard/JOB/MEMBER for TensorBoard (with the tensorboard package).

Local data (data_mode = "local"): each peer trains on its own data root only.
Give one per peer, with --data-dir DIR (DIR/peer-0/ ... DIR/peer-N-1/) or
--data-root DIR once per peer, peer-0's first; without --peers, the count of
roots is the count of peers. The built-in digits-noniid job needs neither: peerd
cluster splits its digits by label into OUT/peer-K/data. A job secret is made
in OUT/job.secret for every local-data job (a job's own secret_file wins).

It ends with the job's metric of the model the peers saved (model.pt: the
consensus, the average of their final models), with each peer's own model's
beside it, and says so when a peer's training collapsed (model.json's
collapse_reason); then it exits 1. A peer that did not finish shows why under
its line: its last error line and the end of its traceback (as peerctl status).
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = DESCRIPTION
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--peers", type=_count, default=None,
                        help="number of daemons (default 3, or one per data root given)")
    parser.add_argument("--job", type=_job_file, default=None, metavar="FILE|NAME",
                        help="a job file, or a built-in job: " + "; ".join(f"{k}: {v}" for k, v in BUILTIN_JOBS.items())
                        + " (default: mnist)")
    roots = parser.add_mutually_exclusive_group()
    roots.add_argument("--data-dir", type=Path, default=None, metavar="DIR",
                       help='a data_mode = "local" job: DIR holds one folder per peer, peer-0/ ... peer-N-1/, '
                            "each that peer's data root ([data] root)")
    roots.add_argument("--data-root", type=Path, action="append", default=[], metavar="DIR",
                       help='a data_mode = "local" job: one peer\'s data root; give it once per peer, '
                            "peer-0's first")
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


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


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


def _poll(cluster: LocalCluster, job: str, elapsed: float) -> list[dict]:
    """One row per worker (a daemon may run several), or per daemon while it has none."""
    rows = []
    for peer in cluster.peers:
        row = {"t": round(elapsed, 2), "peer": peer.peer_id, "state": "down", "epoch": 0, "step": 0, "round": 0,
               "loss": math.nan, "samples_per_s": math.nan, "partners": "-", "disagreement": math.nan,
               "metric": math.nan, "consensus": math.nan, "dir": "", "collapse": "", "message": ""}
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
        workers = ([(w.member, w.state, w.progress, w.log_path, w.message) for w in j.workers]
                   or [(peer.peer_id, j.state, j.progress, j.log_path, j.message)])
        for member, state, p, log_path, message in workers:
            rows.append({**row, "peer": member or peer.peer_id, "state": state, "epoch": p.epoch, "step": p.step,
                         "round": p.round, "loss": p.loss, "samples_per_s": p.samples_per_s,
                         "partners": f"{p.partners_reached}/{p.partners_planned}",
                         "disagreement": p.disagreement, "metric": p.metric,
                         "consensus": p.metrics.get(f"consensus_{p.metric_name}", math.nan),
                         # where its log, and at the end model.pt and model.json, are (not in history.csv)
                         "dir": str(Path(log_path).parent) if log_path else "",
                         "collapse": p.collapse_reason,  # why its training collapsed (not in history.csv)
                         "message": message})  # why it crashed or failed: its error line, its traceback's end
    return rows


def _write_history(history: list[dict], path: Path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[k for k in history[0] if k not in ("dir", "collapse", "message")],
                                extrasaction="ignore")
        writer.writeheader()
        writer.writerows(history)


def _local_data_note(spec, out: Path, roots: list[Path] | None) -> str:
    """Where a local-data job's peers read their data, and which secret guards it."""
    where = (f"the digits split by label into {out}/peer-K/data" if roots is None
             else "; ".join(f"peer-{k}: {root}" for k, root in enumerate(roots)))
    secret = f"a job secret in {out / 'job.secret'}" if not spec.secret_file else "the job's own secret_file"
    return f"local data: {where}; {secret}"


def _daemon_settings(local: Settings | None, workers: int, tensorboard: Path) -> Settings:
    """Each daemon's own config tables: a local-data job's root and secret,
    `workers` CPU workers, and the run's TensorBoard directory."""
    def settings(peer: LocalDaemon) -> dict[str, dict[str, object]]:
        tables = local(peer) if local else {}
        if workers > 1:
            tables["worker"] = {"devices": ["cpu"] * workers}
        tables["log"] = {"tensorboard": str(tensorboard)}
        return tables

    return settings


def _tensorboard_note(spec, job_path: Path, ours: Path) -> str:
    """How to watch the run's curves: where they go (the job's own [log]
    tensorboard wins), or that the package to write them is missing."""
    if importlib.util.find_spec("tensorboard") is None:
        return (f"TensorBoard: the package is not installed here, so no curves in {ours} "
                "(pip install peerd[tensorboard]); history.csv and progress.png are written all the same")
    where = spec.tensorboard_dir(str(job_path.resolve().parent)) or ours
    return f"TensorBoard: tensorboard --logdir {where}"


def run_cluster(args: argparse.Namespace) -> int:
    console = Console()
    job_path = args.job or default_job()
    out = args.out or Path("runs") / time.strftime("cluster-%Y%m%d-%H%M%S")
    made_out = not out.exists()
    try:
        spec, text = load_job(job_path)
        roots = data_roots(args.peers, args.data_root, args.data_dir)
        peers = args.peers or (len(roots) if roots is not None else 3)
        out.mkdir(parents=True, exist_ok=True)
        local = local_data_settings(spec, out, peers, args.workers, roots)
        text, notes = cluster_job_text(text, spec, peers * args.workers, own_roots=local is not None)
        (out / "job.toml").write_text(text)
    except PeerdError as exc:
        console.print(f"[red]peerd cluster: {escape(str(exc))}")
        if made_out and out.is_dir() and not any(out.iterdir()):
            out.rmdir()
        return ExitCode.CONFIG
    console.print(f"starting {peers} peerd daemons on 127.0.0.1 for job [bold]{escape(spec.name)}[/] "
                  f"({escape(str(job_path))}); logs in {escape(str(out))}")
    for note in notes:
        console.print(f"job file handed to the daemons, {escape(str(out / 'job.toml'))}: {escape(note)}")
    if local:
        console.print(escape(_local_data_note(spec, out, roots)))
    tensorboard = out.resolve() / "tensorboard"
    console.print(escape(_tensorboard_note(spec, job_path, tensorboard)))
    history: list[dict] = []
    rows: list[dict] = []
    started = time.monotonic()
    previous = signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        settings = _daemon_settings(local, args.workers, tensorboard)
        with LocalCluster(peers, out, slowdowns=args.slowdowns, settings=settings, metrics=True) as cluster:
            console.print(f"live page: {cluster.peers[0].page_url} (peer-0's daemon; each daemon serves "
                          "its own, and /metrics beside it)")
            cluster.wait_ready()
            cluster.wait_discovery(console)
            for peer in cluster.peers:
                with cluster.client(peer) as c:
                    # Relative paths in the job (its module, secret_file, [data] root) stay the job file's.
                    c.join(text, str(job_path.resolve().parent))
            data = "the union of the peers' data" if local else "the shared data"
            console.print(f"all {peers} peers joined {escape(spec.name)}; training "
                          f"({spec.epochs:g} epoch{'s' * (spec.epochs != 1)} over {data})")
            rows = _follow(cluster, spec, started, args.time_limit, history, console)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: stopped every daemon")
        return 130
    except PeerdError as exc:
        console.print(f"[red]peerd cluster: {escape(str(exc))}")
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)
        if history:
            _write_history(history, out / "history.csv")
            plot_progress(history, out / "progress.png", spec.metric, spec.metric_mode)
    return _summary(rows, out, time.monotonic() - started, console, spec)


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


def _num(value: float) -> str:
    """A metric's value: 4 decimals, or 4 significant digits for a small one (a loss near 0)."""
    if value is None or math.isnan(value):
        return "-"
    return f"{value:.4f}" if value == 0 or abs(value) >= 0.01 else f"{value:.4g}"


@dataclass
class Saved:
    """What a finished worker saved (its model.json): the consensus's metric, its own
    model's, and which consensus it took part in."""

    peer: str
    own: float
    consensus: float
    digest: str = ""  # "" when its model.json could not be read
    members: tuple[str, ...] = ()
    collapse: str = ""  # why its training collapsed (model.json's collapse_reason); "" when it did not


def _saved(row: dict, metric: str) -> Saved:
    """From the worker's model.json (docs/operations.md, "Try it on one machine"); the
    last progress report's values when it cannot be read."""
    fallback = Saved(row["peer"], row["metric"], row["consensus"], collapse=row.get("collapse", ""))
    try:
        info = json.loads((Path(row["dir"]) / "model.json").read_text()) if row["dir"] else None
    except (OSError, ValueError):
        info = None
    if not isinstance(info, dict):
        return fallback
    metrics = info.get("metrics") or {}
    own = float(metrics.get(metric, fallback.own))
    return Saved(row["peer"], own, float(metrics.get(f"consensus_{metric}", own)),
                 str(info.get("consensus_digest") or ""), tuple(info.get("consensus") or ()),
                 str(info.get("collapse_reason") or fallback.collapse))


def _headline(saved: list[Saved], spec, elapsed: float) -> tuple[str, bool]:
    """The line the run ends with, and whether every peer saved the same model."""
    label = metric_label(spec.metric)
    better = "higher is better" if spec.metric_mode == "max" else "lower is better"
    own = "each peer's own model: " + ", ".join(f"{s.peer} {_num(s.own)}" for s in saved)
    digests = {s.digest for s in saved}
    if len(digests) == 1 and "" not in digests:
        values = [s.consensus for s in saved]
        size = max(len(s.members) for s in saved) or len(saved)
        if max(values) - min(values) <= 1e-9 * max(1.0, max(abs(v) for v in values)):
            value = _num(values[0])
        else:  # one model, each peer's own test data (local data)
            value = (f"{_num(sum(values) / len(values))} (mean over the peers' own test data: "
                     + ", ".join(f"{s.peer} {_num(s.consensus)}" for s in saved) + ")")
        return (f"{label} of the saved model: {value} ({better}; model.pt, the consensus of {size} "
                f"peer{'s' * (size != 1)}, the same on every peer); {own}; in {elapsed:.0f}s"), True
    groups: dict[str, list[Saved]] = {}
    for s in saved:
        groups.setdefault(s.digest, []).append(s)
    parts = []
    for digest, group in groups.items():
        names = ", ".join(s.peer for s in group)
        what = f"consensus {digest[:12]}" if digest else "model.json not readable"
        parts.append(f"{names}: " + ", ".join(_num(s.consensus) for s in group) + f" ({what})")
    known = [d for d in groups if d]
    why = (f"the peers saved {len(known)} different models (consensus_digest in model.json)" if len(known) > 1
           else "not every peer's model.json could be read")
    line = f"{label} of the saved models ({better}): {why}: " + "; ".join(parts)
    return f"{line}; {own}; in {elapsed:.0f}s", False


def _summary(rows: list[dict], out: Path, elapsed: float, console: Console, spec) -> int:
    finished = [r for r in rows if r["state"] == "finished" and not math.isnan(r["metric"])]
    label = metric_label(spec.metric)
    for r in rows:
        consensus = f" (own model), {_num(r['consensus'])} (saved model, the consensus)" \
            if not math.isnan(r["consensus"]) else ""
        state = f"{r['state']}, collapsed ({r['collapse']})" if r.get("collapse") else r["state"]
        console.print(escape(f"{r['peer']}: {state}, {r['step']} steps, {label} {_num(r['metric'])}{consensus}"))
        for line in _why_lines(r.get("message", "")):
            console.print(escape(line), soft_wrap=True)
    console.print(escape(f"history: {out / 'history.csv'}; plot: {out / 'progress.png'}"))
    if not finished or len(finished) < len(rows):
        console.print(f"[red]not every peer finished ({len(finished)}/{len(rows)}); see the logs in {escape(str(out))}")
        return 1
    saved = [_saved(r, spec.metric) for r in finished]
    line, same = _headline(saved, spec, elapsed)
    collapsed = [s for s in saved if s.collapse]
    console.print(f"[bold {'red' if collapsed else 'green' if same else 'yellow'}]{escape(line)}")
    if collapsed:  # the job ended, but its model is no trained result (docs/operations.md)
        console.print(f"[bold red]{escape(_collapse_line(collapsed))}")
        return 1
    return 0


def _why_lines(message: str) -> list[str]:
    """A worker's reason under its line, as peerctl status shows it: the error line,
    then the last lines of its traceback, indented (each bounded by the daemon:
    docs/operations.md, "When a worker crashes")."""
    first, *traceback = message.splitlines() or [""]
    return [f"  why: {first}", *(f"    {line}" for line in traceback)] if first else []


def _collapse_line(collapsed: list[Saved]) -> str:
    why = "; ".join(f"{s.peer}: {s.collapse}" for s in collapsed)
    return (f"training collapsed ({why}); the saved model is marked collapsed in model.json: change the job "
            "(e.g. a lower [optimizer] lr) and run it again")
