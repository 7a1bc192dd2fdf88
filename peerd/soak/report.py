"""The soak report: report.md, samples.csv, events.csv and PNG plots, each with
the churn events marked on the time axis; and a one-screen summary."""

from __future__ import annotations

import csv
import math
from dataclasses import asdict, fields
from pathlib import Path

from peerd.cli.plot import metric_label
from peerd.soak.checks import FAIL, PASS, Check, Sample, convergence_times
from peerd.soak.runner import Run

COLORS = {"kill_worker": "tab:red", "kill_daemon": "darkred", "partition": "tab:purple", "leave": "tab:gray",
          "join": "tab:green", "slowdown": "tab:orange", "owner": "tab:brown", "freeze": "tab:cyan"}
PLOTS = {
    "progress.png": "{metric} and loss per peer",
    "membership.png": "membership view size per peer",
    "batch_lr.png": "global batch and learning rate per peer",
    "exchange.png": "exchange time and deadline misses per peer",
    "bytes.png": "bytes sent and received per peer",
}


def write_report(run: Run, checks: list[Check], out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    _write_csv(run.samples, out / "samples.csv")
    with open(out / "events.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["at_s", "done_s", "kind", "peer", "ok", "detail"])
        w.writerows([e.at_s, e.done_s, e.kind, e.peer, e.ok, e.detail] for e in run.events)
    if run.samples:
        _plots(run, out)
    path = out / "report.md"
    path.write_text(_markdown(run, checks))
    return path


def _write_csv(samples: list[Sample], path: Path) -> None:
    names = [f.name for f in fields(Sample)]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=names)
        w.writeheader()
        for s in samples:
            row = asdict(s)
            row["view"] = " ".join(sorted(s.view))
            w.writerow(row)


def _markdown(run: Run, checks: list[Check]) -> str:
    s = run.settings
    passed = sum(c.verdict == PASS for c in checks)
    failed = sum(c.verdict == FAIL for c in checks)
    peers = sorted({x.peer for x in run.samples}, key=lambda p: int(p.split("-")[1]))
    lines = [
        "# peerd soak report", "",
        f"- verdict: **{'FAIL' if failed or run.interrupted else 'PASS'}** — {passed} passed, {failed} failed, "
        f"{len(checks) - passed - failed} skipped" + (f"; {run.interrupted}" if run.interrupted else ""),
        f"- job: `{run.spec.name}` (fingerprint {run.spec.fingerprint[:12]}), {len(peers)} peers "
        f"({s.peers} at the start), {s.duration_s:.0f}s of churn after {run.t_training:.0f}s of setup; "
        f"metric {_metric(run)}",
        f"- network: {run.network}; bandwidth caps (Mbit/s, by peer index, cycled): "
        f"{', '.join(f'{b:g}' for b in s.bandwidth_mbit) if run.network == 'namespaces' else 'none'}",
        "- compute slowdowns: " + (f"{', '.join(f'{x:g}' for x in s.slowdowns)} (config table [{run.slowdown}])"
                                    if run.slowdown else "not supported by this build; all at full speed"),
        "- schedule: " + (f"file {s.schedule}" if s.schedule else f"seed {s.seed}, one event every {s.interval_s:g}s, "
                           f"none in the last {s.settle_s:g}s"),
        "", "## Checks", "", "| check | verdict | evidence |", "|---|---|---|",
    ]
    lines += [f"| {c.name} | {c.verdict} | {c.evidence} |" for c in checks]
    for c in checks:
        if c.details:
            lines += ["", f"**{c.name}**", ""] + [f"- {d}" for d in c.details]
    lines += ["", "## Events", "", "| at (s) | event | peer | took (s) | views converged after (s) | result |",
              "|---|---|---|---|---|---|"]
    for e, t in zip(run.events, convergence_times(run.samples, run.events)):
        lines.append(f"| {e.at_s:.0f} | {e.kind} | {e.peer} | {e.done_s - e.at_s:.1f} | "
                     f"{'never' if math.isnan(t) else f'{t:.1f}'} | {e.detail} |")
    lines += ["", "Times are seconds from the start of churn (every peer training).", "", "## Peers at the end", "",
              f"| peer | state | round | loss | {metric_label(run.spec.metric)} | restarts | deadline misses | "
              "sent (MB) |",
              "|---|---|---|---|---|---|---|---|"]
    for p in peers:
        last = [x for x in run.samples if x.peer == p][-1]
        lines.append(f"| {p} | {last.state or 'not in the job'} | {last.round} | {_f(last.loss, 3)} | "
                     f"{_f(last.metric, 4)} | {last.restarts} | {last.misses} | {_f(last.tx_bytes / 1e6, 1)} |")
    shown = {n: w for n, w in PLOTS.items() if n != "bytes.png" or run.network == "namespaces"}
    lines += ["", "## Plots", ""] + [f"![{what.format(metric=metric_label(run.spec.metric))}]({name})"
                                     for name, what in shown.items()]
    if len(shown) < len(PLOTS):
        lines.append("\nNo bytes per peer: they are read at the bridge ports, and this run had no namespaces.")
    return "\n".join(lines) + "\n"


def _metric(run: Run) -> str:
    """The job's metric in words, with its direction (job.metric_mode)."""
    better = "lower is better" if run.spec.metric_mode == "min" else "higher is better"
    return f"{metric_label(run.spec.metric)} ({better})"


def _f(value: float, digits: int) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def _plots(run: Run, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = _series(run.samples)

    def figure(name: str, panels: list[tuple[str, str, bool]], value) -> None:
        fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4), squeeze=False)
        for ax, (key, label, log) in zip(axes[0], panels):
            for peer, rows in series.items():
                xs, ys = zip(*[(r.t, value(key, r)) for r in rows]) if rows else ((), ())
                ax.plot(xs, ys, label=peer, lw=1)
            for e in run.events:
                ax.axvline(e.at_s, color=COLORS.get(e.kind, "k"), ls="--", lw=0.8, alpha=0.7)
                ax.text(e.at_s, 1.0, f"{e.kind.replace('_', ' ')} {e.peer.split('-')[1]}", rotation=90,
                        fontsize=6, va="top", ha="right", color=COLORS.get(e.kind, "k"),
                        transform=ax.get_xaxis_transform())
            ax.set(xlabel="seconds from the start of churn", ylabel=label, yscale="log" if log else "linear")
            ax.grid(alpha=0.3)
        axes[0][0].legend(fontsize=7, ncol=2)
        handles = [plt.Line2D([], [], color=c, ls="--", label=k) for k, c in COLORS.items()
                   if any(e.kind == k for e in run.events)]
        if handles:
            fig.legend(handles=handles, loc="upper center", ncol=len(handles), fontsize=8, title="events")
        fig.tight_layout(rect=(0, 0, 1, 0.88 if handles else 1))
        fig.savefig(out / name, dpi=100)
        plt.close(fig)

    nan = math.nan

    def value(key: str, r: Sample) -> float:
        if key == "view":
            return len(r.view) if r.up else nan
        if key == "misses":
            return r.misses if r.training else nan
        v = getattr(r, key)
        return v if r.training or key.endswith("bytes") else nan

    figure("progress.png", [("metric", _metric(run), False), ("loss", "training loss (EMA)", True)], value)
    figure("membership.png", [("view", "peers in the job seen by this daemon", False)], value)
    figure("batch_lr.png", [("batch", "global batch", False), ("lr", "learning rate", False)], value)
    figure("exchange.png", [("exchange_s", "exchange time of the last round (s)", True),
                            ("misses", "segments skipped at the deadline (total)", False)], value)
    rates = _rates(series)
    if run.network != "namespaces":
        return
    figure("bytes.png", [("tx_bytes", "sent (MB/s)", False), ("rx_bytes", "received (MB/s)", False)],
           lambda key, r: rates.get((r.peer, r.t, key), nan))


def _series(samples: list[Sample]) -> dict[str, list[Sample]]:
    out: dict[str, list[Sample]] = {}
    for s in sorted(samples, key=lambda s: (int(s.peer.split("-")[1]), s.t)):
        out.setdefault(s.peer, []).append(s)
    return out


def _rates(series: dict[str, list[Sample]]) -> dict[tuple[str, float, str], float]:
    """MB/s between consecutive samples, from the bridge port counters."""
    out = {}
    for peer, rows in series.items():
        for a, b in zip(rows, rows[1:]):
            for key in ("tx_bytes", "rx_bytes"):
                d = getattr(b, key) - getattr(a, key)
                if b.t > a.t and not math.isnan(d) and d >= 0:
                    out[(peer, b.t, key)] = d / (b.t - a.t) / 1e6
    return out


def summary(run: Run, checks: list[Check], report: Path) -> str:
    failed = [c for c in checks if c.verdict == FAIL]
    lines = [f"peerd soak: {'FAIL' if failed or run.interrupted else 'PASS'}"
             + (f" ({run.interrupted})" if run.interrupted else ""),
             f"  {len(run.events)} events ({sum(not e.ok for e in run.events)} failed or skipped), "
             f"{len({s.peer for s in run.samples})} peers, network: {run.network}"]
    lines += [f"  {c.verdict.upper():4}  {c.name}: {c.evidence}" for c in checks]
    for c in failed:
        lines += [f"        {d}" for d in c.details[:5]]
    lines.append(f"report: {report}")
    return "\n".join(lines)
