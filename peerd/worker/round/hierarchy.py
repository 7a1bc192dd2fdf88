"""One round of hierarchical crossover (peerd.core.groups; docs/algorithms.md §1.3).

For every segment s it owns, a peer (1) fetches s from the other members of
its group and averages (reduce-scatter), publishes that as stage 1, (2) fetches
stage 1 of s from the owner of s in the partner group and mixes with the
plan's weight, publishes that as stage 2; then (3) every member takes stage 2
of each segment it does not own from that segment's owner (all-gather).

The round's deadline is split in thirds, one per stage, so that a partner
group that does not answer still leaves time for the all-gather: its members
then get the in-group average. A member that misses a stage keeps its own value
for the segments concerned; a dead member costs the round only its own
segments.

When the round writes a new state (`out`), an owner computes a segment's
final value straight into it and lends that view as stage 2 (StageStore.lend):
no copy of the result. Before the round returns it lets the members' reads
that are streaming finish and takes the views back; a value some member has not
read yet is served from a copy from then on, as before, for a member that comes
late. It never waits for a member that has not come to read.

The arithmetic (reduce, mix, round to the wire dtype) is peerd.worker.round.reduce;
this module only fetches under the deadline and publishes the stages.
"""

from __future__ import annotations

import asyncio
import time

import torch

from peerd.core.groups import GroupPlan
from peerd.errors import NonFiniteAverage, PeerdError, PeerUnavailable
from peerd.worker.round.shared import RoundResult, clip_pull, keep_own, record_failure, segment_gap
from peerd.worker.round.reduce import mix_groups, reduce_group, round_to_wire_
from peerd.worker.round.context import RoundContext, RoundInputs


async def hierarchical_round(ctx: RoundContext, inputs: RoundInputs) -> RoundResult:
    """Run this peer's part of the round; `vector` (its state at the start of
    the round, already published as its snapshot) is updated in place, or left
    as it was with the new state written into `out`."""
    return await _Round(ctx, inputs).run()


def planned_partners(plan: GroupPlan, me: str) -> frozenset[str]:
    """Everyone this peer fetches from in the round: its groupmates, and the
    partner group's owners of the segments it owns."""
    owned = plan.owned_by(me)
    sources = {plan.sources[s] for s in owned if plan.sources[s] is not None}
    return frozenset((set(plan.group) | set(plan.owners) | sources) - {me})


class _Round:
    """One peer's part of one round: the fetches and the stage publishing."""

    def __init__(self, ctx: RoundContext, inputs: RoundInputs) -> None:
        plan, me, b = inputs.plan, ctx.me, inputs.buffers
        self.plan, self.me, self.addresses, self.layout = plan, me, inputs.addresses, ctx.layout
        self.transport, self.stages, self.clipper = ctx.transport, ctx.stages, ctx.clipper
        self.wire, self.feedback = ctx.wire, ctx.feedback
        self.vector, self.recv, self.out, self.deadline_s = b.vector, b.recv, b.out, b.deadline_s
        self.into = b.vector if b.out is None else b.out  # where the new state goes
        self.others = [m for m in plan.group if m != me]
        self.result = RoundResult(plan.round, planned_partners(plan, me))
        self.written: set[int] = set()
        self.buffers: dict[int, list[torch.Tensor]] = {}  # stage 0, per owned segment
        self.gaps: list[float] = []
        self.started = time.monotonic()

    async def run(self) -> RoundResult:
        owned = self.plan.owned_by(self.me)
        await self.stages.begin(self.plan.round, owned)  # first: it frees the last round's buffers
        self.buffers = self._stage0_buffers(owned)
        over = False
        try:
            await asyncio.gather(*(self._own(s) for s in owned),
                                 *(self._gather(s) for s in range(len(self.layout)) if s not in owned))
            over = True
        finally:  # cancelled or not, nothing may read the new state once the round is over
            if self.out is not None:
                await self._settle(owned, self._left(1.0) if over else 0.0)
        if self.out is not None:
            keep_own(self.out, self.vector, self.layout, self.written)
        if self.gaps:
            self.result.disagreement = sum(self.gaps) / len(self.gaps)
        self.result.seconds = time.monotonic() - self.started
        return self.result

    def _stage0_buffers(self, owned: list[int]) -> dict[int, list[torch.Tensor]]:
        """Where the groupmates' values of each owned segment arrive: views into
        `recv` when the round writes into `out` (`recv` is free then), else the
        stage store's recycled buffers. New tensors cost ~6000 page faults per
        64 MiB round, every round."""
        need = sum(self.layout[s].size for s in owned) * len(self.others)
        if self.out is None or need > self.recv.numel():
            return {s: [self.stages.buffer(self.layout[s].size) for _ in self.others] for s in owned}
        views, start = {}, 0
        for s in owned:
            size = self.layout[s].size
            views[s] = [self.recv[start + k * size : start + (k + 1) * size] for k in range(len(self.others))]
            start += size * len(self.others)
        return views

    async def _settle(self, owned: list[int], wait_s: float) -> None:
        """Take back the views of the new state this round lent (stage 2, and
        stage 1 with one group), once the reads under way are through."""
        await self.stages.settle(self.plan.round, 2, owned, wait_s)
        await self.stages.reclaim(self.plan.round, 1, [s for s in owned if self.plan.sources[s] is None], 0.0)

    def _left(self, stage_end: float) -> float:
        """The time left until the end of a stage, as a fraction of the deadline."""
        return max(0.0, self.started + stage_end * self.deadline_s - time.monotonic())

    async def _fetch(self, peer: str, s: int, into: torch.Tensor, stage: int, until: float) -> bool:
        address = self.addresses.get(peer)
        try:
            if address is None:
                raise PeerUnavailable(f"{peer} has no address in this view")
            budget = self._left(until)
            await asyncio.wait_for(
                self.transport.fetch_segment(address, self.plan.round, s, into, budget, stage), budget)
        except (PeerdError, TimeoutError) as exc:
            record_failure(self.result, peer, self.plan.round, exc)
            return False
        self.result.reached.add(peer)
        return True

    def _refuse(self, peer: str, s: int, stage: int) -> None:
        record_failure(self.result, peer, self.plan.round,
                       NonFiniteAverage(f"{peer} sent non-finite values in stage {stage} of segment {s}"))

    def _clip(self, own: torch.Tensor, theirs: torch.Tensor) -> None:
        self.result.clipped += clip_pull(own, theirs, self.clipper) < 1.0

    async def _own(self, s: int) -> None:
        """A segment this peer owns: reduce it over the group, mix it with the
        partner group's, publish both stages, keep the result."""
        span = self.layout[s]
        mine = self.vector[span.start : span.stop]
        buffers = self.buffers[s]
        got = await asyncio.gather(*(self._fetch(p, s, b, 0, 1 / 3) for p, b in zip(self.others, buffers)))
        arrived = [(p, b) for p, b, ok in zip(self.others, buffers, got) if ok]
        for _, values in arrived:
            self._clip(mine, values)
        into = self.into[span.start : span.stop]
        lend = self.out is not None  # the result goes straight into the new state, lent as stage 2
        source = self.plan.sources[s]
        # With one group the mean is the result: into the new state at once.
        total, refused = reduce_group(mine, [values for _, values in arrived],
                                      out=into if lend and source is None else self.stages.buffer(span.size))
        for i in refused:
            self._refuse(arrived[i][0], s, 0)
        if self.feedback is not None:  # both groups mix the value the partner receives
            self.feedback.round_(total, span, len(self.plan.group))
        await self.stages.put(self.plan.round, 1, s, total)
        mixed = total
        if source is not None:
            theirs = buffers[0] if buffers else self.stages.buffer(span.size)  # free again: `total` is elsewhere
            if await self._fetch(source, s, theirs, 1, 2 / 3):
                self._clip(total, theirs)
                mixed = mix_groups(total, theirs, self.plan.weight, out=into if lend else self.stages.buffer(span.size))
                if mixed is None:
                    self._refuse(source, s, 1)
                    mixed = total
        if lend:
            if mixed is not into:  # the partner group's value did not come: the group mean
                into.copy_(mixed)
            self._to_wire_(into, s)
            await self.stages.lend(self.plan.round, 2, s, into, reads=len(self.others))
        else:
            if mixed is total and self.wire != "fp32":
                mixed = mixed.clone()  # stage 1 is served as it is
            self._to_wire_(mixed, s)
            await self.stages.put(self.plan.round, 2, s, mixed)
            into.copy_(mixed)
        self.written.add(s)

    def _to_wire_(self, values: torch.Tensor, s: int) -> None:
        """Round a stage 2 value as its readers receive it; with error feedback the
        owner owes what that left out, for every member that adopts it."""
        if self.feedback is None:
            round_to_wire_(values, self.wire)
        else:
            self.feedback.round_(values, self.layout[s], len(self.plan.group))

    async def _gather(self, s: int) -> None:
        """A segment another member owns: take its final value from the owner."""
        span = self.layout[s]
        # Into the new state directly when there is one (`vector` stays as it was):
        # a segment that fails half-way is refilled from `vector` at the end.
        theirs = (self.recv if self.out is None else self.out)[span.start : span.stop]
        owner = self.plan.owners[s]
        # Stage 2 values are taken as they are, nothing is computed from them: the
        # transport checks them (a transport may leave stages 0 and 1 to the round).
        if not await self._fetch(owner, s, theirs, 2, 1.0):
            return
        mine = self.vector[span.start : span.stop]
        self.gaps.append(segment_gap(mine, theirs))
        self._clip(mine, theirs)
        if self.out is None:
            mine.copy_(theirs)
        self.written.add(s)
