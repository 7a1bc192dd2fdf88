"""Time windows in the machine's local time, `[availability] windows`
(docs/operations.md, "Shared machines"): "22:00-07:00" every day, or
"Sat 00:00-Mon 07:00" once a week. Pure: the caller passes the local time.

A window is a span of minutes of the week (Monday 00:00 is minute 0) that may
wrap past Sunday midnight. Minutes, not seconds: a window names whole minutes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

DAY = 24 * 60
WEEK = 7 * DAY
DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_POINT = r"(?:([A-Za-z]{3})\s+)?(\d{1,2}):(\d{2})"
_WINDOW = re.compile(rf"\s*{_POINT}\s*-\s*{_POINT}\s*")
WINDOW_RULE = '"HH:MM-HH:MM" (every day) or "Sat HH:MM-Mon HH:MM" (once a week)'


@dataclass(frozen=True)
class Window:
    """`spans`: (first minute of the week, length in minutes), one per day for a
    daily window, one for a weekly one; `text`: as it was written."""

    text: str
    spans: tuple[tuple[int, int], ...]

    def contains(self, minute: int) -> bool:
        return any((minute - start) % WEEK < length for start, length in self.spans)

    def minutes_to_start(self, minute: int) -> int:
        """Minutes from `minute` of the week to the next start of this window."""
        return min((start - minute) % WEEK for start, _ in self.spans)


def parse_window(text: str) -> Window:
    """A window from its text; ValueError naming what is wrong."""
    match = _WINDOW.fullmatch(text)
    if not match:
        raise ValueError(f"{text!r} is not a window: expected {WINDOW_RULE}")
    day1, h1, m1, day2, h2, m2 = match.groups()
    if (day1 is None) != (day2 is None):
        raise ValueError(f"{text!r}: give a day at both ends or at neither")
    start, end = _minute(text, h1, m1, allow_24=False), _minute(text, h2, m2, allow_24=True)
    if day1 is None:
        length = (end - start) % DAY or (DAY if end != start else 0)
        if length == 0:
            raise ValueError(f"{text!r} is empty: it starts where it ends")
        return Window(text, tuple((d * DAY + start, length) for d in range(7)))
    first, last = _day(text, day1) * DAY + start, _day(text, day2) * DAY + end
    length = (last - first) % WEEK
    if length == 0:
        raise ValueError(f"{text!r} is empty: it starts where it ends")
    return Window(text, ((first, length),))


def _minute(text: str, hours: str, minutes: str, allow_24: bool) -> int:
    h, m = int(hours), int(minutes)
    if m > 59 or h > 24 or (h == 24 and (m or not allow_24)):
        raise ValueError(f"{text!r}: {hours}:{minutes} is not a time of day")
    return h * 60 + m


def _day(text: str, name: str) -> int:
    try:
        return DAYS.index(name.lower())
    except ValueError:
        raise ValueError(f"{text!r}: {name!r} is not a day (Mon, Tue, ... Sun)") from None


def minute_of_week(now: datetime) -> int:
    return now.weekday() * DAY + now.hour * 60 + now.minute


def in_windows(windows: Sequence[Window], now: datetime) -> bool:
    """Inside one of the windows at `now`; no windows: always."""
    minute = minute_of_week(now)
    return not windows or any(w.contains(minute) for w in windows)


def next_start(windows: Sequence[Window], now: datetime) -> datetime | None:
    """When the first window opens after `now` (to the minute); None without windows."""
    if not windows:
        return None
    minute = minute_of_week(now)
    ahead = min(w.minutes_to_start(minute) for w in windows)
    return now.replace(second=0, microsecond=0) + timedelta(minutes=ahead)


def clock_text(at: datetime, now: datetime) -> str:
    """`at` as a person reads it from `now`: "18:00" today, "Sat 00:00" within a
    week, else the date."""
    if at.date() == now.date():
        return at.strftime("%H:%M")
    if timedelta(0) < at - now < timedelta(days=6):
        return f"{DAYS[at.weekday()].capitalize()} {at.strftime('%H:%M')}"
    return at.strftime("%Y-%m-%d %H:%M")
