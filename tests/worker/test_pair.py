"""Flat crossover between two peers as a pair round (peerd.worker.round.pair): each
averages half the segments and takes the other half from its partner. It must
give exactly what gossip_round gives, over real sockets on 127.0.0.1, keep
flat crossover's rule for failures, and never let a partner read the new
state once the round is over."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch

from peerd.core.robust import PullClipper
from peerd.core.topology import plan_round
from peerd.worker.round.crossover import gossip_round
from peerd.worker.round.pair import fits, owned_by, pair_round
from peerd.worker.wire.transport import MemoryTransport

from hierarchy_helpers import PoisonedStages, make_peers, served

PAIR = {"a": (), "b": ()}


async def _publish(peer, round_: int, hand_over: bool):
    """As the worker does: the vector handed over (a model on the CPU) or copied."""
    if hand_over:
        return await peer.store.hand_over(round_, peer.vector)
    await peer.store.publish(round_, peer.vector)
    return None


async def _pair_round(peers, addresses, transports, round_=1, hand_over=True, deadline_s=10.0, run=None):
    """Both peers (or those in `run`) run the pair round; each one's vector becomes its new state."""
    run = run or list(peers)
    intos = {p: await _publish(peers[p], round_, hand_over) for p in run}

    async def one(p):
        peer = peers[p]
        plan = plan_round("job", round_, sorted(addresses), p, len(peer.layout))
        result = await pair_round(peer.context(transports[p]), peer.inputs(plan, addresses, deadline_s, intos[p]))
        if intos[p] is not None:
            peer.vector = intos[p]
        return result

    return dict(zip(run, await asyncio.gather(*(one(p) for p in run))))


async def _flat_round(peers, addresses, transports, round_=1):
    for peer in peers.values():
        await peer.store.publish(round_, peer.vector)
    results = await asyncio.gather(*(
        gossip_round(peer.context(transports[p]),
                     peer.inputs(plan_round("job", round_, sorted(addresses), p, len(peer.layout)), addresses, 10.0))
        for p, peer in peers.items()))
    return dict(zip(peers, results))


def test_it_is_used_only_where_it_gives_flat_crossover_exactly():
    assert fits(2, 8, "fp32", None) and fits(2, 2, "fp32", PullClipper(0.0))
    assert not fits(3, 8, "fp32", None)  # more peers: sources differ by segment
    assert not fits(2, 1, "fp32", None)  # whole-model gossip: one owner would do all
    assert not fits(2, 8, "bf16", None) and not fits(2, 8, "int8", None)  # the other would get the rounded average
    assert not fits(2, 8, "fp32", PullClipper(3.0))  # each peer clips what it sees
    assert owned_by("a", "b", 5) == [0, 2, 4] and owned_by("b", "a", 5) == [1, 3]


@pytest.mark.parametrize("hand_over", [False, True])
async def test_a_pair_round_gives_the_bits_of_a_flat_round(hand_over):
    flat, pair = make_peers(PAIR), make_peers(PAIR)
    async with served(flat) as (addresses, transports):
        expected = await _flat_round(flat, addresses, transports)
    async with served(pair) as (addresses, transports):
        results = await _pair_round(pair, addresses, transports, hand_over=hand_over)
        again = await _pair_round(pair, addresses, transports, round_=2, hand_over=hand_over)
    for p in PAIR:
        assert results[p].misses == 0 and results[p].reached == {"b" if p == "a" else "a"}
        assert results[p].disagreement == pytest.approx(expected[p].disagreement, rel=1e-3)
        assert again[p].misses == 0
    # after two rounds both hold the first round's average, to the bit
    assert torch.equal(pair["a"].vector, flat["a"].vector) and torch.equal(pair["b"].vector, flat["a"].vector)
    assert torch.equal(flat["a"].vector, flat["b"].vector)


@pytest.mark.parametrize("hand_over", [False, True])
async def test_a_pair_round_without_its_partner_keeps_the_own_values(hand_over):
    peers = make_peers(PAIR)
    before = peers["a"].vector.clone()
    transport = MemoryTransport(peers["a"].identity, {"mem-a": peers["a"].server})  # b is gone
    results = await _pair_round(peers, {"a": "mem-a", "b": "mem-b"}, {"a": transport}, hand_over=hand_over,
                                run=["a"])
    assert results["a"].misses == len(peers["a"].layout) and "b" in results["a"].unreachable
    assert torch.equal(peers["a"].vector, before)


async def test_a_partner_in_a_flat_round_refuses_the_averages_at_once():
    """Views that differ: a sees only b (pair round), b sees a third peer (flat
    round, which holds no stage values). a keeps its own values for the
    segments b would have averaged, refused rather than left to the deadline."""
    peers = make_peers(PAIR)
    a, b = peers["a"], peers["b"]
    before = a.vector.clone()
    servers = {"mem-a": a.server, "mem-b": b.server}
    transports = {p: MemoryTransport(peers[p].identity, servers) for p in peers}
    await b.store.publish(1, b.vector)
    await b.stages.begin(1, ())  # what Rounds does before a flat round
    results = await _pair_round(peers, {"a": "mem-a", "b": "mem-b"}, transports, run=["a"], deadline_s=30.0)
    mine = owned_by("a", "b", len(a.layout))
    assert results["a"].misses == len(a.layout) - len(mine)
    assert "not owned here" in results["a"].errors["b"] and "b" not in results["a"].unreachable
    for s, span in enumerate(a.layout):
        got, own = a.vector[span.start : span.stop], before[span.start : span.stop]
        if s in mine:
            assert torch.equal(got, torch.lerp(own, b.vector[span.start : span.stop], 0.5))
        else:
            assert torch.equal(got, own)


@pytest.mark.parametrize("stage", [0, 2])
async def test_a_poisoned_partner_leaves_the_segments_concerned_at_the_own_values(stage):
    """b sends an infinity in its snapshot (stage 0: a, the owner, refuses it
    and tells b it has no average) or a NaN in the averages it lends (stage 2:
    a's bulk lane refuses them)."""
    peers = make_peers(PAIR)
    a, b = peers["a"], peers["b"]
    if stage == 0:
        b.vector[a.layout[0].start + 3] = math.inf  # segment 0: a's
    else:
        b.stages = b.server.stages = PoisonedStages(2)
    before = {p: peer.vector.clone() for p, peer in peers.items()}
    async with served(peers) as (addresses, transports):
        results = await _pair_round(peers, addresses, transports)
    mine = owned_by("a", "b", len(a.layout))
    assert "non-finite" in results["a"].errors["b"]
    # The round's own refusal (stage 0) is for the engine to count; the lane counts stage 2's.
    assert ("b" in results["a"].non_finite) == (stage == 0)
    for s, span in enumerate(a.layout):
        cut = slice(span.start, span.stop)
        if stage == 0 and s == 0:  # neither has an average: both keep their own
            assert torch.equal(a.vector[cut], before["a"][cut]) and torch.equal(b.vector[cut], before["b"][cut])
            assert results["b"].misses == 1 and "not computed" in results["b"].errors["a"]
        elif stage == 2 and s not in mine:  # b's averages, poisoned on the wire: a keeps its own
            assert torch.equal(a.vector[cut], before["a"][cut])
        else:
            assert torch.equal(a.vector[cut], torch.lerp(before["a"][cut], before["b"][cut], 0.5))
    assert torch.isfinite(a.vector).all()


async def test_a_cancelled_pair_round_leaves_no_step_behind():
    """A round given up is cancelled (an overlapped round past its grace): none of
    its fetches outlives it, to write into buffers the next round uses."""
    peers = make_peers(PAIR)  # b never publishes: a's steps wait
    a = peers["a"]
    transport = MemoryTransport(a.identity, {"mem-a": a.server, "mem-b": peers["b"].server})
    await a.store.publish(1, a.vector)
    before = asyncio.all_tasks()
    plan = plan_round("job", 1, sorted(PAIR), "a", len(a.layout))
    inputs = a.inputs(plan, {"a": "mem-a", "b": "mem-b"}, 30.0, torch.empty(a.vector.numel()))
    task = asyncio.create_task(pair_round(a.context(transport), inputs))
    await asyncio.sleep(0.1)
    assert len(asyncio.all_tasks() - before) > 1  # the round and its steps
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await asyncio.sleep(0)
    assert asyncio.all_tasks() - before == set()
