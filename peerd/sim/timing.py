"""Timing one round's transfers on the network model with the event queue.

A transfer starts once its sender and receiver have both finished their local
step and the transfers it depends on have arrived (pull semantics: a peer asks
for a segment when it needs it and the owner answers for the round it is in).
A transfer from a crashed peer never arrives: the receiver gives up after its
exchange deadline (peerd.core.deadline) and the transfers depending on it go on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from peerd.sim.algorithms import Transfer
from peerd.sim.engine import EventQueue
from peerd.sim.network import Fabric


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
    completed transfer's duration (from the moment it could start).
    """
    queue = EventQueue(now=min(ready.values(), default=0.0))
    waiting = [len(t.deps) for t in transfers]
    dependents: list[list[int]] = [[] for _ in transfers]
    for k, t in enumerate(transfers):
        for d in t.deps:
            dependents[d].append(k)
    end: dict[int, float] = {}
    sent: dict[int, float] = {}

    def start(k: int) -> None:
        t = transfers[k]
        if t.src in crashed:
            queue.at(queue.now + deadline(t.dst), lambda: arrive(k))
            return
        finish = fabric.send(t.src, t.dst, t.nbytes, queue.now)
        sent[t.src] = sent.get(t.src, 0.0) + t.nbytes
        began = queue.now
        queue.at(finish, lambda: (observe(t.dst, queue.now - began), arrive(k)))

    def arrive(k: int) -> None:
        t = transfers[k]
        end[t.dst] = max(end.get(t.dst, 0.0), queue.now)
        for j in dependents[k]:
            waiting[j] -= 1
            if waiting[j] == 0:
                schedule(j)

    def schedule(k: int) -> None:
        t = transfers[k]
        src_ready = ready.get(t.dst, 0.0) if t.src in crashed else ready.get(t.src, 0.0)
        queue.at(max(queue.now, src_ready, ready.get(t.dst, 0.0)), lambda: start(k))

    for k in range(len(transfers)):
        if waiting[k] == 0:
            schedule(k)
    queue.run()
    return end, sent
