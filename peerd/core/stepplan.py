"""What a worker's next local steps train with, decided at each round from the
job's view of the moment (docs/architecture.md, "The path of one gossip round")."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from peerd.core.shares import BatchPlan


@dataclass(frozen=True)
class StepPlan:
    """What the next local steps train with: decided by the engine at a round."""

    members: list[str]  # the peers that serve the job, this one included: the data split
    trainers: int  # how many peers the global batch the LR is scaled for counts: len(members)
    plan: BatchPlan | None  # DBS: each member's batch
    stop: bool = False  # leave now: drained, signalled, or the daemon is gone
    # local data: the serving peers' published data set sizes (0: not known yet), for the weights
    data_sizes: dict[str, int] = field(default_factory=dict)
    terms: dict[str, float] = field(default_factory=dict)  # ... every member's term of the job's clock, ever

    def round_steps(self, peer: str, period: int) -> int:
        """`peer`'s local steps in the next round: `period` ([gossip] period_steps)
        unless the DBS plan gives it fewer (a member slower than the others even
        at the minimum batch)."""
        return self.plan.round_steps(peer, period) if self.plan is not None else period


def own_view(view: Mapping[str, str], me: str, address: str) -> dict[str, str]:
    """The serving peers as the daemon sees them, with this worker among them."""
    return {**view, me: address}


def members_of(view: Mapping[str, str]) -> list[str]:
    """The data is split among the members that serve: one still loading or
    taking the state starts at a chunk boundary past the donor's position, so a
    part kept for it in the chunks before would go unread. The start gate
    ([job] min_peers) makes the first members serve before anyone reads."""
    return sorted(view)


def step_plan(view: Mapping[str, str], batches: BatchPlan | None, stop: bool, data_sizes: Mapping[str, int],
              terms: Mapping[str, float]) -> StepPlan:
    """The plan from `view` (own_view), the DBS `batches` planned over its
    members, and the serving peers' published data set sizes and clock terms."""
    sizes = {p: data_sizes.get(p, 0) for p in view}
    return StepPlan(members_of(view), len(view), batches, stop, sizes, dict(terms))
