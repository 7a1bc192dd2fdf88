"""Writing a run's results: CSV tables, a JSON summary and PNG figures."""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from peerd.sim.runner import Result


def write_csv(path: Path, rows: Sequence[dict]) -> None:
    if not rows:
        return
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def write_run(result: Result, out: Path, plot: bool = True) -> list[Path]:
    """rounds.csv, peers.csv, summary.json and (with plot) run.png under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "rounds.csv", out / "peers.csv", out / "summary.json"]
    write_csv(paths[0], result.rounds)
    write_csv(paths[1], result.peers)
    paths[2].write_text(json.dumps(result.summary, indent=2) + "\n")
    if plot:
        paths.append(plot_runs({result.summary["algorithm"]: result}, out / "run.png"))
    return paths


def plot_runs(runs: dict[str, Result], path: Path) -> Path:
    """Consensus distance and train loss over simulated time, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for label, result in runs.items():
        t = [r["sim_time_s"] for r in result.rounds]
        ax1.plot(t, [max(r["consensus_distance"], 1e-12) for r in result.rounds], label=label)
        ax2.plot(t, [r["train_loss"] for r in result.rounds], label=label)
    ax1.set(xlabel="simulated time (s)", ylabel="consensus distance", yscale="log",
            title="mean ‖x_i − x̄‖ over peers")
    ax2.set(xlabel="simulated time (s)", ylabel="train loss (mean over peers)", title="training loss")
    ax1.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _by_cell(rows: Sequence[dict], metric: str) -> dict[str, dict[int, list[float]]]:
    cells: dict[str, dict[int, list[float]]] = {}
    for r in rows:
        cells.setdefault(r["algorithm"], {}).setdefault(int(r["peers_start"]), []).append(float(r[metric]))
    return cells


def sweep_table(rows: Sequence[dict], metric: str = "test_accuracy_mean_peer", scale: float = 100.0, digits: int = 2) -> str:
    """A markdown table: algorithms down, peer counts across, mean ± std over seeds."""
    cells = _by_cell(rows, metric)
    peers = sorted({p for c in cells.values() for p in c})
    lines = ["| algorithm | " + " | ".join(f"{p} peers" for p in peers) + " |", "|---" * (len(peers) + 1) + "|"]
    for algorithm, by_peers in cells.items():
        out = []
        for p in peers:
            v = np.array(by_peers.get(p, [np.nan])) * scale
            out.append(f"{v.mean():.{digits}f} ± {v.std():.{digits}f}" if len(v) > 1 else f"{v.mean():.{digits}f}")
        lines.append(f"| {algorithm} | " + " | ".join(out) + " |")
    return "\n".join(lines)


def plot_sweep(rows: Sequence[dict], path: Path, metric: str = "test_accuracy_mean_peer") -> Path:
    """`metric` (mean over seeds, bars = std) against peers, one line per algorithm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    cells = _by_cell(rows, metric)
    for algorithm, by_peers in cells.items():
        peers = sorted(by_peers)
        values = [np.array(by_peers[p]) for p in peers]
        ax.errorbar(peers, [v.mean() for v in values], yerr=[v.std() for v in values], marker="o", capsize=3, label=algorithm)
    ticks = sorted({p for c in cells.values() for p in c})
    ax.set(xscale="log", xlabel="peers", ylabel=metric.replace("_", " "))
    ax.set_xticks(ticks, labels=[str(p) for p in ticks])
    ax.minorticks_off()
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
