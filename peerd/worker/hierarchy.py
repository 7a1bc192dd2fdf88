"""One round of hierarchical crossover (peerd.core.groups; DESIGN §1.3).

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
"""

from __future__ import annotations

import asyncio
import time

import torch

from peerd.core.groups import GroupPlan
from peerd.core.robust import PullClipper
from peerd.core.segments import Span
from peerd.errors import PeerdError, PeerUnavailable
from peerd.worker.gossip import RoundResult, clip_pull, keep_own, record_failure, relative_gap
from peerd.worker.snapshots import StageStore
from peerd.worker.transport import Transport


async def hierarchical_round(
    plan: GroupPlan,
    me: str,
    addresses: dict[str, str],
    vector: torch.Tensor,
    recv: torch.Tensor,
    layout: list[Span],
    transport: Transport,
    stages: StageStore,
    deadline_s: float,
    clipper: PullClipper | None = None,
    wire_dtype: torch.dtype = torch.float32,
    out: torch.Tensor | None = None,
) -> RoundResult:
    """Run this peer's part of the round; `vector` (its state at the start of
    the round, already published as its snapshot) is updated in place, or left
    as it was with the new state written into `out`."""
    into = vector if out is None else out
    written: set[int] = set()
    started = time.monotonic()
    owned = plan.owned_by(me)
    others = [m for m in plan.group if m != me]
    planned = set(others) | {plan.sources[s] for s in owned if plan.sources[s] is not None}
    result = RoundResult(plan.round, frozenset(planned))
    await stages.begin(plan.round, owned)

    def left(stage_end: float) -> float:
        return max(0.0, started + stage_end * deadline_s - time.monotonic())

    async def fetch(peer: str, s: int, out: torch.Tensor, stage: int, until: float) -> bool:
        address = addresses.get(peer)
        try:
            if address is None:
                raise PeerUnavailable(f"{peer} has no address in this view")
            budget = left(until)
            await asyncio.wait_for(transport.fetch_segment(address, plan.round, s, out, budget, stage), budget)
        except (PeerdError, TimeoutError) as exc:
            record_failure(result, peer, plan.round, exc)
            return False
        result.reached.add(peer)
        return True

    async def own(s: int) -> None:
        span = layout[s]
        mine = vector[span.start : span.stop]
        buffers = [torch.empty(span.size) for _ in others]
        got = await asyncio.gather(*(fetch(p, s, b, 0, 1 / 3) for p, b in zip(others, buffers)))
        arrived = [buffer for ok, buffer in zip(got, buffers) if ok]
        for buffer in arrived:
            result.clipped += clip_pull(mine, buffer, clipper) < 1.0
        # The first sum makes the new tensor: no separate copy of `mine`.
        total = torch.add(mine, arrived[0]) if arrived else mine.clone()
        for buffer in arrived[1:]:
            total.add_(buffer)
        total.div_(1 + len(arrived))
        await stages.put(plan.round, 1, s, total)
        mixed = total
        source = plan.sources[s]
        if source is not None:
            theirs = buffers[0] if buffers else torch.empty(span.size)
            if await fetch(source, s, theirs, 1, 2 / 3):
                result.clipped += clip_pull(total, theirs, clipper) < 1.0
                mixed = total.mul(1 - plan.weight).add_(theirs, alpha=plan.weight)
        if wire_dtype != torch.float32:
            # The members get this value rounded to the wire type: the owner keeps the
            # same rounding, or the group could never agree closer than the rounding.
            mixed = mixed.to(wire_dtype).float()
        await stages.put(plan.round, 2, s, mixed)
        into[span.start : span.stop].copy_(mixed)
        written.add(s)

    async def gather(s: int) -> None:
        span = layout[s]
        # Into the new state directly when there is one (`vector` stays as it was):
        # a segment that fails half-way is refilled from `vector` at the end.
        theirs = (recv if out is None else out)[span.start : span.stop]
        if await fetch(plan.owners[s], s, theirs, 2, 1.0):
            mine = vector[span.start : span.stop]
            gaps.append(relative_gap(mine, theirs))
            result.clipped += clip_pull(mine, theirs, clipper) < 1.0
            if out is None:
                mine.copy_(theirs)
            written.add(s)

    gaps: list[float] = []
    owners = {plan.owners[s] for s in range(len(layout))} - {me}
    result.planned = frozenset(planned | owners)
    await asyncio.gather(*(own(s) for s in owned), *(gather(s) for s in range(len(layout)) if s not in owned))
    if out is not None:
        keep_own(out, vector, layout, written)
    if gaps:
        result.disagreement = sum(gaps) / len(gaps)
    result.seconds = time.monotonic() - started
    return result

