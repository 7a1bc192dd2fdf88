"""Which round function runs a round: the one choice for a round run now
(peerd.worker.round.rounds) and one run in the background (peerd.worker.round.overlap)."""

from __future__ import annotations

from peerd.core.groups import GroupPlan
from peerd.worker.round.crossover import gossip_round
from peerd.worker.round.hierarchy import hierarchical_round
from peerd.worker.intrahost.round import intrahost_round
from peerd.worker.round.pair import fits as pair_fits
from peerd.worker.round.pair import pair_round
from peerd.worker.round.context import RoundContext, RoundInputs
from peerd.worker.round.shared import RoundResult


async def run_round(ctx: RoundContext, inputs: RoundInputs) -> RoundResult:
    """A hierarchical plan: on the intra-host group when its members agree, else
    over the transport. A flat plan: a pair round with two peers where it gives
    flat crossover's values exactly, else a flat round."""
    plan = inputs.plan
    if isinstance(plan, GroupPlan):
        # Every worker of the group makes this call in every round, whatever its
        # view: intrahost_round agrees with the others or falls back (None).
        result = await intrahost_round(ctx, inputs)
        return result if result is not None else await hierarchical_round(ctx, inputs)
    if pair_fits(len(inputs.addresses), len(ctx.layout), ctx.wire, ctx.clipper):
        return await pair_round(ctx, inputs)  # two peers: each averages half (peerd.worker.round.pair)
    # No stage values in a flat round: a partner that runs a pair round (its
    # view holds only the two of us) is refused them at once.
    await ctx.stages.begin(plan.round, ())
    return await gossip_round(ctx, inputs)
