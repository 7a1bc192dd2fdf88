"""The outer step on the worker (docs/algorithms.md, "The outer step"): after
each real round (the worker's Rounds over the in-memory transport) the anchor
takes the outer SGD step and the model starts from it; frozen parameters stay
bit for bit; the anchor and the momentum buffer travel in the training state
(to a newcomer, through a checkpoint, to a resumed worker)."""

from __future__ import annotations

import pytest
import torch
from outer_helpers import Worker, job, one_round, wired

from peerd.core.outer import OuterSlices, describe, outer_step
from peerd.worker.round.outer import OuterStep
from peerd.worker.state.checkpoint import CheckpointDir
from peerd.worker.state.pull import StateMeta


async def test_a_pair_round_then_the_outer_step_of_the_exact_average():
    """Two members: the round is the exact average, so each one's new anchor is
    the outer step of the shared anchor by the mean of the two changes, and
    momentum from the first outer step carries into the second."""
    spec = job()
    workers = [Worker(k, spec) for k in range(2)]
    view = wired(workers)
    anchor, momentum = workers[0].state.anchor.clone(), torch.zeros_like(workers[0].state.anchor)
    for r in range(2):
        for k, w in enumerate(workers):
            w.local_steps(seed=10 * r + k)
        mixed = (workers[0].state.flat.vector + workers[1].state.flat.vector) / 2
        await one_round(workers, view)
        outer_step(spec.outer, OuterSlices(anchor, mixed, momentum))
        for w in workers:
            assert torch.allclose(w.state.anchor, anchor, rtol=0, atol=1e-6)
            assert torch.equal(w.state.flat.vector, w.state.anchor)  # the next local steps start there
            assert torch.allclose(w.state.outer_momentum, momentum, rtol=0, atol=1e-6)
    assert workers[0].rounds.outer.steps == 2
    for w in workers:
        await w.rounds.aclose()


@pytest.mark.parametrize("mode, peers", [("crossover", 3), ("hierarchical", 4), ("whole", 3)])
async def test_every_kind_of_round_is_followed_by_the_outer_step(mode, peers):
    """The rounds run as without the outer step; after each, every member's model
    is its anchor, and the anchors, which started equal, stay close together:
    far closer than the way they moved together."""
    spec = job(mode)
    workers = [Worker(k, spec) for k in range(peers)]
    view = wired(workers)
    start = workers[0].state.anchor.clone()
    for r in range(4):
        for k, w in enumerate(workers):
            w.local_steps(seed=100 * r + k, common=r)
        await one_round(workers, view)
    moved = (workers[0].state.anchor - start).norm()
    for w in workers:
        assert torch.equal(w.state.flat.vector, w.state.anchor)
        assert w.state.outer_momentum.abs().sum() > 0
        assert (w.state.anchor - workers[0].state.anchor).norm() < 0.1 * moved
        await w.rounds.aclose()


async def test_frozen_parameters_stay_bit_for_bit_and_their_anchor_follows_them():
    spec = job()
    workers = [Worker(k, spec, seed=k) for k in range(3)]  # different models: an average changes everything
    for w in workers:
        w.model[0].weight.requires_grad_(False)  # frozen after attach: in the vector, kept
    frozen = [w.model[0].weight.detach().clone() for w in workers]
    view = wired(workers)
    for r in range(3):
        for k, w in enumerate(workers):
            w.local_steps(seed=10 * r + k)
            with torch.no_grad():
                w.model[0].weight.copy_(frozen[k])  # the training leaves it alone
        await one_round(workers, view)
    n = frozen[0].numel()
    for w, before in zip(workers, frozen):
        assert torch.equal(w.model[0].weight, before)
        assert torch.equal(w.state.anchor[:n], before.view(-1)) and not w.state.outer_momentum[:n].any()
        assert w.state.outer_momentum[n:].abs().sum() > 0  # the rest took outer steps
        await w.rounds.aclose()


async def test_moments_averaged_with_the_parameters_keep_the_rounds_plain_average():
    """average_optimizer_state: the optimizer's moments follow the parameters in
    the gossiped vector; the outer step moves the parameters only, so a pair
    round leaves the moments at the exact average, as without it."""
    spec = job(gossip="average_optimizer_state = true\n")
    workers = [Worker(k, spec, seed=k) for k in range(2)]
    n = sum(p.numel() for p in workers[0].model.parameters())
    assert workers[0].state.gossiped == 2 * n and workers[0].state.anchor.numel() == n
    for k, w in enumerate(workers):
        w.local_steps(seed=k)
    moments = (workers[0].state.flat.vector[n:] + workers[1].state.flat.vector[n:]) / 2
    await one_round(workers, wired(workers))
    for w in workers:
        assert torch.allclose(w.state.flat.vector[n:], moments, rtol=0, atol=1e-7)  # lerp's rounding aside
        assert torch.equal(w.state.flat.vector[:n], w.state.anchor)
        await w.rounds.aclose()


def test_the_anchor_and_momentum_are_in_the_state_and_its_fingerprint():
    with_outer, without = Worker(0, job()), Worker(0, job(outer="every = 0\n"))
    n = without.state.gossiped
    assert with_outer.state.numel == without.state.numel + 2 * n
    assert with_outer.state.names[-2:] == ["outer.anchor", "outer.momentum"]
    assert with_outer.state.fingerprint("spec") != without.state.fingerprint("spec")
    assert without.rounds.outer is None and without.state.anchor is None
    with pytest.raises(ValueError, match="outer=True"):
        OuterStep(job().outer, without.state)


async def test_a_newcomer_and_a_resumed_worker_take_the_anchor_and_momentum(tmp_path):
    """A donor after two outer steps; its state goes to a newcomer as a pull
    does (vector and extra) and through a checkpoint to a resumed worker: both
    hold its anchor and momentum, bit for bit, and step on as it does."""
    spec = job()
    donors = [Worker(k, spec) for k in range(2)]
    view = wired(donors)
    for r in range(2):
        for k, w in enumerate(donors):
            w.local_steps(seed=10 * r + k)
        await one_round(donors, view)
    donor = donors[0].state
    assert donor.outer_momentum.abs().sum() > 0
    checkpoints = CheckpointDir(tmp_path / "checkpoints", "outer", donor.fingerprint("spec"), donor.numel)
    checkpoints.save(StateMeta(2, 8, 0.5, donor.extra()), donor.vector())
    loaded = checkpoints.load_newest()
    for vector, extra in ((donor.vector(), donor.extra()), (loaded.vector, loaded.meta.extra)):
        taker = Worker(5, spec, seed=7)  # a model of its own until it takes the state
        taker.state.adopt(vector, extra)
        assert torch.equal(taker.state.anchor, donor.anchor)
        assert torch.equal(taker.state.outer_momentum, donor.outer_momentum)
        assert torch.equal(taker.state.flat.vector, donor.flat.vector)
        # ... and its next outer step is the donor's, from the same round's model.
        twin = Worker(6, spec, seed=7)
        twin.state.adopt(donor.vector(), donor.extra())
        for w in (taker, twin):
            w.local_steps(seed=99)
            w.rounds.outer.step()
        assert torch.equal(taker.state.anchor, twin.state.anchor)
    for w in donors:
        await w.rounds.aclose()


def test_the_log_line_says_which_outer_step_is_in_force():
    def said(outer: str) -> str:
        spec = job(outer=outer).outer
        return describe(spec.every, spec)

    assert said("every = 4\n") == "outer SGD every 4 local steps: lr 0.7, Nesterov momentum 0.5"
    assert said("every = 8\nlr = 0.5\nmomentum = 0.8\nnesterov = false\n") == \
        "outer SGD every 8 local steps: lr 0.5, momentum 0.8"
    assert said("every = 8\nmomentum = 0\n") == "outer SGD every 8 local steps: lr 0.7, momentum 0"
    assert said("every = 0\n") == ""
