"""Time windows of a shared machine, in its local time: a pure core driven with explicit times."""

from datetime import datetime, timedelta

import pytest
from hypothesis import given, settings, strategies as st

from peerd.core.windows import clock_text, in_windows, next_start, parse_window

MONDAY = datetime(2026, 3, 2)  # a Monday
NIGHTS = parse_window("22:00-07:00")
WEEKEND = parse_window("Sat 00:00-Mon 07:00")


def at(day: int, hh: int, mm: int = 0) -> datetime:
    return MONDAY + timedelta(days=day, hours=hh, minutes=mm)


def test_a_nightly_window_holds_from_evening_to_morning_on_every_day():
    assert in_windows([NIGHTS], at(0, 22))
    assert in_windows([NIGHTS], at(3, 6, 59))
    assert not in_windows([NIGHTS], at(3, 7))
    assert not in_windows([NIGHTS], at(2, 12))
    assert in_windows([NIGHTS], at(6, 23, 30)), "Sunday night wraps into Monday"
    assert in_windows([NIGHTS], at(0, 3))


def test_a_weekend_window_holds_from_saturday_to_monday_morning():
    assert in_windows([WEEKEND], at(5, 0))
    assert in_windows([WEEKEND], at(6, 15))
    assert in_windows([WEEKEND], at(0, 6, 59))
    assert not in_windows([WEEKEND], at(0, 7))
    assert not in_windows([WEEKEND], at(4, 23, 59))


def test_no_windows_means_always():
    assert in_windows([], at(2, 12)) and next_start([], at(2, 12)) is None


def test_outside_its_windows_the_machine_waits_for_the_nearest_start():
    assert next_start([NIGHTS, WEEKEND], at(2, 12, 30)) == at(2, 22)
    assert next_start([WEEKEND], at(2, 12, 30)) == at(5, 0)


def test_a_time_reads_as_the_clock_today_the_day_this_week_else_the_date():
    now = at(2, 12, 30)
    assert clock_text(at(2, 22), now) == "22:00"
    assert clock_text(at(5, 0), now) == "Sat 00:00"
    assert clock_text(at(20, 9), now) == "2026-03-22 09:00"


def test_the_whole_day_and_a_window_ending_at_midnight_are_windows():
    assert all(in_windows([parse_window("00:00-24:00")], at(d, h)) for d in range(7) for h in range(24))
    assert in_windows([parse_window("18:00-24:00")], at(1, 23, 59))
    assert not in_windows([parse_window("18:00-24:00")], at(2, 0))


@pytest.mark.parametrize("text", ["", "22:00", "22-07", "25:00-07:00", "22:60-07:00", "07:00-07:00",
                                  "Sat 00:00-07:00", "Sam 00:00-Mon 07:00", "Mon 07:00-Mon 07:00", "24:00-07:00"])
def test_a_window_that_means_nothing_is_refused_with_its_text(text):
    with pytest.raises(ValueError, match=repr(text).replace("(", r"\(").replace(")", r"\)")):
        parse_window(text)


minutes = st.integers(0, 7 * 24 * 60 - 1).map(lambda m: MONDAY + timedelta(minutes=m))
times = st.tuples(st.integers(0, 23), st.integers(0, 59)).map(lambda t: f"{t[0]:02d}:{t[1]:02d}")
days = st.sampled_from(["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"])
windows = st.one_of(
    st.tuples(times, times).filter(lambda t: t[0] != t[1]).map(lambda t: f"{t[0]}-{t[1]}"),
    st.tuples(days, times, days, times).filter(lambda t: t[:2] != t[2:]).map(lambda t: f"{t[0]} {t[1]}-{t[2]} {t[3]}"),
).map(parse_window)


@settings(max_examples=200, deadline=None)
@given(st.lists(windows, min_size=1, max_size=3), minutes)
def test_outside_the_windows_the_next_start_is_the_first_minute_inside_them(ws, now):
    if in_windows(ws, now):
        return
    start = next_start(ws, now)
    assert start > now and in_windows(ws, start)
    assert not in_windows(ws, start - timedelta(minutes=1))
    assert start - now <= timedelta(days=7)
