"""A bounded history of every job member's progress, for the curves of the
daemon's page (docs/operations.md, "The live page").

It is filled from what the daemon hears anyway: its own workers' heartbeats
(every 0.5 s) and the peers' Hello replies (every hello_interval_s). Each member
keeps at most `capacity` points, at most one per `spacing_s` (and one more
whenever its metric changes, so no evaluation is missed). A full series drops
every other point and doubles its spacing: it spans the whole run at a coarser
grain instead of only its last minutes, in the same memory.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

CAPACITY = 240  # points per member: 8 doubles each, about 15 KiB
SPACING_S = 1.0
KEEP_S = 600.0  # a member not heard of for this long is forgotten (its curve with it)
MAX_SERIES = 1024  # members of all jobs together; the stalest go first
MIN_POINTS = 20  # per curve, however many members share a job's budget


class Point(NamedTuple):
    """One sample of a member. NaN: not known (yet)."""

    t: float  # the daemon's monotonic clock when it heard this
    round: float
    epochs: float  # the job's epochs done, fractional (local data: of the union)
    loss: float
    metric: float
    lr: float
    samples_per_s: float
    local_batch: float


FIELDS = Point._fields
WIDTH = len(FIELDS)
CURVES = ("loss", "metric", "lr", "samples_per_s")  # what the page draws over time


def point_of_progress(t: float, p) -> Point:
    """From a worker's Progress (its heartbeat)."""
    return Point(t, p.round, p.job_progress, p.loss, p.metric, p.lr, p.samples_per_s, p.local_batch)


def point_of_entry(t: float, e) -> Point:
    """From a peer's JobEntry (its last Hello)."""
    return Point(t, e.round, e.progress, e.loss, e.metric, e.lr, e.speed, e.local_batch)


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


@dataclass
class Series:
    """One member's points, flat in an array of doubles (WIDTH per point)."""

    capacity: int = CAPACITY
    spacing_s: float = SPACING_S
    values: array = field(default_factory=lambda: array("d"))
    last_t: float = -math.inf
    last_slot: float = -math.inf

    def __len__(self) -> int:
        return len(self.values) // WIDTH

    def add(self, point: Point) -> bool:
        """Keep `point` if its spacing slot is new or its metric changed; True if kept."""
        slot = math.floor(point.t / self.spacing_s)
        if point.t < self.last_t:
            return False  # an older Hello than one already kept
        metric_changed = len(self) and not _same(point.metric, self.values[-WIDTH + FIELDS.index("metric")])
        if slot <= self.last_slot and not metric_changed:
            return False
        if len(self) >= self.capacity:
            self._halve()
        self.values.extend(_short(v) for v in point)
        self.last_t, self.last_slot = point.t, math.floor(point.t / self.spacing_s)  # the spacing may have doubled
        return True

    def _halve(self) -> None:
        """Every other point, the first kept: the same span at half the points."""
        kept = array("d")
        for i in range(0, len(self), 2):
            kept.extend(self.values[i * WIDTH:(i + 1) * WIDTH])
        self.values = kept
        self.spacing_s *= 2

    def points(self) -> list[Point]:
        return [Point(*self.values[i * WIDTH:(i + 1) * WIDTH]) for i in range(len(self))]

    def last(self) -> Point:
        return Point(*self.values[-WIDTH:])

    def column(self, name: str, indices: list[int]) -> list[float | None]:
        """One field of the points at `indices`; None (JSON null) where it is NaN."""
        values = self.values[FIELDS.index(name)::WIDTH]
        return [v if v == v else None for v in (values[i] for i in indices)]


def thin(count: int, limit: int) -> list[int]:
    """At most `limit` indices of 0..count-1, evenly spread, the first and last kept."""
    if count <= limit:
        return list(range(count))
    if limit <= 1:
        return [count - 1] if limit == 1 else []
    step = (count - 1) / (limit - 1)
    return sorted({round(k * step) for k in range(limit)})


def _short(value: float) -> float:
    """Kept to 6 significant digits (short in JSON, plenty for a curve); NaN for
    anything not finite, which the JSON carries as null."""
    value = float(value)
    return float(f"{value:.6g}") if math.isfinite(value) else math.nan


@dataclass
class History:
    """Series by job and member, bounded in points per member and in members."""

    capacity: int = CAPACITY
    spacing_s: float = SPACING_S
    keep_s: float = KEEP_S
    max_series: int = MAX_SERIES
    _series: dict[tuple[str, str], Series] = field(default_factory=dict)

    def record(self, job: str, member: str, point: Point) -> bool:
        """Add a point of `member` in `job` (nothing before its first round: no curve yet)."""
        if point.round == 0 and math.isnan(point.loss):
            return False
        key = (job, member)
        series = self._series.get(key)
        if series is None:
            if len(self._series) >= self.max_series:
                del self._series[min(self._series, key=lambda k: self._series[k].last_t)]
            series = self._series[key] = Series(self.capacity, self.spacing_s)
        return series.add(point)

    def record_all(self, job_members: Iterable[tuple[str, str, Point]]) -> None:
        for job, member, point in job_members:
            self.record(job, member, point)

    def forget(self, now: float) -> list[tuple[str, str]]:
        """Drop the members not heard of for keep_s; return (job, member) of each."""
        gone = [k for k, s in self._series.items() if now - s.last_t > self.keep_s]
        for key in gone:
            del self._series[key]
        return gone

    def members(self, job: str) -> dict[str, Series]:
        return {m: s for (j, m), s in sorted(self._series.items()) if j == job}

    def jobs(self) -> list[str]:
        return sorted({j for j, _ in self._series})

    def as_json(self, now: float, points: int, budget: int | None = None) -> dict[str, dict[str, dict[str, list]]]:
        """{job: {member: {"age_s": seconds since its last point, "t": [seconds
        before now], "loss": [...], ...}}}: the page's curves (CURVES), each
        thinned to `points`, and to `budget` points per curve over a job's members."""
        out: dict[str, dict[str, dict[str, list]]] = {}
        for job in self.jobs():
            members = self.members(job)
            limit = max(MIN_POINTS, min(points, budget // len(members))) if budget else points
            for member, series in members.items():
                chosen = thin(len(series), limit)
                times = series.values[0::WIDTH]
                columns = {"t": [round(times[i] - now, 1) for i in chosen]}
                columns.update((name, series.column(name, chosen)) for name in CURVES)
                out.setdefault(job, {})[member] = {"age_s": round(now - series.last_t, 1), **columns}
        return out
