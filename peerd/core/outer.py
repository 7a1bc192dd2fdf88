"""The outer step (docs/algorithms.md, "The outer step"): after a round, SGD
with momentum moves the anchor θ₀ (where every member started the last H
local steps) with the averaged change Δ = θ₀ − θ_avg as its gradient, and the
next local steps start from the result.

Pure arithmetic on the tensors it is handed, op for op as torch.optim.SGD's
single-tensor step computes it (dampening 0, no weight decay), so the two agree
bit for bit; it imports no torch and does no I/O. Which elements it may touch
(not the frozen ones) is `live_spans`; the worker side is
peerd.worker.round.outer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


class OuterRule(Protocol):
    """The outer optimizer's settings ([outer] in the job file)."""

    lr: float
    momentum: float
    nesterov: bool


def describe(every: int, rule: OuterRule) -> str:
    """The outer step in force, as the worker's log, peerctl status and
    check-config say it; "" without one (`every` 0)."""
    if not every:
        return ""
    kind = "Nesterov momentum" if rule.nesterov and rule.momentum else "momentum"
    return f"outer SGD every {every} local steps: lr {rule.lr:g}, {kind} {rule.momentum:g}"


@dataclass(frozen=True)
class OuterSlices:
    """One stretch of the parameters: the anchor θ₀, the round's result θ_avg
    (the model) and the momentum buffer, all of one length."""

    anchor: Any
    model: Any
    momentum: Any


def outer_step(rule: OuterRule, slices: OuterSlices) -> None:
    """In place: the anchor takes the outer step with gradient anchor − model,
    the momentum buffer accumulates it, and the model becomes the new anchor.

    A buffer that starts at zero gives torch's first step exactly (0·μ + Δ = Δ),
    so no "first step" flag has to travel with the state."""
    step_anchor(rule, slices.anchor, slices.momentum, slices.anchor.sub(slices.model))
    slices.model.copy_(slices.anchor)


def step_by_change(rule: OuterRule, anchor: Any, momentum: Any, change: Any) -> None:
    """In place: the anchor steps with gradient −`change`, where `change` is the
    averaged model relative to the anchor (θ_avg − θ₀, as the int8 wire
    averages it: docs/algorithms.md, "The outer step on the int8 wire"). The
    negation is exact, so over identical changes this is torch's step on their
    mean bit for bit."""
    step_anchor(rule, anchor, momentum, change.neg())


def step_anchor(rule: OuterRule, anchor: Any, momentum: Any, grad: Any) -> None:
    """torch.optim.SGD's single-tensor step of `anchor` with gradient `grad`
    (consumed: it may be written)."""
    if rule.momentum != 0:
        momentum.mul_(rule.momentum).add_(grad, alpha=1)
        grad = grad.add(momentum, alpha=rule.momentum) if rule.nesterov else momentum
    anchor.add_(grad, alpha=-rule.lr)


def live_spans(limit: int, frozen: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The element ranges of [0, limit) outside the `frozen` ones (sorted,
    disjoint; those reaching past `limit` are cut there): what the outer step
    may touch."""
    live, start = [], 0
    for a, b in frozen:
        a, b = min(a, limit), min(b, limit)
        if a > start:
            live.append((start, a))
        start = max(start, b)
    if start < limit:
        live.append((start, limit))
    return live
