"""Writing a run's results: CSV tables, a JSON summary and PNG figures."""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path

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


def plot_sweep(rows: Sequence[dict], path: Path, metric: str = "test_accuracy_mean_peer") -> Path:
    """`metric` against the number of peers, one line per algorithm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for algorithm in dict.fromkeys(r["algorithm"] for r in rows):
        mine = [r for r in rows if r["algorithm"] == algorithm]
        ax.plot([r["peers_start"] for r in mine], [r[metric] for r in mine], marker="o", label=algorithm)
    ax.set(xscale="log", xlabel="peers", ylabel=metric.replace("_", " "))
    ax.set_xticks(sorted({r["peers_start"] for r in rows}), labels=[str(p) for p in sorted({r["peers_start"] for r in rows})])
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
