"""`peerd cluster`'s progress.png: each peer's training loss over time, and its
job metric at each evaluation, with the saved model's (the consensus's) at the end.

matplotlib is imported inside `plot_progress`, so `peerd --help` stays fast.
"""

from __future__ import annotations

import math
from pathlib import Path

Point = tuple[float, float]  # (seconds since the start, value)


def metric_label(metric: str) -> str:
    return "test accuracy" if metric == "accuracy" else metric


def _value(row: dict, key: str) -> float:
    try:
        return float(row[key])  # floats from the polls; strings from a history.csv read back
    except (KeyError, TypeError, ValueError):
        return math.nan


def eval_points(history: list[dict]) -> dict[str, list[Point]]:
    """Each peer's evaluations of the job's metric, once each, at the first poll
    that showed it: {peer: [(t, value), ...]}.

    A poll reports the value of the last evaluation, again at every poll until the
    next one, and no progress field says when that evaluation ran. So a change of
    value is taken as a new evaluation: two evaluations in a row with the same value
    show as one. Polls without a value (a peer down, a worker restarting) are
    skipped, not taken as a change.
    """
    out: dict[str, list[Point]] = {}
    for row in sorted(history, key=lambda r: _value(r, "t")):
        value = _value(row, "metric")
        if math.isnan(value):
            continue
        points = out.setdefault(row["peer"], [])
        if not points or points[-1][1] != value:
            points.append((_value(row, "t"), value))
    return dict(sorted(out.items()))


def consensus_points(history: list[dict]) -> list[Point]:
    """The saved model's (the consensus's) metric: one point per distinct value,
    at the time the last peer reporting that value first showed it. Peers that
    saved the same model show the same value; with local data each evaluates it
    on its own test data, hence several."""
    first: dict[str, Point] = {}
    for row in sorted(history, key=lambda r: _value(r, "t")):
        value = _value(row, "consensus")
        if not math.isnan(value) and row["peer"] not in first:
            first[row["peer"]] = (_value(row, "t"), value)
    latest: dict[float, float] = {}
    for t, value in first.values():
        latest[value] = max(t, latest.get(value, -math.inf))
    return sorted((t, value) for value, t in latest.items())


def plot_progress(history: list[dict], path: Path, metric: str, mode: str = "max") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    label = metric_label(metric)
    better = "higher is better" if mode == "max" else "lower is better"
    fig, (ax_loss, ax_metric) = plt.subplots(1, 2, figsize=(11, 4))
    evals = eval_points(history)
    for peer in sorted({r["peer"] for r in history}):
        rows = [r for r in history if r["peer"] == peer and _value(r, "step") > 0]
        ax_loss.plot([_value(r, "t") for r in rows], [_value(r, "loss") for r in rows], label=peer)
        points = evals.get(peer, [])
        if points:
            xs, ys = zip(*points)
            ax_metric.plot(xs, ys, marker="o", ms=4, label=peer)
    saved = consensus_points(history)
    if saved:
        xs, ys = zip(*saved)
        ax_metric.scatter(xs, ys, marker="*", s=160, color="black", zorder=3, label="saved model (consensus)")
    ax_loss.set(xlabel="seconds", ylabel="training loss (EMA)", title="loss per peer", yscale="log")
    ax_metric.set(xlabel="seconds", ylabel=f"{label} ({better})", title=f"{label} per peer, at each evaluation")
    for ax in (ax_loss, ax_metric):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
