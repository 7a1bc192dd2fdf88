"""Which donor serves which range of the state a joiner pulls (docs/algorithms.md §1.8).

A joiner cuts the training state into ranges and pulls them from several donors
at once (docs/protocol.md, `FetchState`): each donor is asked for the next range
nobody serves as soon as it is free, then for a range a single other donor is
still serving (the first copy wins), a donor that fails serves no more, and one
that sent a corrupt range is trusted for none of the ranges it served: those are
asked of the others again, a donor whose own copy of one was called off (the
corrupt copy came first) included. Those decisions live here, apart from the
fetches and timeouts that carry them out (peerd.worker.state.pull.pull_state), so
that they can be checked step by step.

The executor asks `assign` whenever a donor is free and reports how each fetch
ended (`arrived`, `cancelled`, `failed`); nothing here waits or does I/O.
The pull is over when every donor has been told `Stop`: not when every range
is in, since a fetch still under way may end corrupt and void ranges.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Fetch:
    """Ask the donor for range `index`."""

    index: int


@dataclass(frozen=True)
class Wait:
    """Nothing for the donor now, but fetches are under way: ask again when one ends."""


@dataclass(frozen=True)
class Stop:
    """Nothing more for the donor: it failed, or none is left it may serve and no fetch is under way."""


Step = Fetch | Wait | Stop


@dataclass
class PullPlan:
    """The ranges of one pull: who was asked for what, what is in, who failed."""

    ranges: int
    donors: tuple[str, ...]
    # range -> the donor whose copy is kept, in the order the copies arrived
    kept: dict[int, str] = field(default_factory=dict, init=False)
    serving: dict[int, list[str]] = field(default_factory=dict, init=False)  # fetches under way
    alive: set[str] = field(default_factory=set, init=False)
    reasons: dict[int, list[str]] = field(default_factory=dict, init=False)  # failures, for the error
    gone: dict[str, str] = field(default_factory=dict, init=False)  # failed donor -> why

    def __post_init__(self) -> None:
        if self.ranges < 1:
            raise ValueError(f"need at least one range, got {self.ranges}")
        if not self.donors:
            raise ValueError("need at least one donor")
        if len(set(self.donors)) != len(self.donors):
            raise ValueError(f"donors named twice: {self.donors}")
        self.donors = tuple(self.donors)
        self.serving = {k: [] for k in range(self.ranges)}
        self.reasons = {k: [] for k in range(self.ranges)}
        self.alive = set(self.donors)

    @property
    def complete(self) -> bool:
        return len(self.kept) == self.ranges

    @property
    def in_flight(self) -> bool:
        return any(self.serving.values())

    def pick(self, donor: str) -> Step:
        """What `donor` should do now, recording nothing.

        A range nobody serves comes first, so every donor has one at the start
        and a donor late to answer serves fewer; once none is left, a range a
        single other donor is still serving, so a straggler holds up no range.
        A donor is never asked for a range it serves already; one whose copy
        was called off (another came first) is asked for that range again if
        the copy kept is voided later."""
        if donor not in self.alive:
            return Stop()
        open_ = [k for k in range(self.ranges) if k not in self.kept and donor not in self.serving[k]]
        fresh = [k for k in open_ if not self.serving[k]]
        hedge = [k for k in open_ if len(self.serving[k]) == 1]
        if chosen := fresh or hedge:
            return Fetch(chosen[0])
        # A fetch under way may fail (its range opens up) or void a corrupt
        # donor's ranges, even once every range is in (a copy called off may
        # have ended corrupt before the call-off landed); with none under way,
        # nothing will open up.
        return Wait() if self.in_flight else Stop()

    def assign(self, donor: str) -> Step:
        """`pick`, recording a fetch as under way."""
        step = self.pick(donor)
        if isinstance(step, Fetch):
            self.serving[step.index].append(donor)
        return step

    def arrived(self, donor: str, index: int) -> bool:
        """`donor`'s copy of `index` came in; True if it is kept, False if
        another copy came first. The executor then calls off the fetches of
        `serving[index]`, copies no longer needed."""
        self.serving[index].remove(donor)
        if index in self.kept:
            return False
        self.kept[index] = donor
        return True

    def cancelled(self, donor: str, index: int) -> None:
        """`donor`'s fetch of `index` was called off: another copy came first."""
        self.serving[index].remove(donor)

    def failed(self, donor: str, index: int, reason: str, corrupt: bool) -> list[int]:
        """`donor`'s fetch of `index` failed: it serves no more. If what it
        sent was corrupt, none of its ranges is trusted; those are returned,
        open again to every donor left, one whose copy was called off too."""
        self.serving[index].remove(donor)
        self.reasons[index].append(reason)
        self.gone[donor] = reason
        self.alive.discard(donor)
        if not corrupt:
            return []
        voided = self.ranges_from(donor)
        for k in voided:
            del self.kept[k]
            self.reasons[k].append(f"{reason}, so its copy of this range was dropped")
        return voided

    def ranges_from(self, donor: str) -> list[int]:
        """The kept ranges `donor` served, in the order they arrived."""
        return [k for k, d in self.kept.items() if d == donor]

    def used(self) -> list[str]:
        """The donors whose copies are kept."""
        return sorted(set(self.kept.values()))

    def missing(self) -> list[int]:
        """The ranges not in: once every donor has stopped, the pull failed if any."""
        return [k for k in range(self.ranges) if k not in self.kept]

    def why(self, index: int) -> str:
        """Why `index` is missing: its donors' failures, or, for a range nobody
        was asked for before every donor failed, every donor's."""
        return "; ".join(self.reasons[index]) or "every donor failed: " + "; ".join(self.gone.values())


def one_donor_if_apart(pieces: Sequence[tuple[int, str]], max_round_spread: int) -> str | None:
    """The donor to take the whole state from, if the pieces may not be joined.

    `pieces`: each kept range's (round, donor), in the order they arrived.
    Ranges of donors more than `max_round_spread` rounds apart (one cut off by a
    partition trained alone) pieced together are no model at all: then the
    donor of the middle round, the first range of that round, serves it all."""
    rounds = sorted(r for r, _ in pieces)
    if len({d for _, d in pieces}) < 2 or rounds[-1] - rounds[0] <= max_round_spread:
        return None
    median = rounds[len(rounds) // 2]
    return next(d for r, d in pieces if r == median)

