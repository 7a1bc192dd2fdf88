"""peerd.core.outer: the outer step against torch.optim.SGD, bit for bit, and
the ranges it may touch (docs/algorithms.md, "The outer step")."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from peerd.core.outer import OuterSlices, live_spans, outer_step, step_by_change

FAST = settings(max_examples=60, deadline=None)


@dataclass(frozen=True)
class Rule:
    lr: float = 0.7
    momentum: float = 0.9
    nesterov: bool = True


class Member:
    """One member's outer state in memory: its anchor, model and momentum buffer."""

    def __init__(self, anchor: torch.Tensor) -> None:
        self.anchor, self.model, self.momentum = anchor.clone(), anchor.clone(), torch.zeros_like(anchor)

    def step(self, rule: Rule) -> None:
        outer_step(rule, OuterSlices(self.anchor, self.model, self.momentum))


def torch_sgd(anchor: torch.Tensor, rule: Rule) -> tuple[torch.nn.Parameter, torch.optim.SGD]:
    """torch's SGD for `rule` (which refuses Nesterov without momentum: then plain SGD, as the outer step does)."""
    param = torch.nn.Parameter(anchor.clone())
    return param, torch.optim.SGD([param], lr=rule.lr, momentum=rule.momentum,
                                  nesterov=rule.nesterov and rule.momentum != 0)


def torch_step(param: torch.nn.Parameter, opt: torch.optim.SGD, mean_change: torch.Tensor) -> None:
    param.grad = mean_change.clone()
    opt.step()


@pytest.mark.parametrize("rule", [Rule(), Rule(nesterov=False), Rule(momentum=0.0), Rule(lr=1.0, momentum=0.5)])
@pytest.mark.parametrize("members", [2, 3, 4])
def test_identical_changes_step_as_torch_sgd_on_their_mean_bit_for_bit(rule, members):
    """Every member moved its model by the same change: the round's average is
    that model, and each member's outer step is torch's SGD step on the mean
    change, over several outer steps (momentum accumulates as torch's does)."""
    gen = torch.Generator().manual_seed(members)
    start = torch.randn(1000, generator=gen)
    group = [Member(start) for _ in range(members)]
    param, opt = torch_sgd(start, rule)
    for _ in range(5):
        change = 0.01 * torch.randn(1000, generator=gen)
        for m in group:
            m.model.sub_(change)  # H local steps, the same on every member
        mixed = group[0].model.clone()  # the average of identical models
        assert all(torch.equal(m.model, mixed) for m in group)
        for m in group:
            m.step(rule)
        torch_step(param, opt, param.detach() - mixed)  # the mean change as each member sees it
        for m in group:
            assert torch.equal(m.anchor, param.detach()) and torch.equal(m.model, m.anchor)
            if rule.momentum:
                assert torch.equal(m.momentum, opt.state[param]["momentum_buffer"])
            else:
                assert not m.momentum.any()


@pytest.mark.parametrize("rule", [Rule(), Rule(nesterov=False), Rule(momentum=0.0), Rule(lr=1.0, momentum=0.5)])
def test_a_step_by_the_averaged_change_is_torch_sgd_on_it_bit_for_bit(rule):
    """On the int8 wire the rounds average θ − θ₀: over identical changes the
    average is that change, and the anchor's step by it is torch's SGD step
    with the mean change θ₀ − θ_avg = −(θ − θ₀) as its gradient, bit for bit."""
    gen = torch.Generator().manual_seed(3)
    start = torch.randn(1000, generator=gen)
    anchor, momentum = start.clone(), torch.zeros(1000)
    param, opt = torch_sgd(start, rule)
    for _ in range(5):
        change = 0.01 * torch.randn(1000, generator=gen)
        mixed = torch.lerp(change, change, 0.5)  # the round over identical changes
        assert torch.equal(mixed, change)
        step_by_change(rule, anchor, momentum, mixed)
        torch_step(param, opt, change.neg())
        assert torch.equal(anchor, param.detach())


@FAST
@given(lr=st.floats(0.01, 2.0), momentum=st.floats(0.0, 0.99), nesterov=st.booleans(),
       seed=st.integers(0, 2**31 - 1), steps=st.integers(1, 6))
def test_any_changes_step_as_torch_sgd_with_the_averaged_change(lr, momentum, nesterov, seed, steps):
    """Different changes: the outer gradient is the anchor minus the averaged
    models; the anchor, the model and the buffer follow torch's SGD exactly."""
    rule = Rule(lr, momentum, nesterov)
    gen = torch.Generator().manual_seed(seed)
    member = Member(torch.randn(64, generator=gen))
    param, opt = torch_sgd(member.anchor, rule)
    for _ in range(steps):
        models = [member.anchor - 0.05 * torch.randn(64, generator=gen) for _ in range(3)]
        member.model.copy_(torch.stack(models).mean(0))  # what a round leaves here
        torch_step(param, opt, param.detach() - member.model)
        member.step(rule)
        assert torch.equal(member.anchor, param.detach()) and torch.equal(member.model, member.anchor)
        if momentum:
            assert torch.equal(member.momentum, opt.state[param]["momentum_buffer"])


def test_momentum_carries_the_last_change_into_the_next_step():
    """With momentum the anchor keeps moving when the next round brings no change."""
    member = Member(torch.zeros(4))
    member.model.fill_(-1.0)  # a change of +1 everywhere
    member.step(Rule(lr=1.0, momentum=0.5, nesterov=False))
    assert torch.equal(member.anchor, torch.full((4,), -1.0))
    member.step(Rule(lr=1.0, momentum=0.5, nesterov=False))  # no change since
    assert torch.equal(member.anchor, torch.full((4,), -1.5)) and torch.equal(member.momentum, torch.full((4,), 0.5))


def test_a_slice_steps_alone():
    """The worker steps the parameters outside frozen ranges slice by slice: a
    slice stepped alone equals the same elements of the whole stepped."""
    rule = Rule()
    whole, part = Member(torch.arange(10.0)), Member(torch.arange(10.0))
    for m in (whole, part):
        m.model.sub_(torch.linspace(0, 1, 10))
    whole.step(rule)
    outer_step(rule, OuterSlices(part.anchor[3:7], part.model[3:7], part.momentum[3:7]))
    assert torch.equal(part.anchor[3:7], whole.anchor[3:7]) and torch.equal(part.model[3:7], whole.model[3:7])
    assert torch.equal(part.anchor[:3], torch.arange(3.0)) and not part.momentum[:3].any()


@st.composite
def frozen_spans(draw):
    cuts = sorted(set(draw(st.lists(st.integers(0, 120), max_size=10))))
    pairs = list(zip(cuts[::2], cuts[1::2]))
    return [(a, b) for a, b in pairs if a < b]


@FAST
@given(limit=st.integers(0, 100), frozen=frozen_spans())
def test_live_spans_are_exactly_the_elements_not_frozen(limit, frozen):
    live = live_spans(limit, frozen)
    covered = [i for a, b in live for i in range(a, b)]
    assert covered == sorted(set(covered))  # disjoint, in order
    assert all(a < b for a, b in live)
    assert set(covered) == set(range(limit)) - {i for a, b in frozen for i in range(a, b)}


def test_live_spans_examples():
    assert live_spans(10, []) == [(0, 10)]
    assert live_spans(10, [(0, 3), (5, 6)]) == [(3, 5), (6, 10)]
    assert live_spans(10, [(8, 20)]) == [(0, 8)]
    assert live_spans(10, [(0, 10)]) == []
