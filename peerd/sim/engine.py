"""A virtual clock and an event queue: the discrete-event core of the simulator.

Nothing here sleeps. Time is a float of simulated seconds that only moves when
the next event is taken from the queue; events at equal times run in the order
they were scheduled, so a run is deterministic.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class EventQueue:
    now: float = 0.0
    _heap: list[tuple[float, int, Callable[[], None]]] = field(default_factory=list)
    _seq: itertools.count = field(default_factory=itertools.count)

    def at(self, time: float, action: Callable[[], None]) -> None:
        """Run `action` when the clock reaches `time` (never in the past)."""
        heapq.heappush(self._heap, (max(time, self.now), next(self._seq), action))

    def run(self) -> float:
        """Run every event, including those scheduled on the way; return the clock."""
        while self._heap:
            self.now, _, action = heapq.heappop(self._heap)
            action()
        return self.now
