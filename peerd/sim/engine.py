"""A virtual clock and an event queue: the discrete-event core of the simulator.

Nothing here sleeps. Time is a float of simulated seconds that only moves when
the next event is taken from the queue; events at equal times run in the order
they were scheduled, so a run is deterministic. An event is a handler and one
argument (not a closure), which keeps a hundred thousand events a round cheap.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class EventQueue:
    now: float = 0.0
    _heap: list[tuple[float, int, Callable[[Any], None], Any]] = field(default_factory=list)
    _seq: itertools.count = field(default_factory=itertools.count)

    def at(self, time: float, handler: Callable[[Any], None], arg: Any = None) -> None:
        """Call handler(arg) when the clock reaches `time` (never in the past)."""
        heapq.heappush(self._heap, (time if time > self.now else self.now, next(self._seq), handler, arg))

    def run(self) -> float:
        """Run every event, including those scheduled on the way; return the clock."""
        heap, pop = self._heap, heapq.heappop
        while heap:
            self.now, _, handler, arg = pop(heap)
            handler(arg)
        return self.now
