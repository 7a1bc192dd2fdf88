"""When a fresh worker may take its first step (docs/algorithms.md, "Starting together").

A job with `[job] min_peers = n` starts together: a worker that starts fresh
(no checkpoint of its own) holds the job's initial state and takes no step
until n members hold it, so that no peer trains alone on the union's
epochs. A waiting worker serves (its address is in the job's view) but
publishes no speed and no progress; once any member has trained, the job has
started and the worker joins it as any later peer does, taking the running
peers' state. `Join._wait_for_peers` asks `StartGate.action` at every heartbeat and carries the
answer out.
"""

from __future__ import annotations

import enum
from collections.abc import Collection
from dataclasses import dataclass


class Start(enum.StrEnum):
    WAIT = "wait"  # too few members ready yet: hold the initial state, serve, ask again
    BEGIN = "begin"  # enough members ready and none trains yet: step from the initial state, round 0
    JOIN = "join"  # the job runs already: take the running peers' state
    GIVE_UP = "give_up"  # the start timeout passed with too few members


@dataclass(frozen=True)
class StartGate:
    min_peers: int
    timeout_s: float

    def action(self, me: str, ready: Collection[str], training: Collection[str], waited_s: float) -> Start:
        """What a fresh worker does now. `ready`: the members that serve the
        job's state (waiting at the gate or training); `training`: those of
        them that took steps. A member still loading its job is not ready: the
        peers that begin without it would train the union's epochs alone."""
        if set(training) - {me}:
            return Start.JOIN
        if len(set(ready) | {me}) >= self.min_peers:
            return Start.BEGIN
        return Start.GIVE_UP if waited_s >= self.timeout_s else Start.WAIT

    def describe(self, me: str, ready: Collection[str]) -> str:
        """"2 of 3 members ready": for the phase a status shows while waiting."""
        return f"{len(set(ready) | {me})} of {self.min_peers} members ready"
