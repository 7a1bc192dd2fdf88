"""`peerd cluster`: the command line around peerd.cluster.LocalCluster. Starts
N daemons on 127.0.0.1, joins each to one job, shows their progress (a live
table on a terminal, a line every 5 s elsewhere), writes history.csv and
progress.png, and stops them all on exit, Ctrl+C or SIGTERM.
"""

from __future__ import annotations

import argparse
import csv
import math
import signal
import time
from pathlib import Path

from rich import box
from rich.console import Console
from rich.live import Live
from rich.table import Table

from peerd.cluster import BUILTIN_JOBS, POLL_S, LocalCluster, Peer, builtin_job, default_job, local_data_settings
from peerd.core.codes import ENDED_STATES, ExitCode
from peerd.errors import PeerdError
from peerd.interrupts import raise_interrupt
from peerd.jobspec import load_job


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
