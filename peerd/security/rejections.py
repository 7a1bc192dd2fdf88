"""Refused messages, counted by reason and logged at most once per peer per minute."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable

LOG_EVERY_S = 60.0
_MAX_PEERS_TRACKED = 4096


class Rejections:
    def __init__(self, log: logging.Logger, clock: Callable[[], float] = time.monotonic,
                 what: str = "refused a message from") -> None:
        self.counts: Counter[str] = Counter()
        self._log = log
        self._what = what
        self._clock = clock
        self._last_logged: dict[str, float] = {}

    def record(self, peer: str, reason: str, detail: str) -> None:
        self.counts[reason] += 1
        now = self._clock()
        last = self._last_logged.get(peer)
        if last is not None and now - last < LOG_EVERY_S:
            return
        if len(self._last_logged) >= _MAX_PEERS_TRACKED:  # a flood of addresses must not grow this forever
            self._last_logged = {p: t for p, t in self._last_logged.items() if now - t < LOG_EVERY_S}
            if len(self._last_logged) >= _MAX_PEERS_TRACKED:
                self._last_logged.clear()
        self._last_logged[peer] = now
        self._log.warning("%s %s (%s): %s; %d refused so far (%s)", self._what, peer, reason, detail,
                          sum(self.counts.values()), ", ".join(f"{k}={v}" for k, v in sorted(self.counts.items())))
