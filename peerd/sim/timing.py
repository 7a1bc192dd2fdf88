"""Timing one round's transfers on the network model with the event queue.

A transfer starts once its sender and receiver have both finished their local
step and the transfers it depends on have arrived (pull semantics: a peer asks
for a segment when it needs it and the owner answers for the round it is in).
A transfer from a crashed peer never arrives: the receiver gives up after its
exchange deadline (peerd.core.deadline) and the transfers depending on it go on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from peerd.sim.algorithms import Transfer
from peerd.sim.engine import EventQueue
from peerd.sim.network import Fabric


@dataclass
class _Round:
    transfers: Sequence[Transfer]
    ready: dict[int, float]
    crashed: set[int]
    fabric: Fabric
    deadline: Callable[[int], float]
    observe: Callable[[int, float], None]
    queue: EventQueue = field(default_factory=EventQueue)
    end: dict[int, float] = field(default_factory=dict)
    sent: dict[int, float] = field(default_factory=dict)
    began: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.waiting = [len(t.deps) for t in self.transfers]
        self.dependents: list[list[int]] = [[] for _ in self.transfers]
        for k, t in enumerate(self.transfers):
            for d in t.deps:
                self.dependents[d].append(k)

    def schedule(self, k: int) -> None:
        t, ready = self.transfers[k], self.ready
        dst_ready = ready.get(t.dst, 0.0)
        src_ready = dst_ready if t.src in self.crashed else ready.get(t.src, 0.0)
        self.queue.at(max(src_ready, dst_ready), self.start, k)

    def start(self, k: int) -> None:
        t, now = self.transfers[k], self.queue.now
        if t.src in self.crashed:
            self.queue.at(now + self.deadline(t.dst), self.arrive, k)
            return
        self.sent[t.src] = self.sent.get(t.src, 0.0) + t.nbytes
        self.began[k] = now
        self.queue.at(self.fabric.send(t.src, t.dst, t.nbytes, now), self.arrive, k)

    def arrive(self, k: int) -> None:
        t, now = self.transfers[k], self.queue.now
        if k in self.began:
            self.observe(t.dst, now - self.began[k])
        if now > self.end.get(t.dst, 0.0):
            self.end[t.dst] = now
        for j in self.dependents[k]:
            self.waiting[j] -= 1
            if self.waiting[j] == 0:
                self.schedule(j)


def play(
    transfers: Sequence[Transfer],
    ready: dict[int, float],
    crashed: set[int],
    fabric: Fabric,
    deadline: Callable[[int], float],
    observe: Callable[[int, float], None],
) -> tuple[dict[int, float], dict[int, float]]:
    """(end of communication per receiving slot, bytes sent per slot) for one round.

    `ready[slot]` is when the slot finished its step; `deadline(slot)` the
    receiver's current deadline; `observe(slot, seconds)` is told every
    completed transfer's duration (from the moment it started).
    """
    state = _Round(transfers, ready, crashed, fabric, deadline, observe)
    state.queue.now = min(ready.values(), default=0.0)
    for k, waiting in enumerate(state.waiting):
        if waiting == 0:
            state.schedule(k)
    state.queue.run()
    return state.end, state.sent
