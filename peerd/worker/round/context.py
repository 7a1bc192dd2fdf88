"""What a gossip round takes: what every round of the job shares, and what one
round brings.

The round functions (peerd.worker.round.crossover, pair, hierarchy, intrahost_round)
and the dispatcher that picks one (peerd.worker.round.dispatch) take the two bundles
rather than a dozen arguments each: the worker builds the context once
(peerd.worker.round.rounds), and a round run now or in the background
(peerd.worker.round.overlap) differs only in its buffers and deadline.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from peerd.core.groups import GroupPlan
    from peerd.core.robust import PullClipper
    from peerd.core.segments import Span
    from peerd.core.topology import RoundPlan
    from peerd.worker.intrahost.group import IntraHostGroup
    from peerd.worker.round.feedback import ErrorFeedback
    from peerd.worker.wire.stores import StageStore
    from peerd.worker.wire.transport import Transport


@dataclass(frozen=True)
class RoundContext:
    """The same in every round of a job: this peer, how its vector is cut, how it
    reaches partners, where it publishes stage values, its clipping and wire
    dtype (`wire`: a [gossip] wire name), its error feedback (the int8 wire's),
    and its intra-host group (None: the group stage over the transport)."""

    me: str
    layout: list[Span]
    transport: Transport
    stages: StageStore
    clipper: PullClipper | None = None
    wire: str = "fp32"
    intrahost: IntraHostGroup | None = None
    feedback: ErrorFeedback | None = None


@dataclass(frozen=True)
class RoundBuffers:
    """What one round works on: `vector` is this peer's state at the start of the
    round (already published), `recv` scratch for received values, and `out`,
    when given, must hold the whole new state on return (`vector` is then left
    as it was; without `out` the round updates `vector` in place). `deadline_s`
    bounds the exchange."""

    vector: torch.Tensor
    recv: torch.Tensor
    deadline_s: float
    out: torch.Tensor | None = None


@dataclass(frozen=True)
class RoundInputs:
    """One round: its plan, where to reach the peers it was drawn over (this one
    among them: a flat plan over two runs as a pair round, peerd.worker.round.dispatch),
    and its buffers."""

    plan: RoundPlan | GroupPlan
    addresses: dict[str, str]
    buffers: RoundBuffers
