"""Failures, joins, leaves and speed changes at given simulated times.

Written on the command line as KIND:WHO@TIME[=VALUE]:
  fail:3@12.5      peer slot 3 crashes at t = 12.5 s (no goodbye)
  leave:3@12.5     peer slot 3 leaves gracefully (gone from the next round)
  join:4@30        4 new peers start joining at t = 30 s (they fetch a model first)
  speed:3@10=0.25  peer slot 3 runs at 0.25× its base speed from t = 10 s
"""

from __future__ import annotations

import re
from dataclasses import dataclass

KINDS = ("fail", "leave", "join", "speed")
_PATTERN = re.compile(r"^(fail|leave|join|speed):(\d+)@([0-9.eE+-]+)(?:=([0-9.eE+-]+))?$")


@dataclass(frozen=True, order=True)
class Event:
    time: float
    kind: str
    who: int  # a peer slot; for "join", how many peers join
    value: float = 1.0  # the speed factor of a "speed" event


def parse_event(text: str) -> Event:
    match = _PATTERN.match(text.strip())
    if not match:
        raise ValueError(
            f"bad schedule entry {text!r}: expected KIND:WHO@TIME[=VALUE] with KIND one of "
            f"{', '.join(KINDS)}, e.g. fail:3@12.5 or speed:3@10=0.25"
        )
    kind, who, time, value = match.groups()
    if kind == "speed" and value is None:
        raise ValueError(f"{text!r}: a speed event needs =FACTOR, e.g. speed:3@10=0.25")
    if kind != "speed" and value is not None:
        raise ValueError(f"{text!r}: only speed events take =VALUE")
    event = Event(float(time), kind, int(who), float(value) if value else 1.0)
    if event.time < 0 or event.value <= 0 or (kind == "join" and event.who < 1):
        raise ValueError(f"{text!r}: time must be ≥ 0, a factor > 0, a join count ≥ 1")
    return event


def parse_schedule(texts: list[str]) -> tuple[Event, ...]:
    return tuple(sorted(parse_event(t) for t in texts))
