"""Flat crossover between two peers, each averaging half (docs/algorithms.md §1.2).

With two peers in the view every segment's source is the other peer, and flat
crossover has both compute the same average of every segment (the operands in
id order: peerd.worker.round.shared's average_pair gives the two the same
bits). Doing it on both sides averages the whole vector twice. Here the pair splits the work as gloo's
ring all-reduce does: the owner of segment s (the ids sorted, s mod 2)
fetches the other's snapshot of s and averages it into its new state (stage 0),
and the other takes that average from the owner (stage 2). The values are the
ones flat crossover gives, bit for bit, with half the arithmetic per peer.

The owner serves the average straight from its new state, without a copy:
it lends the view (StageStore.lend) and, before the round returns, waits for
the read and takes it back (StageStore.reclaim), so nothing reads the state
once it is trained on. It waits (up to the deadline) only if the partner lent
it averages too: a partner that did not is gone or runs a flat round (its view
holds a third peer) and will not come to read. Failures keep flat crossover's rule, a segment not
averaged keeps each peer's own value: the owner refuses stage 2 of a segment
it could not average, and the other keeps its own when stage 2 does not come.

Used only where it gives flat crossover's values exactly (`fits`): fp32 on the
wire (the other would otherwise get the rounded average, not its own
values plus the owner's rounded ones) and no clipping (each peer clips
the pull it sees).
"""

from __future__ import annotations

import asyncio
import time

import torch

from peerd.core.robust import PullClipper
from peerd.errors import NonFiniteAverage
from peerd.worker.round.shared import RoundResult, average_pair, keep_own, record_failure, segment_gap
from peerd.worker.round.context import RoundContext, RoundInputs

STAGE_SNAPSHOT, STAGE_AVERAGE = 0, 2


def fits(peers: int, segments: int, wire: str, clipper: PullClipper | None) -> bool:
    """Whether a flat round may run as a pair round with the same result."""
    return (peers == 2 and segments >= 2 and wire == "fp32"
            and (clipper is None or not clipper.enabled))


def owned_by(me: str, partner: str, segments: int) -> list[int]:
    first = min(me, partner)
    return [s for s in range(segments) if (s % 2 == 0) == (me == first)]


async def pair_round(ctx: RoundContext, inputs: RoundInputs) -> RoundResult:
    """gossip_round's result for a view of two peers: `vector` averaged with
    the partner's snapshot, in place or into `out`."""
    return await _Pair(ctx, inputs).run()


class _Pair:
    def __init__(self, ctx: RoundContext, inputs: RoundInputs) -> None:
        plan, b = inputs.plan, inputs.buffers
        self.plan, self.layout, self.transport, self.stages = plan, ctx.layout, ctx.transport, ctx.stages
        self.vector, self.recv, self.out = b.vector, b.recv, b.out
        self.into = b.vector if b.out is None else b.out
        self.partner = plan.sources[0]
        self.address = inputs.addresses[self.partner]
        self.deadline_s = b.deadline_s
        self.result = RoundResult(plan.round, plan.partners)
        self.written: set[int] = set()
        self.lent: list[int] = []
        self.gaps: list[float] = []
        self.started = time.monotonic()

    def _own(self, s: int) -> torch.Tensor:
        span = self.layout[s]
        return self.vector[span.start : span.stop]

    async def run(self) -> RoundResult:
        owned = owned_by(self.plan.me, self.partner, len(self.layout))
        await self.stages.begin(self.plan.round, owned)
        steps = {asyncio.ensure_future(self._average(s) if s in owned else self._take(s)): s
                 for s in range(len(self.layout))}
        done: set[asyncio.Future] = set()
        try:
            done, _ = await asyncio.wait(steps, timeout=self.deadline_s)
        finally:  # cancelled or not
            await self._end(steps, owned)
        for task, s in steps.items():
            exc = None if task in done and not task.cancelled() else TimeoutError("deadline")
            exc = exc or task.exception()
            if exc is not None:
                record_failure(self.result, self.partner, self.plan.round, exc)
        if self.out is not None:
            keep_own(self.out, self.vector, self.layout, self.written)
        if self.gaps:
            self.result.disagreement = sum(self.gaps) / len(self.gaps)
        self.result.seconds = time.monotonic() - self.started
        return self.result

    async def _end(self, steps: dict[asyncio.Future, int], owned: list[int]) -> None:
        """No step outlives the round, and nothing reads the new state once it is over."""
        try:
            for task in steps:  # those done already are left as they are
                task.cancel()
            await asyncio.gather(*steps, return_exceptions=True)
        finally:
            # The partner reads our averages if it runs a pair round too, and then
            # it lent us some of its own. If it lent none (it is gone, or runs a
            # flat round because its view differs) nothing will come to read.
            took = bool(self.written - set(owned))
            await self.stages.reclaim(self.plan.round, STAGE_AVERAGE, owned, self._left() if took else 0.0)

    def _left(self) -> float:
        return max(0.0, self.started + self.deadline_s - time.monotonic())

    async def _average(self, s: int) -> None:
        """Owned: the partner's snapshot of s averaged into the new state, lent to it."""
        span = self.layout[s]
        own, theirs, into = self._own(s), self.recv[span.start : span.stop], self.into[span.start : span.stop]
        try:
            await self.transport.fetch_segment(self.address, self.plan.round, s, theirs, self.deadline_s)
        except Exception:  # a partner's failure: the other is told at once (a cancel: reclaim tells it)
            await self.stages.refuse(self.plan.round, STAGE_AVERAGE, s)
            raise
        gap = segment_gap(own, theirs)
        if not average_pair(own, theirs, into, self.plan.me < self.partner):
            await self.stages.refuse(self.plan.round, STAGE_AVERAGE, s)
            raise NonFiniteAverage(f"{self.partner} sent non-finite values in segment {s}")
        await self.stages.lend(self.plan.round, STAGE_AVERAGE, s, into, reads=1)
        self._done(s, gap)

    async def _take(self, s: int) -> None:
        """Not owned: the owner's average of s. Into the new state directly when
        there is one (a read cut half-way is refilled from `vector` at the end)."""
        span = self.layout[s]
        own = self._own(s)
        average = (self.recv if self.out is None else self.out)[span.start : span.stop]
        await self.transport.fetch_segment(self.address, self.plan.round, s, average, self.deadline_s,
                                           STAGE_AVERAGE)
        gap = 2 * segment_gap(own, average)  # own − average is half of own − theirs
        if self.out is None:
            own.copy_(average)
        self._done(s, gap)

    def _done(self, s: int, gap: float) -> None:
        self.result.reached.add(self.partner)
        self.gaps.append(gap)
        self.written.add(s)
