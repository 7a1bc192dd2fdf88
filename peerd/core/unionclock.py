"""How far a local-data job is: epochs of the union, as the peers' reads add up.

With data_mode = "local" each peer reads its own data, so no position in a
shared permutation says how far the job is. Each peer counts instead what its
own steps add, `batch / union` with the union's size as it sees it at that
step, and the job's clock is the sum of those terms over every peer that
trained. A term only grows, so the terms are merged by max: a count heard
twice, late, or after a partition heals adds up exactly, every peer that
heard the same terms reads the same clock, and no peer's steps count for the
union's epochs more than once. A peer's own term is exact, the others' are a
Hello old. The terms travel with the training state (state_dict): a newcomer
or a restarted peer goes on from the job's count, its own earlier steps
included, not from the furthest peer's position (docs/algorithms.md, "Local data").

Pure: no torch, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping


class UnionClock:
    def __init__(self, me: str) -> None:
        self.me = me
        self.terms: dict[str, float] = {me: 0.0}  # peer -> epochs of the union its steps read

    @property
    def own(self) -> float:
        return self.terms[self.me]

    def add(self, samples: int, union: float) -> None:
        """This peer trained on `samples` more of a union of `union` samples."""
        self.terms[self.me] += samples / union

    def merge(self, terms: Mapping[str, float]) -> None:
        """Terms heard from the others (or a donor's, a checkpoint's): each
        peer's largest. A term of this peer's own from elsewhere is its term
        before a restart."""
        for peer, t in terms.items():
            if math.isfinite(t) and t > self.terms.get(peer, 0.0):
                self.terms[peer] = float(t)

    @property
    def epochs(self) -> float:
        """Epochs of the union done: the sum of the terms, in sorted-id order
        (the same float on every peer that holds the same terms)."""
        return math.fsum(self.terms[p] for p in sorted(self.terms))

    def state_dict(self) -> dict:
        return {"terms": dict(self.terms)}

    def load_state_dict(self, state: dict) -> None:
        self.merge(state["terms"])
