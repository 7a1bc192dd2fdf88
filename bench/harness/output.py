"""What a bench script writes: its markdown table, CSV and JSON files, figures,
and the figures of a list of timings."""

from __future__ import annotations

import csv
import json
import math
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path


def md_table(headers: Sequence[str], rows: Iterable[Sequence[object]] = ()) -> str:
    """A markdown table: the header, its rule, one line per row (cells as given);
    without rows the head, for rows printed as they come (md_row)."""
    return "\n".join([md_row(headers), "|" + "---|" * len(headers), *(md_row(row) for row in rows)])


def md_row(cells: Sequence[object]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def write_csv(path: Path, rows: list[dict], fields: Sequence[str] | None = None) -> None:
    """Rows as CSV with a header: `fields`, or every key in first-seen order;
    nothing is written without rows."""
    if not rows:
        return
    fields = list(fields or dict.fromkeys(k for row in rows for k in row))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def read_csv(path: Path, ints: Iterable[str] = (), floats: Iterable[str] = (),
             lists: Iterable[str] = ()) -> list[dict]:
    """Rows of a CSV written by write_csv, typed back: `floats` ("" reads NaN),
    `ints`, and `lists` (JSON)."""
    ints, floats, lists = set(ints), set(floats), set(lists)

    def typed(key: str, value: str):
        if key in ints:
            return int(value)
        if key in floats:
            return float(value) if value != "" else math.nan
        if key in lists:
            return json.loads(value) if value else []
        return value

    with open(path, newline="") as f:
        return [{k: typed(k, v) for k, v in row.items()} for row in csv.DictReader(f)]


def write_json(path: Path, data: object, indent: int = 1) -> None:
    path.write_text(json.dumps(data, indent=indent, default=str) + "\n")


def pyplot():
    """matplotlib's pyplot, drawing to files only (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, paths: Iterable[Path], dpi: int = 100) -> None:
    """The figure to every path (folders made), then closed."""
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=dpi)
    pyplot().close(fig)


def quantile(xs: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def timing_cells(times: list[float]) -> list[str]:
    """Median, p90 and min of repeat times (s), in ms, as table cells."""
    return [f"{statistics.median(times) * 1e3:.1f}", f"{quantile(times, 0.9) * 1e3:.1f}", f"{min(times) * 1e3:.1f}"]


def ratio(medians: dict[str, float], name: str, base: str) -> str:
    """medians[name] / medians[base] as a cell; "-" without the base."""
    return f"{medians[name] / medians[base]:.2f}" if base in medians else "-"
