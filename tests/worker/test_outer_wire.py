"""The outer step on the int8 wire (docs/algorithms.md, "The outer step on the
int8 wire"): the rounds average each member's model relative to its anchor
with error feedback on that change, and every fourth round the anchors; in
memory, over the worker's Rounds and real segment servers on the int8 wire."""

from __future__ import annotations

import pytest
import torch
from outer_helpers import Worker, job, one_round, wired

from peerd.worker.round.changes import ANCHORS_EVERY, anchors_round
from peerd.worker.round.feedback import ErrorFeedback

INT8 = 'wire = "int8"\n'


def owed(w: Worker) -> torch.Tensor:
    """The member's model plus what it still owes the others, in float64."""
    residual = w.rounds.feedback.residual
    return w.state.flat.vector.double() + (0.0 if residual is None else residual.double().to("cpu"))


@pytest.mark.parametrize("outer", ["every = 4\n", "every = 4\nnesterov = false\n", "every = 4\nmomentum = 0\n"])
async def test_identical_members_step_as_torch_sgd_on_what_the_wire_carries_bit_for_bit(outer):
    """Members that make identical changes publish identical values, which the
    int8 wire carries exactly and the rounds average to themselves: each
    anchor is torch's SGD stepped with the rounded change, bit for bit, over
    the change rounds; an anchor round takes the rounded anchor, moves the
    model with it and leaves the momentum to the next change round."""
    spec = job(outer=outer, gossip=INT8)
    workers = [Worker(k, spec) for k in range(3)]
    view = wired(workers, "int8")
    ref = Worker(9, spec)  # computes what every member should publish and hold
    reference = ErrorFeedback(ref.rounds.layout)
    n = ref.state.anchor.numel()
    param = torch.nn.Parameter(ref.state.anchor.clone())
    rule = spec.outer
    opt = torch.optim.SGD([param], lr=rule.lr, momentum=rule.momentum, nesterov=rule.nesterov and rule.momentum != 0)
    model = ref.state.flat.vector
    for r in range(1, 2 * ANCHORS_EVERY + 2):
        for w in workers + [ref]:
            w.local_steps(seed=r, common=100 + r)
        values = model.clone()
        if anchors_round(r):
            values[:n].copy_(param.detach())
            reference.quantise_(values)
            model.add_(values.sub(param.detach()))
            param.data.copy_(values[:n])  # the momentum buffer stays as it is
        else:
            values[:n].sub_(param.detach())
            reference.quantise_(values)
            param.grad = values[:n].neg()
            opt.step()
            model.copy_(param.detach())
        await one_round(workers, view)
        for w in workers:
            assert torch.equal(w.state.anchor, param.detach()), r
            assert torch.equal(w.state.flat.vector, model), r
            assert torch.equal(w.rounds.feedback.residual, reference.residual)
    assert workers[0].rounds.outer.steps == 2 * ANCHORS_EVERY - 1
    for w in workers:
        await w.rounds.aclose()


async def test_a_change_round_rounds_on_the_changes_scale_not_the_models():
    """What a change round leaves owed is within half a step of the change's
    own int8 scale: far below what rounding the models would leave."""
    spec = job(gossip=INT8)
    workers = [Worker(k, spec) for k in range(3)]
    view = wired(workers, "int8")
    for k, w in enumerate(workers):
        w.local_steps(seed=k)  # a change 0.05·N(0, 1) on weights of size ~0.2–0.5
    change = torch.stack([w.state.flat.vector - w.state.anchor for w in workers]).abs().max()
    model = torch.stack([w.state.flat.vector for w in workers]).abs().max()
    assert anchors_round(1) is False
    await one_round(workers, view)
    for w in workers:
        assert w.rounds.feedback.residual.abs().max() <= change / 127 / 2 * 1.001
    assert change / model < 0.5  # the models' step would be twice as large or more
    for w in workers:
        await w.rounds.aclose()


@pytest.mark.parametrize("mode, peers", [("crossover", 4), ("hierarchical", 4)])
async def test_error_feedback_on_the_changes_keeps_the_sum_and_reaches_the_exact_average(mode, peers):
    """lr 1 without momentum: the outer step adopts the round's average, so the
    rounds are plain averaging and the int8 wire's promise holds as without
    the outer step: Σ (x + e) moves by the local changes only, every round,
    and after the local changes stop the models reach the exact average up to
    a few steps, the models plus their residuals to fp32's rounding."""
    spec = job(mode, outer="every = 4\nlr = 1.0\nmomentum = 0\n", gossip=INT8)
    workers = [Worker(k, spec) for k in range(peers)]
    view = wired(workers, "int8")
    total = sum(owed(w) for w in workers)
    scale = total.abs().max() / peers
    for r in range(1, 6 * ANCHORS_EVERY):
        if r <= 2 * ANCHORS_EVERY:
            for k, w in enumerate(workers):
                before = w.state.flat.vector.double()
                w.local_steps(seed=100 * r + k, common=r)
                total += w.state.flat.vector.double() - before
        await one_round(workers, view)
        kept = sum(owed(w) for w in workers)
        assert (kept - total).abs().max() <= 1e-5 * scale, r
    exact = total / peers
    step = exact.abs().max() / 127
    for w in workers:
        assert (w.state.flat.vector.double() - exact).abs().max() <= 3 * step
    assert (sum(owed(w) for w in workers) / peers - exact).abs().max() <= 1e-5 * scale
    for w in workers:
        await w.rounds.aclose()


async def test_without_the_anchor_rounds_the_anchors_do_not_come_together(monkeypatch):
    """Why every fourth round averages the anchors: with changes alone the
    anchors keep the disagreement the first round left, round after round;
    with the anchor rounds it shrinks with each of them."""
    import peerd.worker.round.changes as changes_module

    spec = job(outer="every = 4\nlr = 1.0\nmomentum = 0\n", gossip=INT8)

    async def spread(anchor_rounds: bool) -> float:
        if not anchor_rounds:
            monkeypatch.setattr(changes_module, "anchors_round", lambda r: False)
        workers = [Worker(k, spec) for k in range(4)]
        view = wired(workers, "int8")
        for k, w in enumerate(workers):
            w.local_steps(seed=k)
        for _ in range(4 * ANCHORS_EVERY):
            await one_round(workers, view)
        anchors = torch.stack([w.state.anchor.double() for w in workers])
        for w in workers:
            await w.rounds.aclose()
        monkeypatch.undo()
        return float((anchors - anchors.mean(0)).abs().max())

    with_anchor_rounds, without = await spread(True), await spread(False)
    assert with_anchor_rounds < 0.2 * without  # four anchor rounds, each ~0.6 of the spread (docs)


async def test_frozen_parameters_stay_bit_for_bit_on_the_int8_wire():
    spec = job(gossip=INT8)
    workers = [Worker(k, spec, seed=k) for k in range(3)]
    for w in workers:
        w.model[0].weight.requires_grad_(False)
    frozen = [w.model[0].weight.detach().clone() for w in workers]
    view = wired(workers, "int8")
    for r in range(ANCHORS_EVERY + 1):
        for k, w in enumerate(workers):
            w.local_steps(seed=10 * r + k)
            with torch.no_grad():
                w.model[0].weight.copy_(frozen[k])
        await one_round(workers, view)
    n = frozen[0].numel()
    for w, before in zip(workers, frozen):
        assert torch.equal(w.model[0].weight, before)
        assert torch.equal(w.state.anchor[:n], before.view(-1)) and not w.state.outer_momentum[:n].any()
        assert not w.rounds.feedback.residual[:n].any()
        await w.rounds.aclose()

