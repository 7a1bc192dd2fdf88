"""One hierarchical round with its group stage on the intra-host group
(peerd.worker.intrahost.group).

`intrahost_round` is hierarchical_round with its inner stage as collectives:

    agree       all_gather of (round, digest of the plan): all members go on
                together, or all fall back to hierarchical_round in this round
    stage 1     all_reduce(SUM) / g into the new state: every member holds the
                group mean of every segment (with one group, the whole round)
    stage 2     the owner of each segment fetches the partner group's stage 1 over
                the transport (gRPC / bulk lane, as today) and mixes
    all-gather  each mixed segment is broadcast from its owner

Owners publish stages 1 and 2 of their segments in the StageStore as
hierarchical_round does, so partner groups on other hosts, and a sibling that
fell back, read them as always. Returns None when the group cannot be used (not
formed yet, not this round's group, a disagreement, a failed collective): the
caller then runs hierarchical_round for the round.
"""

from __future__ import annotations

import asyncio
import time

import torch

from peerd.core.intrahost import NOT_COVERING, covers, round_key
from peerd.errors import NonFiniteAverage, PeerdError, PeerUnavailable
from peerd.worker.wire.codec import finite_by_sum
from peerd.worker.round.shared import RoundResult, clip_pull, record_failure, segment_gap
from peerd.worker.intrahost.group import IntraHostError
from peerd.worker.round.context import RoundContext, RoundInputs


async def intrahost_round(ctx: RoundContext, inputs: RoundInputs) -> RoundResult | None:
    """hierarchical_round with the inner stage on the intra-host group (same
    arguments, same result); None: the group is not usable for this round (or
    there is none), and `vector` (and `out`) are as they were, so the caller
    runs hierarchical_round. Members get the owner's mix as exact fp32 over the
    group: only stage 1 crosses hosts, and the wire dtype plays no part."""
    group, plan, b = ctx.intrahost, inputs.plan, inputs.buffers
    if group is None:
        return None
    started = time.monotonic()
    key = round_key(plan.round, plan.group, plan.owners, plan.sources) if covers(plan.group, group.members) \
        else NOT_COVERING
    if not await group.enter(plan.round, key):
        return None
    work = b.recv if b.out is None else b.out  # the new state; `vector` stays as it was until the round succeeds
    try:
        await group.run(group.mean_into_, b.vector, work)
    except IntraHostError:
        return None
    owned = plan.owned_by(ctx.me)
    others = [m for m in plan.group if m != ctx.me]
    partners = {plan.sources[s] for s in owned if plan.sources[s] is not None}
    result = RoundResult(plan.round, frozenset({*others, *partners}))
    result.reached.update(others)
    if len(plan.groups) > 1:
        await _cross_hosts(ctx, inputs, work, result, started)
    group.rounds += 1
    gaps = [segment_gap(b.vector[s.start : s.stop], work[s.start : s.stop]) for s in ctx.layout]
    result.disagreement = sum(gaps) / len(gaps)
    if b.out is None:
        b.vector.copy_(work)
    result.seconds = time.monotonic() - started
    return result


async def _cross_hosts(ctx: RoundContext, inputs: RoundInputs, work: torch.Tensor, result: RoundResult,
                       started: float) -> None:
    """Stages 2 and 3: owners mix with the partner groups over the transport, then
    each mixed segment goes to the group by broadcast from its owner."""
    group, plan, me, layout, stages = ctx.intrahost, inputs.plan, ctx.me, ctx.layout, ctx.stages
    addresses, vector, deadline_s = inputs.addresses, inputs.buffers.vector, inputs.buffers.deadline_s
    owned = plan.owned_by(me)
    await stages.begin(plan.round, owned)
    for s in owned:  # stage 1, for the partner groups' owners
        mean = work[layout[s].start : layout[s].stop]
        if ctx.feedback is not None:  # both groups mix the value the partner receives
            ctx.feedback.round_(mean, layout[s], len(plan.group))
        await stages.put(plan.round, 1, s, mean.clone())

    async def mix(s: int) -> None:
        span, source = layout[s], plan.sources[s]
        mean = work[span.start : span.stop]
        theirs = torch.empty(span.size)
        address = addresses.get(source)
        try:
            if address is None:
                raise PeerUnavailable(f"{source} has no address in this view")
            budget = max(0.0, started + deadline_s * 2 / 3 - time.monotonic())
            await asyncio.wait_for(ctx.transport.fetch_segment(address, plan.round, s, theirs, budget, 1), budget)
        except (PeerdError, TimeoutError) as exc:
            record_failure(result, source, plan.round, exc)
        else:
            result.reached.add(source)
            result.clipped += clip_pull(mean, theirs, ctx.clipper) < 1.0
            if finite_by_sum(theirs):  # the transport leaves stage 1 to the round (ROUND_CHECKED_STAGES)
                mean.mul_(1 - plan.weight).add_(theirs, alpha=plan.weight)
            else:
                record_failure(result, source, plan.round, NonFiniteAverage(
                    f"{source} sent non-finite values in stage 1 of segment {s}"))
        await stages.put(plan.round, 2, s, mean.clone())  # for a sibling that fell back

    await asyncio.gather(*(mix(s) for s in owned if plan.sources[s] is not None))
    mixed = [s for s in range(len(layout)) if plan.sources[s] is not None]
    for k, s in enumerate(mixed):  # the same order on every member
        span = layout[s]
        try:
            await group.run(group.broadcast_, work[span.start : span.stop], group.rank_of(plan.owners[s]))
        except IntraHostError:
            # A segment not (fully) received keeps this member's own value, as a miss does.
            for t in mixed[k:]:
                if plan.owners[t] != me:
                    work[layout[t].start : layout[t].stop].copy_(vector[layout[t].start : layout[t].stop])
                    result.misses += 1
            return
