"""The outer step overlapped (docs/algorithms.md, "The outer step overlapped"):
the outer exchange runs behind the next H local steps and its step lands one
outer step late, with the local steps since kept. In memory, over the worker's
Rounds and real segment servers."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
import torch
from outer_helpers import Worker, job, nothing, wired


sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
# The least-squares problem shared by members, as the bench that prints its distances runs it.
from outer_ls import distances, ls_job  # noqa: E402

# Powers of two, on values with few bits: every fp32 operation below is exact,
# so "the same sequence" can be claimed bit for bit.
DYADIC = "every = 4\nlr = 0.5\nmomentum = 0.5\n"


def dyadic(seed: int, n: int) -> torch.Tensor:
    return torch.round(12 * torch.randn(n, generator=torch.Generator().manual_seed(seed))) / 256


def start_dyadic(w: Worker) -> None:
    with torch.no_grad():
        w.state.flat.vector.copy_(dyadic(0, w.state.gossiped))
        w.state.anchor.copy_(w.state.flat.vector[: w.state.anchor.numel()])


async def rounds_of(workers: list[Worker], view: dict[str, str], rounds: int, record) -> None:
    for r in range(1, rounds + 1):
        for w in workers:
            with torch.no_grad():
                w.state.flat.vector.add_(dyadic(r, w.state.gossiped))  # the same local steps everywhere
        await asyncio.gather(*(w.rounds.next_round(view, nothing) for w in workers))
        record(r, workers)


@pytest.mark.parametrize("mode", ["crossover", "hierarchical"])
async def test_identical_members_take_the_plain_outer_steps_one_outer_step_late(mode):
    """Identical members, identical local steps: after round r the overlapped
    anchor is the plain run's after round r − 1, bit for bit, momentum
    included, and the model is that anchor plus the local steps of round r:
    none of them is thrown away."""
    plain, late = {}, {}

    def keep(into):
        def record(r, workers):
            w = workers[0]
            into[r] = (w.state.anchor.clone(), w.state.outer_momentum.clone(), w.state.flat.vector.clone())
        return record

    for gossip, into in (("", plain), ("overlap = true\n", late)):
        spec = job(mode, outer=DYADIC, gossip=gossip)
        workers = [Worker(k, spec) for k in range(4)]
        for w in workers:
            start_dyadic(w)
        view = wired(workers)
        await rounds_of(workers, view, 6, keep(into))
        for w in workers:
            await w.rounds.aclose()
    n = plain[1][0].numel()
    start = dyadic(0, n)
    for r in range(1, 7):
        anchor, momentum, model = late[r]
        before = plain[r - 1] if r > 1 else (start, torch.zeros(n), None)
        assert torch.equal(anchor, before[0]), r
        assert torch.equal(momentum, before[1]), r
        assert torch.equal(model, anchor + dyadic(r, n)), r
    assert not torch.equal(plain[2][0], plain[1][0])  # the anchors did move


async def test_a_member_alone_steps_by_its_own_change_at_once():
    """Nobody to average with: no exchange in the background, so the outer step
    by the member's own change is taken at the round, as without overlap."""
    spec = job(outer=DYADIC, gossip="overlap = true\n")
    w = Worker(0, spec)
    start = w.state.anchor.clone()
    with torch.no_grad():
        w.state.flat.vector.add_(0.1)
    await w.rounds.next_round({w.id: w.address}, nothing)
    assert torch.allclose(w.state.anchor, start + 0.05 * 1.5, rtol=0, atol=1e-6)  # lr·(Δ + μ·b), b = Δ
    assert torch.equal(w.state.flat.vector, w.state.anchor)
    await w.rounds.aclose()


@pytest.mark.parametrize("wire", ["fp32", "int8"])
async def test_overlapped_outer_steps_solve_least_squares(wire):
    """Four members, each with its own share of the data, 4 local steps per
    round and DiLoCo's outer step (lr 0.7, Nesterov momentum 0.9, the most
    momentum a delay could make oscillate): every member ends near the
    least-squares solution of all the data."""
    [(_, _, farthest)] = await distances(ls_job(wire, True, 4, 0.7, 0.9), [120])
    assert farthest < 0.03  # of the distance at the start


@pytest.mark.parametrize("wire", ["fp32", "int8"])
async def test_frozen_parameters_stay_bit_for_bit_overlapped(wire):
    spec = job(outer="every = 4\n", gossip=f'overlap = true\nwire = "{wire}"\n')
    workers = [Worker(k, spec, seed=k) for k in range(3)]
    for w in workers:
        w.model[0].weight.requires_grad_(False)
    frozen = [w.model[0].weight.detach().clone() for w in workers]
    view = wired(workers, wire)
    for r in range(6):
        for k, w in enumerate(workers):
            w.local_steps(seed=10 * r + k)
            with torch.no_grad():
                w.model[0].weight.copy_(frozen[k])
        await asyncio.gather(*(w.rounds.next_round(view, nothing) for w in workers))
    n = frozen[0].numel()
    for w, before in zip(workers, frozen):
        await w.rounds.finish_in_flight(view)
        assert torch.equal(w.model[0].weight, before)
        assert torch.equal(w.state.anchor[:n], before.view(-1)) and not w.state.outer_momentum[:n].any()
        assert w.state.outer_momentum[n:].abs().sum() > 0
        await w.rounds.aclose()
