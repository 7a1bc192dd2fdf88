"""peerd cluster's progress.png: the series handed to matplotlib, from synthetic
history rows (one per peer per poll), and one real PNG."""

from __future__ import annotations

import math

from peerd.cli.plot import consensus_points, eval_points, plot_progress

NAN = math.nan


def row(t: float, peer: str, metric: float = NAN, consensus: float = NAN, step: int = 10, loss: float = 0.5,
        state: str = "running") -> dict:
    return {"t": t, "peer": peer, "state": state, "epoch": 0, "step": step, "round": step, "loss": loss,
            "samples_per_s": 100.0, "partners": "1/1", "disagreement": 0.01, "metric": metric,
            "consensus": consensus, "dir": ""}


def history() -> list[dict]:
    """Two peers polled every 0.5 s: peer-0 evaluates at 1.0 s, 3.0 s and at the end
    (4.5 s); peer-1 at 1.5 s and the end, and is down (no value) at 2.0-2.5 s."""
    rows = []
    for k in range(10):
        t = k * 0.5
        m0 = NAN if t < 1.0 else 0.80 if t < 3.0 else 0.90 if t < 4.5 else 0.93
        m1 = NAN if t < 1.5 else 0.85 if t < 4.5 else 0.92
        rows.append(row(t, "peer-0", m0, consensus=0.95 if t >= 4.5 else NAN))
        if 2.0 <= t <= 2.5:
            rows.append(row(t, "peer-1", state="down", step=0, loss=NAN))
        else:
            rows.append(row(t, "peer-1", m1, consensus=0.95 if t >= 4.5 else NAN))
    return rows


def test_each_evaluation_is_one_point_where_it_was_first_seen():
    points = eval_points(history())
    assert points == {"peer-0": [(1.0, 0.80), (3.0, 0.90), (4.5, 0.93)],
                      "peer-1": [(1.5, 0.85), (4.5, 0.92)]}  # the polls while down start nothing new


def test_eval_points_read_history_csv_strings():
    rows = [{k: str(v) for k, v in r.items()} for r in history()]
    assert eval_points(rows)["peer-1"] == [(1.5, 0.85), (4.5, 0.92)]


def test_consensus_is_one_point_per_saved_value_at_the_end():
    assert consensus_points(history()) == [(4.5, 0.95)]
    rows = history() + [row(5.0, "peer-0", 0.93, consensus=0.95), row(5.0, "peer-2", 0.5, consensus=0.91)]
    assert consensus_points(rows) == [(4.5, 0.95), (5.0, 0.91)]  # local data: each on its own test data
    assert consensus_points([row(1.0, "peer-0", 0.8)]) == []


def test_plot_writes_a_png(tmp_path):
    path = tmp_path / "progress.png"
    plot_progress(history(), path, "val_loss", "min")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    plot_progress([row(0.0, "peer-0", step=0)], tmp_path / "empty.png", "accuracy")  # nothing evaluated yet
    assert (tmp_path / "empty.png").stat().st_size > 0
