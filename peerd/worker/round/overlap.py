"""Overlapped rounds in the worker: the exchange of round r runs in the background
while the next local steps compute, and its effect lands one round stale
(peerd.worker.round.correction; docs/algorithms.md, "Overlapped rounds").

    runner = OverlapRunner(store, numel)
    await runner.start(r, model_vector, round_exchange(context, plan, view), deadline)
    ... local steps on model_vector ...
    result = await runner.finish(model_vector)   # None: no correction was applied

The runner owns three CPU buffers: the snapshot it publishes (handed to the
snapshot store, so partners read it without a copy), the buffer the round
writes the new state into, and the receive buffer. At most one round is in
flight: `start` refuses a second one before `finish`.

Deadlines. Blocking rounds keep the peers in step: each starts its next steps
when the round ends, so partners reach the next round about together. Rounds in
the background let a peer run up to one round ahead of a partner (it blocks only
when it applies the round before), so a partner may publish a round up to one
round period after this peer started it. A round's deadline is therefore the
transfer deadline plus the time since this peer's previous round started; with
the transfer deadline alone, the partners of a peer that happened to be early
missed it round after round and were suspected (bench/bandwidth.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import torch

from peerd.core.groups import GroupPlan
from peerd.core.topology import RoundPlan
from peerd.errors import PeerdError
from peerd.worker.round.correction import PendingRound
from peerd.worker.round.dispatch import run_round
from peerd.worker.round.shared import RoundResult
from peerd.worker.round.context import RoundBuffers, RoundContext, RoundInputs
from peerd.worker.wire.stores import SnapshotStore

log = logging.getLogger("peerd.worker")

GRACE_S = 1.0  # past the round's deadline, how long `finish` waits before it gives the round up


RoundExchange = Callable[[RoundBuffers], Awaitable[RoundResult | None]]


def round_exchange(ctx: RoundContext, plan: RoundPlan | GroupPlan, addresses: dict[str, str]) -> RoundExchange:
    """The round (peerd.worker.round.dispatch picks which) as an overlapped exchange."""
    def run(b: RoundBuffers) -> Awaitable[RoundResult]:
        return run_round(ctx, RoundInputs(plan, addresses, b))
    return run


class OverlapRunner:
    """Runs one round at a time in the background and applies its correction."""

    def __init__(self, store: SnapshotStore, numel: int, grace_s: float = GRACE_S,
                 on_mixed: Callable[[torch.Tensor], None] | None = None) -> None:
        self._store = store
        # Called with the round's result before its correction is applied: the
        # outer step turns it into its own (peerd.worker.round.outer).
        self._on_mixed = on_mixed
        self._numel = numel
        self._grace_s = grace_s
        self._snapshot = self._buffer()
        self._recv = self._buffer()
        self._out = self._buffer()
        self._task: asyncio.Task | None = None
        self._pending: PendingRound | None = None
        self._until = 0.0
        self._started_at: float | None = None  # when the last round started (its deadline, above)

    def _buffer(self) -> torch.Tensor:
        return torch.empty(self._numel, dtype=torch.float32)

    @property
    def pending(self) -> int | None:
        """The round in flight, or None."""
        return None if self._pending is None else self._pending.round

    async def start(
        self, round_: int, vector: torch.Tensor, exchange: RoundExchange | None, deadline_s: float = 0.0,
    ) -> None:
        """Publish `vector` (the model now, on any device) as the snapshot of
        `round_` and start its exchange; returns at once. The exchange may take
        `deadline_s` (the transfer's) plus the time since the previous round
        started (the module's docstring says why); `finish` gives it up
        `grace_s` later. With no exchange
        (nobody to gossip with) the snapshot is only published, for partners
        that still plan with this peer."""
        if self._pending is not None:
            raise RuntimeError(f"round {self._pending.round} is still in flight: finish it first")
        snapshot = self._snapshot
        snapshot.copy_(vector)  # the one copy per round (device-to-host on a GPU)
        # The store serves this buffer itself and gives back the one it retires.
        self._snapshot = await self._store.hand_over(round_, snapshot)
        now = time.monotonic()
        period = now - self._started_at if self._started_at is not None else 0.0
        self._started_at = now
        if exchange is None:
            return
        deadline_s += period
        self._pending = PendingRound(round_, snapshot, self._out)
        self._until = now + deadline_s + self._grace_s
        self._task = asyncio.ensure_future(exchange(RoundBuffers(snapshot, self._recv, deadline_s, self._out)))

    async def finish(self, vector: torch.Tensor) -> RoundResult | None:
        """Wait for the round in flight (up to its deadline and the grace) and add
        its correction to `vector`. None, with `vector` untouched: nothing was in
        flight, nobody to gossip with, the round failed or was given up."""
        pending, task = self._pending, self._task
        if pending is None or task is None:
            return None
        self._pending = self._task = None
        done, _ = await asyncio.wait({task}, timeout=max(0.0, self._until - time.monotonic()))
        if not done:
            await self._give_up(task, pending.round)
            return None
        result = self._outcome(task, pending.round)
        if result is not None:
            if self._on_mixed is not None:
                self._on_mixed(pending.mixed)
            pending.apply(vector)
        return result

    def _outcome(self, task: asyncio.Task, round_: int) -> RoundResult | None:
        """The round's result; a partner's fault is logged, a bug re-raised."""
        if task.cancelled():
            return None
        exc = task.exception()
        if exc is None:
            return task.result()
        if isinstance(exc, (PeerdError, TimeoutError)):
            log.warning("round %d: exchange failed, no correction applied: %s", round_, exc)
            return None
        raise exc

    async def _give_up(self, task: asyncio.Task, round_: int) -> None:
        log.warning("round %d: exchange still running past its deadline; given up, no correction applied", round_)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        # Fetches the round started may still write into these after the cancel:
        # the next round gets buffers of its own.
        self._recv, self._out = self._buffer(), self._buffer()

    async def aclose(self) -> None:
        """Give up the round in flight without applying it (shutdown)."""
        task, self._task, self._pending = self._task, None, None
        if task is not None and not task.done():
            await self._give_up(task, -1)
        elif task is not None:
            await asyncio.gather(task, return_exceptions=True)
