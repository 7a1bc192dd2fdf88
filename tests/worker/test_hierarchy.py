"""Hierarchical crossover rounds between in-process workers, and over gRPC."""

from __future__ import annotations

import asyncio

import pytest
import torch

from peerd.core.groups import plan_hierarchical
from peerd.worker.round.hierarchy import hierarchical_round
from peerd.worker.wire.server import start_exchange_server
from peerd.worker.wire.transport import GrpcTransport, MemoryTransport
from peerd.worker.state.pull import StateBoard, StateServer

from hierarchy_helpers import CHUNK, NUMEL, SEGMENTS, VIEW, make_peers


def expected_after(peers, view, round_):
    """What the round should give, from the plans alone: in-group means mixed
    with the partner group's mean by the plan's weight."""
    out = {}
    for p, peer in peers.items():
        plan = plan_hierarchical("job", round_, view, p, SEGMENTS, 3)
        value = torch.empty(NUMEL)
        for s, span in enumerate(peer.layout):
            def mean(group):
                return torch.stack([peers[q].vector[span.start : span.stop] for q in group]).mean(0)
            mixed = mean(plan.group)
            source = plan_hierarchical("job", round_, view, plan.owners[s], SEGMENTS, 3).sources[s]
            if source is not None:
                partner = next(g for g in plan.groups if source in g)
                mixed = (1 - plan.weight) * mixed + plan.weight * mean(partner)
            value[span.start : span.stop] = mixed
        out[p] = value
    return out


async def run_round(peers, view, round_, alive=None, hand_over=False):
    alive = set(alive or peers)
    servers = {f"mem-{p}": peers[p].server for p in alive}
    addresses = {p: f"mem-{p}" for p in view}
    return dict(zip(sorted(alive), await asyncio.gather(*(
        peers[p].round(round_, view, addresses, MemoryTransport(peers[p].identity, servers), hand_over=hand_over)
        for p in sorted(alive)))))


@pytest.mark.parametrize("hand_over", [False, True])
async def test_round_applies_the_planned_mixing_and_keeps_the_mean(hand_over):
    peers = make_peers(VIEW)
    mean_before = torch.stack([p.vector for p in peers.values()]).mean(0)
    expected = expected_after(peers, VIEW, 4)
    results = await run_round(peers, VIEW, 4, hand_over=hand_over)
    assert all(r.misses == 0 for r in results.values())
    for p, peer in peers.items():
        torch.testing.assert_close(peer.vector, expected[p])
    torch.testing.assert_close(torch.stack([p.vector for p in peers.values()]).mean(0), mean_before)


async def test_unequal_groups_keep_the_mean():
    view = {f"p{k}": () for k in range(7)}  # groups of 3, 2, 2 at random
    peers = make_peers(view)
    mean_before = torch.stack([p.vector for p in peers.values()]).mean(0)
    for round_ in range(3):
        await run_round(peers, view, round_)
    torch.testing.assert_close(torch.stack([p.vector for p in peers.values()]).mean(0), mean_before)
    spread = torch.stack([p.vector for p in peers.values()]).std(0).mean()
    assert spread < 0.3  # started at ~1: the rounds mixed


@pytest.mark.parametrize("hand_over", [False, True])
async def test_a_dead_member_costs_only_its_own_segments(hand_over):
    peers = make_peers(VIEW)
    before = {p: peer.vector.clone() for p, peer in peers.items()}
    dead = "a2"
    results = await run_round(peers, VIEW, 2, alive=set(VIEW) - {dead}, hand_over=hand_over)
    plan = plan_hierarchical("job", 2, VIEW, "a1", SEGMENTS, 3)
    lost = set(plan.owned_by(dead))
    assert lost
    for p in plan.group:
        if p == dead:
            continue
        assert dead in results[p].unreachable
        for s, span in enumerate(peers[p].layout):
            same = torch.equal(peers[p].vector[span.start : span.stop], before[p][span.start : span.stop])
            assert same == (s in lost), (p, s)


async def test_round_over_grpc_with_bf16_on_the_wire():
    peers = make_peers(VIEW, wire="bf16")
    expected = expected_after(peers, VIEW, 1)
    servers, addresses = [], {}
    try:
        for p, peer in peers.items():
            state = StateServer(peer.identity, StateBoard(2 * NUMEL, NUMEL), peer.store, CHUNK)
            server, address = await start_exchange_server(peer.server, state, "127.0.0.1")
            servers.append(server)
            addresses[p] = address
        transports = {p: GrpcTransport(peers[p].identity, wire="bf16") for p in peers}
        results = await asyncio.gather(*(peers[p].round(1, VIEW, addresses, transports[p]) for p in peers))
        assert all(r.misses == 0 for r in results)
        for p, peer in peers.items():
            # bf16 keeps 8 bits of mantissa: ~0.4 % relative error per value sent
            torch.testing.assert_close(peer.vector, expected[p], atol=0.05, rtol=0.02)
        await asyncio.gather(*(t.aclose() for t in transports.values()))
    finally:
        await asyncio.gather(*(s.stop(None) for s in servers))


@pytest.mark.parametrize("wire", ["fp16", "bf16"])
async def test_narrow_wire_rounds_values_but_averages_in_fp32(wire):
    view = {"x": (), "y": ()}
    peers = make_peers(view, wire=wire)
    results = await run_round_with_wire(peers, view, wire)
    assert all(r.misses == 0 for r in results.values())
    assert peers["x"].vector.dtype == torch.float32
    diff = (peers["x"].vector - peers["y"].vector).abs().max()
    assert 0 < diff < 0.05  # each kept its own fp32 value and got the other's rounded one


async def run_round_with_wire(peers, view, wire):
    servers = {f"mem-{p}": peers[p].server for p in peers}
    addresses = {p: f"mem-{p}" for p in view}
    results = await asyncio.gather(*(
        peers[p].round(0, view, addresses, MemoryTransport(peers[p].identity, servers, wire=wire))
        for p in sorted(peers)))
    return dict(zip(sorted(peers), results))


@pytest.mark.parametrize("hand_over", [False, True])
async def test_views_that_differ_by_one_peer_finish_within_the_deadline(hand_over):
    """Half the peers still count a peer that left; nobody waits past the deadline
    (with hand_over, owners wait for their lent values' reads before returning)."""
    full = {f"p{k}": () for k in range(6)}
    smaller = {p: loc for p, loc in full.items() if p != "p5"}
    peers = make_peers(full)
    servers = {f"mem-{p}": peers[p].server for p in smaller}  # p5 is gone
    addresses = {p: f"mem-{p}" for p in full}
    deadline = 1.0

    async def one(p, view):
        transport = MemoryTransport(peers[p].identity, servers)
        return await asyncio.wait_for(peers[p].round(7, view, addresses, transport, deadline, hand_over), 3 * deadline)

    views = {p: (full if p in ("p0", "p1") else smaller) for p in smaller}
    results = await asyncio.gather(*(one(p, v) for p, v in views.items()))
    assert all(r.seconds <= deadline + 0.5 for r in results)
    for p in smaller:  # every value is still a convex mix: nothing blew up or went missing
        assert torch.isfinite(peers[p].vector).all()


async def test_with_a_narrow_wire_a_group_agrees_exactly():
    """Owners keep their mixed value rounded like the one their members receive."""
    view = {"x": (), "y": ()}  # one group of 2: the round is an all-reduce
    peers = make_peers(view, wire="bf16")
    servers = {f"mem-{p}": peers[p].server for p in peers}
    addresses = {p: f"mem-{p}" for p in view}

    async def one(p):
        peer = peers[p]
        await peer.store.publish(0, peer.vector)
        plan = plan_hierarchical("job", 0, view, p, SEGMENTS, 3)
        return await hierarchical_round(peer.context(MemoryTransport(peer.identity, servers, wire="bf16"),
                                                     "bf16"), peer.inputs(plan, addresses))

    results = await asyncio.gather(one("x"), one("y"))
    assert all(r.misses == 0 for r in results)
    assert torch.equal(peers["x"].vector, peers["y"].vector)


async def test_a_member_that_comes_late_gets_the_owners_values_after_their_states_moved_on():
    """Owners lend their results from their new states and take them back before
    their rounds return; a member that reads only then gets the same values from
    a copy, never what the owners wrote into their states afterwards."""
    view = {"x": (), "y": (), "z": ()}  # one group of 3
    peers = make_peers(view)
    servers = {f"mem-{p}": peers[p].server for p in peers}
    addresses = {p: f"mem-{p}" for p in view}
    late = peers["z"]
    await late.store.publish(0, late.vector)  # its snapshot is there, its round comes later
    expected = torch.stack([p.vector for p in peers.values()]).mean(0)
    early = await asyncio.gather(*(peers[p].round(0, view, addresses, MemoryTransport(peers[p].identity, servers),
                                                  deadline_s=0.5, hand_over=True) for p in ("x", "y")))
    assert all(r.misses == len(peers["x"].layout) // 3 for r in early)  # z's segments: z never served them
    for p in ("x", "y"):
        peers[p].vector.fill_(float("nan"))  # they train on: their new states change
    plan = plan_hierarchical("job", 0, view, "z", SEGMENTS, 3)
    result = await hierarchical_round(late.context(MemoryTransport(late.identity, servers)),
                                      late.inputs(plan, addresses))
    assert result.misses == 0
    for s, span in enumerate(late.layout):
        if plan.owners[s] != "z":
            torch.testing.assert_close(late.vector[span.start : span.stop], expected[span.start : span.stop])
