"""The end consensus by parts among N members: over real sockets on
127.0.0.1, and in memory where a test needs one link to fail one way."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

import pytest
import torch

from peerd.core.consensus import plan_consensus
from peerd.core.endplan import EndPlan, part_traffic
from peerd.core.segments import Span, split_even
from peerd.errors import PeerUnavailable
from peerd.security.auth import Authenticator
from peerd.worker.state.consensus import Patience, mean_of
from peerd.worker.state.endparts import FinalVector, end_consensus
from peerd.worker.state.finalmodel import encode_ints
from peerd.worker.state.pull import StateBoard, StateServer
from peerd.worker.wire.server import start_exchange_server
from peerd.worker.wire.stores import FinalStore, Identity, SegmentServer, SnapshotStore
from peerd.worker.wire.traffic import CountingSegmentServer, CountingTransport, Traffic
from peerd.worker.wire.transport import GrpcTransport, MemoryTransport
from peerd.worker.wire.values import FINAL_MEAN_STAGE

from conftest import until

NUMEL = 20_011  # not a multiple of the number of parts
TAIL = 8  # two integer buffers, four pieces each
SEGMENTS = 5
CHUNK = 1000


class Member:
    def __init__(self, peer_id: str, seed: int) -> None:
        self.id = peer_id
        self.identity = Identity("job", "fp", peer_id)
        gen = torch.Generator().manual_seed(seed)
        values = torch.randn(NUMEL, generator=gen) * (seed + 1)
        values[:100] = 0.1  # a frozen parameter: the same on every member
        values[-TAIL:] = encode_ints(torch.tensor([seed * 7, 1000 - seed]))
        layout = [*split_even(NUMEL - TAIL, SEGMENTS), Span(NUMEL - TAIL, NUMEL)]
        self.own = FinalVector(values, layout, TAIL)
        self.final = FinalStore()
        self.traffic = Traffic()
        self.store = SnapshotStore(NUMEL)
        self.server = CountingSegmentServer(
            SegmentServer(self.identity, self.store, SEGMENTS, CHUNK, final=self.final), self.traffic)

    async def conclude(self, addresses: dict[str, str], transport, timeout: float = 10.0,
                       patience: Patience | None = None):
        return await end_consensus(self.id, self.own, self.final, addresses, transport, timeout, patience)


def members(n: int) -> list[Member]:
    return [Member(f"p{k}", k) for k in range(n)]


def reference(group: list[Member]) -> torch.Tensor:
    """What pulling every whole model gives for this set (peerd.worker.state.consensus)."""
    models = {m.id: m.own.values for m in group}
    return mean_of(plan_consensus(group[0].id, models), models, TAIL)


@asynccontextmanager
async def over_sockets(group: list[Member], bulk: bool = True, secrets: dict[str, bytes] | None = None):
    """Each member served on 127.0.0.1, with a counting transport of its own."""
    secrets = secrets or {}
    servers, addresses, transports = {}, {}, {}
    try:
        for m in group:
            auth = Authenticator(secrets[m.id]) if m.id in secrets else None
            state = StateServer(m.identity, StateBoard(NUMEL, NUMEL), m.store, CHUNK)
            servers[m.id], addresses[m.id] = await start_exchange_server(m.server, state, "127.0.0.1", bulk=bulk,
                                                                         auth=auth)
            transports[m.id] = CountingTransport(GrpcTransport(m.identity, auth, bulk=bulk), m.traffic)
        yield addresses, transports, servers
    finally:
        for t in transports.values():
            await t.aclose()
        for s in servers.values():
            await s.stop(grace=None)


def in_memory(group: list[Member], wrap=None):
    servers = {f"mem-{m.id}": m.server for m in group}
    addresses = {m.id: f"mem-{m.id}" for m in group}
    transports = {m.id: MemoryTransport(m.identity, servers) for m in group}
    return addresses, {p: (wrap(p, t) if wrap else t) for p, t in transports.items()}


@pytest.mark.parametrize("bulk", [True, False])
async def test_members_end_with_the_bits_of_whole_models_moving_two_model_sizes_each(bulk):
    group = members(4)
    async with over_sockets(group, bulk) as (addresses, transports, _):
        results = await asyncio.gather(*(m.conclude(addresses, transports[m.id]) for m in reversed(group)))
    expected = reference(group)
    plan = EndPlan(("p0", "p1", "p2", "p3"), NUMEL, TAIL)
    for m, c in zip(reversed(group), results):
        assert c.how == "by parts" and c.plan.members == plan.members and not c.left_out
        assert torch.equal(c.vector, expected)  # the same bits as today's way, on every member
        taken, sent = part_traffic(plan, m.id)
        assert (m.traffic.received, m.traffic.sent) == (4 * taken, 4 * sent)
        assert taken <= 2 * 3 / 4 * NUMEL + 3 * (1 + TAIL)  # against 3 model sizes for whole models
        assert m.final.served == c.owed_reads == 3  # its part's average, read by each other member
    assert torch.equal(expected[:100], torch.full((100,), 0.1))  # the frozen values, unchanged
    assert expected[-TAIL:].tolist() == encode_ints(torch.tensor([21, 1000])).tolist()  # the largest integers


class Counting:
    """A transport that counts the tries at each address."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.tries: dict[str, int] = {}

    async def fetch_segment(self, address, round_, segment, out, timeout, stage=0):
        self.tries[address] = self.tries.get(address, 0) + 1
        await self.inner.fetch_segment(address, round_, segment, out, timeout, stage)


async def test_a_member_still_training_is_waited_for():
    group = members(3)
    addresses, transports = in_memory(group, lambda p, t: Counting(t))
    patience = Patience(lambda peer: True, 120.0)
    early = [asyncio.create_task(m.conclude(addresses, transports[m.id], 0.2, patience)) for m in group[:2]]
    try:
        # Each try ends after 0.2 s with p2 still training: they ask again.
        await until(lambda: all(transports[p].tries.get("mem-p2", 0) >= 3 for p in ("p0", "p1")),
                    "the early members to have asked p2 three times", timeout_s=60.0)
        assert not any(t.done() for t in early)
        # The asks told p2 that the job's end is reached (its engine ends at its next round).
        assert group[2].final.end_reached_elsewhere
        late = await group[2].conclude(addresses, transports["p2"], 5.0, patience)
        results = [*(await asyncio.gather(*early)), late]
    finally:
        await cancelled(early)
    assert all(c.plan.size == 3 and torch.equal(c.vector, reference(group)) for c in results)


async def test_only_a_request_to_a_member_still_training_tells_it_the_end_is_reached():
    """A request for a final model marks the job's end on a member that has no
    final model yet, never on one that has published its own or left."""
    group = members(3)
    addresses, transports = in_memory(group)
    await group[1].final.publish(group[1].own.values, group[1].own.layout, TAIL)
    await group[2].final.withdraw("left the job")
    out = torch.empty(group[1].own.layout[0].size)
    await transports["p0"].fetch_segment(addresses["p1"], 0, 0, out, 1.0, stage=3)
    assert torch.equal(out, group[1].own.values[: out.numel()])
    with pytest.raises(Exception, match="left the job"):
        await transports["p0"].fetch_segment(addresses["p2"], 0, 0, out, 1.0, stage=3)
    assert not group[1].final.end_reached_elsewhere and not group[2].final.end_reached_elsewhere
    assert not group[0].final.end_reached_elsewhere


async def cancelled(tasks: list[asyncio.Task]) -> None:
    """A test that failed midway leaves no member's end running."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_member_that_gives_up_on_one_still_training_is_followed_by_the_others():
    """p0's patience ends while p3 still trains; p1 would wait much longer.
    p0's requests under the set without p3 tell p1 to leave p3 out too, so
    the two end with one model."""
    group = members(4)
    addresses, transports = in_memory(group)
    early = group[0].conclude(addresses, transports["p0"], 0.5, Patience(lambda peer: True, 3.0))
    patient = [m.conclude(addresses, transports[m.id], 0.5, Patience(lambda peer: True, 30.0)) for m in group[1:3]]
    results = await asyncio.gather(early, *patient)
    assert all(c.plan.members == ("p0", "p1", "p2") and c.how == "by parts" for c in results)
    assert all(torch.equal(c.vector, reference(group[:3])) for c in results)
    learned = "left out by an owner of the end's average"
    assert results[0].left_out["p3"] != learned  # p0 saw it fail
    assert all(c.left_out["p3"] == learned for c in results[1:])


async def test_an_owner_that_fails_midway_is_left_out_and_the_others_agree():
    """p2 publishes its final model, serves its parts to their owners, then
    dies before it averages its own part; its daemon stops listing it."""
    group = members(4)
    listed = {m.id for m in group}
    patience = Patience(lambda peer: peer in listed, 120.0)
    crashed, alive = group[2], [m for m in group if m.id != "p2"]
    async with over_sockets(group) as (addresses, transports, servers):
        await crashed.final.publish(crashed.own.values, crashed.own.layout, TAIL)
        ending = [asyncio.create_task(m.conclude(addresses, transports[m.id], 10.0, patience)) for m in alive]
        try:
            served = 4 * (NUMEL - EndPlan(tuple(sorted(listed)), NUMEL, TAIL).part_of("p2").size)
            await until(lambda: crashed.traffic.sent >= served, "p2 to serve its parts to their owners")
            await servers.pop("p2").stop(grace=None)
            listed.discard("p2")
            results = await asyncio.gather(*ending)
        finally:
            await cancelled(ending)
    expected = reference(alive)
    for c in results:
        assert c.how == "by parts" and c.plan.members == ("p0", "p1", "p3") and "p2" in c.left_out
        assert torch.equal(c.vector, expected)


async def test_a_part_that_fails_one_way_comes_from_a_member_that_holds_the_average():
    """p1 and p2 cannot get p3's average from p3: they take it from p0, which
    holds the whole average, and every member ends with the full set."""

    class Refusing:
        def __init__(self, inner) -> None:
            self.inner = inner

        async def fetch_segment(self, address, round_, segment, out, timeout, stage=0):
            if address == "mem-p3" and stage == FINAL_MEAN_STAGE:
                raise PeerUnavailable(f"{address}: connection reset")
            await self.inner.fetch_segment(address, round_, segment, out, timeout, stage)

    group = members(4)
    addresses, transports = in_memory(group, lambda p, t: Refusing(t) if p in ("p1", "p2") else t)
    results = await asyncio.gather(*(m.conclude(addresses, transports[m.id]) for m in group))
    assert all(c.plan.size == 4 and c.how == "by parts" and torch.equal(c.vector, reference(group)) for c in results)


@pytest.mark.parametrize("bulk", [True, False])
async def test_members_whose_views_differ_end_with_the_sets_they_can_agree_on(bulk):
    """p0 does not know p3: p1 and p2 follow p0's set (an owner's set that
    lacks one member, named in its refusal), p3 cannot (that set lacks p3
    itself) and pulls whole models."""
    group = members(4)
    async with over_sockets(group, bulk) as (addresses, transports, _):
        views = {m.id: addresses if m.id != "p0" else {p: a for p, a in addresses.items() if p != "p3"}
                 for m in group}
        ends = await asyncio.gather(*(m.conclude(views[m.id], transports[m.id]) for m in group))
    results = dict(zip(addresses, ends))
    three = reference(group[:3])
    for peer in ("p0", "p1", "p2"):
        assert results[peer].plan.members == ("p0", "p1", "p2") and results[peer].how == "by parts"
        assert torch.equal(results[peer].vector, three)
    assert "p3" in results["p1"].left_out and "p3" in results["p2"].left_out
    assert results["p3"].plan.size == 4 and results["p3"].how == "whole models"
    assert torch.equal(results["p3"].vector, reference(group))


async def test_a_member_with_another_secret_is_left_out_at_once_and_itself_keeps_its_own():
    group = members(3)
    secrets = {"p0": b"s" * 32, "p1": b"s" * 32, "p2": b"o" * 32}
    patience = Patience(lambda peer: True, 600.0)  # asked again while listed: not when its proof is refused
    async with over_sockets(group, secrets=secrets) as (addresses, transports, _):
        results = await asyncio.gather(*(m.conclude(addresses, transports[m.id], 10.0, patience) for m in group))
    assert [c.plan.members for c in results[:2]] == [("p0", "p1")] * 2
    assert all("p2" in c.left_out for c in results[:2])
    assert torch.equal(results[0].vector, results[1].vector) and torch.equal(results[0].vector, reference(group[:2]))
    assert results[2].plan.alone and torch.equal(results[2].vector, group[2].own.values)


async def test_a_member_whose_model_is_not_finite_takes_no_part():
    group = members(3)
    group[2].own.values[7] = float("nan")
    addresses, transports = in_memory(group)
    results = await asyncio.gather(*(m.conclude(addresses, transports[m.id]) for m in group))
    assert all(c.plan.members == ("p0", "p1") and "not finite" in c.left_out["p2"] for c in results[:2])
    assert torch.equal(results[0].vector, reference(group[:2]))
    assert results[2].plan.alone


async def test_an_end_cancelled_midway_leaves_nothing_running():
    """A leave cancels the end while its pulls wait for a member still training."""
    group = members(3)
    addresses, transports = in_memory(group)
    ending = asyncio.create_task(group[0].conclude(addresses, transports["p0"], 30.0, Patience(lambda p: True, 60.0)))
    await until(lambda: group[0].final.working is not None, "p0 to plan")
    ending.cancel()
    with pytest.raises(asyncio.CancelledError):
        await ending
