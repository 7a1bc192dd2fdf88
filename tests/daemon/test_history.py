"""The page's curves (peerd.daemon.history): bounded per member and in members,
spaced, halved when full, thinned for the JSON; no clock but the points' own."""

from __future__ import annotations

import math

from peerd.core.membership import JobEntry
from peerd.daemon.history import CURVES, FIELDS, History, Point, Series, point_of_entry, point_of_progress, thin
from peerd.control.progress import empty_progress
from peerd.proto.v1 import control_pb2

NAN = math.nan


def pt(t: float, round_: int = 1, loss: float = 1.0, metric: float = NAN) -> Point:
    return Point(t, round_, 0.5, loss, metric, 0.1, 100.0, 32)


def test_a_point_per_spacing_slot_and_one_more_for_each_new_metric():
    s = Series(capacity=100, spacing_s=1.0)
    assert s.add(pt(10.0))
    assert not s.add(pt(10.4))  # same slot, same metric
    assert s.add(pt(10.6, metric=0.8))  # an evaluation is never missed
    assert not s.add(pt(10.7, metric=0.8))
    assert s.add(pt(11.0))  # next slot
    assert not s.add(pt(5.0))  # older than what is kept (a late Hello)
    assert [p.t for p in s.points()] == [10.0, 10.6, 11.0]


def test_a_full_series_halves_keeping_its_first_point_and_doubling_its_spacing():
    s = Series(capacity=8, spacing_s=1.0)
    for t in range(8):
        s.add(pt(float(t), round_=t))
    assert len(s) == 8
    s.add(pt(8.0, round_=8))
    assert [p.round for p in s.points()] == [0, 2, 4, 6, 8]
    assert s.spacing_s == 2.0
    assert not s.add(pt(9.0))  # in the slot of 8 at the new spacing
    for t in range(10, 1000):
        s.add(pt(float(t), round_=t))
    assert len(s) <= 8 and s.points()[0].round == 0 and s.points()[-1].t >= 1000 - s.spacing_s
    assert len(s.values) == len(s) * len(FIELDS)


def test_history_is_bounded_in_members_and_forgets_the_silent_ones():
    h = History(capacity=4, keep_s=60.0, max_series=3)
    for k in range(3):
        h.record("j", f"m{k}", pt(float(k)))
    h.record("j", "m3", pt(10.0))  # a fourth: the stalest (m0) goes
    assert list(h.members("j")) == ["m1", "m2", "m3"]
    h.record("j", "m3", pt(65.0))
    assert h.forget(now=65.0) == [("j", "m1"), ("j", "m2")]
    assert list(h.members("j")) == ["m3"] and h.jobs() == ["j"]


def test_nothing_is_kept_before_a_member_has_a_round_or_a_loss():
    h = History()
    assert not h.record("j", "m", Point(1.0, 0, NAN, NAN, NAN, NAN, NAN, 0))
    assert h.jobs() == []
    assert h.record("j", "m", Point(2.0, 0, 0.0, 2.3, NAN, 0.1, NAN, 32))  # trained: a loss


def test_points_come_from_a_heartbeat_and_from_a_hello_alike():
    p = empty_progress()
    p.MergeFrom(control_pb2.Progress(round=7, job_progress=1.5, loss=0.3, metric=0.9, lr=0.05, samples_per_s=800.0,
                                     local_batch=24))
    e = JobEntry("j", "fp", "", 7, "running", lr=0.05, speed=800.0, local_batch=24, progress=1.5, loss=0.3,
                 metric=0.9)
    assert point_of_progress(3.0, p) == point_of_entry(3.0, e) == Point(3.0, 7, 1.5, 0.3, 0.9, 0.05, 800.0, 24)


def test_thin_spreads_the_indices_and_keeps_both_ends():
    assert thin(5, 10) == [0, 1, 2, 3, 4]
    picked = thin(1000, 50)
    assert len(picked) == 50 and picked[0] == 0 and picked[-1] == 999 and picked == sorted(set(picked))
    assert thin(10, 1) == [9] and thin(0, 5) == []


def test_the_json_is_columns_of_short_numbers_relative_to_now_with_null_for_nan():
    h = History()
    h.record("j", "m", Point(100.0, 1, 0.1, 2.302585093, NAN, 0.05, 812.3456789, 32))
    h.record("j", "m", Point(101.0, 2, 0.2, 2.1, 0.5, 0.05, math.inf, 32))
    got = h.as_json(now=103.25, points=100)["j"]["m"]
    assert got["t"] == [-3.2, -2.2] and got["age_s"] == 2.2  # round() of the float offsets
    assert got["loss"] == [2.30259, 2.1] and got["lr"] == [0.05, 0.05]  # 6 significant digits
    assert got["metric"] == [None, 0.5] and got["samples_per_s"] == [812.346, None]
    assert set(got) == {"age_s", "t", *CURVES}
    assert History(capacity=500).as_json(0.0, 10) == {}


def test_a_jobs_budget_is_shared_by_its_members():
    h = History(capacity=100)
    for k in range(10):
        for t in range(100):
            h.record("j", f"m{k}", pt(float(t)))
    h.record("solo", "m", pt(1.0))
    got = h.as_json(now=100.0, points=80, budget=300)
    assert {len(c["t"]) for c in got["j"].values()} == {30}  # 300 over 10 members
    assert len(h.as_json(now=100.0, points=80, budget=100)["j"]["m0"]["t"]) == 20  # never below MIN_POINTS
    assert len(h.as_json(now=100.0, points=80)["j"]["m0"]["t"]) == 80
