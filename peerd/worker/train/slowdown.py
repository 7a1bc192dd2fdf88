"""The slowdown knob's shell: times a step on both clocks and sleeps after it
(the amount: peerd.core.slowdown).

The CPU clock is the calling thread's CPU time (time.thread_time) when torch
runs on one thread, as peerd's workers do by default ([worker] threads = 1):
then the forward, backward and optimizer step all run on the thread that calls
them, and the worker's other threads (its event loop, gRPC, the gossip) are not
counted. With more torch threads the step's intra-op work runs on torch's pool,
which thread_time misses, so the process's CPU time is read instead
(time.process_time), which also counts those other threads while they run.
DataLoader worker processes are counted by neither.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from peerd.core.slowdown import Slowdown


def cpu_clock() -> Callable[[], float]:
    """The clock that measures a step's CPU time in this process (see the module doc)."""
    return time.thread_time if torch.get_num_threads() == 1 else time.process_time


class SlowedSteps:
    """start() before a step, finish() after it: sleeps the slowdown and returns
    the step's wall time, the sleep included. fixed_s() then says how much of
    that time does not depend on the step's batch."""

    def __init__(self, slowdown: Slowdown, cpu: Callable[[], float] | None = None,
                 wall: Callable[[], float] = time.perf_counter,
                 sleep: Callable[[float], object] = time.sleep) -> None:
        self.slowdown = slowdown
        self._cpu = cpu or (cpu_clock() if slowdown.clock == "cpu" else time.thread_time)
        self._wall, self._sleep = wall, sleep
        self._wall0 = self._cpu0 = 0.0
        self._stretch = 1.0  # the last step's time over its own work, the overhead's sleep left out

    def start(self) -> None:
        self._wall0, self._cpu0 = self._wall(), self._cpu()

    def finish(self) -> float:
        wall = self._wall() - self._wall0
        pause = self.slowdown.sleep_s(wall, self._cpu() - self._cpu0)
        if pause > 0:  # a slower device that uses no extra CPU
            self._sleep(pause)
        elapsed = self._wall() - self._wall0
        self._stretch = max(1.0, (elapsed - self.slowdown.overhead_s) / wall) if wall > 0 else 1.0
        return elapsed

    def fixed_s(self, work_fixed_s: float) -> float:
        """The part of the last step's time, sleeps included, that no batch changes,
        from the part of its own work that does not (work_fixed_s): the factor's
        sleep emulates a device slower at everything, so it stretches that part
        as much as the rest; the overhead's sleep is all fixed."""
        return work_fixed_s * self._stretch + self.slowdown.overhead_s
