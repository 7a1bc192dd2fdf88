"""Suspecting dead partners from missed exchanges (docs/algorithms.md §1.7).

A partner that misses its exchange in `threshold` consecutive rounds is left
out of this peer's plans for `backoff_s`, so survivors stop paying a deadline
per round for a peer that died before their daemons drop it from the view.
After the backoff it is tried again; one more miss suspects it again.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass
class Suspicion:
    threshold: int = 2
    backoff_s: float = 5.0
    _misses: dict[str, int] = field(default_factory=dict)
    _until: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.threshold < 1 or self.backoff_s <= 0:
            raise ValueError("need threshold ≥ 1 and backoff_s > 0")

    def record(self, peer: str, answered: bool, now: float) -> bool:
        """One round's outcome with `peer`; True if it just became suspected."""
        if answered:
            self._misses.pop(peer, None)
            self._until.pop(peer, None)
            return False
        misses = self._misses.get(peer, 0) + 1
        self._misses[peer] = misses
        if misses >= self.threshold and not self.suspected(peer, now):
            self._until[peer] = now + self.backoff_s
            return True
        return False

    def suspected(self, peer: str, now: float) -> bool:
        until = self._until.get(peer)
        if until is None:
            return False
        if now >= until:  # give it another chance: one more miss suspects it again
            del self._until[peer]
            self._misses[peer] = self.threshold - 1
            return False
        return True

    def keep(self, peers: Iterable[str], now: float) -> list[str]:
        """The peers that are not suspected now."""
        return [p for p in peers if not self.suspected(p, now)]
