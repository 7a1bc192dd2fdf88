"""The final exact average among N peers: in memory, then over real sockets."""

from __future__ import annotations

import asyncio
import logging

import pytest
import torch

from peerd.core.segments import split_even
from peerd.errors import InvalidMessage, RoundMismatch
from peerd.worker.state.consensus import Models, Patience, average_models
from peerd.worker.wire.server import start_exchange_server
from peerd.worker.wire.stores import FINAL_STAGE, FinalStore, Identity, SegmentServer, SnapshotStore
from peerd.worker.state.pull import StateBoard, StateServer
from peerd.worker.wire.transport import GrpcTransport, MemoryTransport

from conftest import until

NUMEL = 10_007  # not a multiple of the segment or chunk size
SEGMENTS = 5
CHUNK = 1000


class Member:
    def __init__(self, peer_id: str, seed: int, wire: str = "fp32") -> None:
        self.id = peer_id
        self.identity = Identity("job", "fp", peer_id)
        gen = torch.Generator().manual_seed(seed)
        self.vector = torch.randn(NUMEL, generator=gen) * (seed + 1)
        self.final = FinalStore()
        self.store = SnapshotStore(NUMEL)
        self.server = SegmentServer(self.identity, self.store, SEGMENTS, CHUNK, wire=wire, final=self.final)
        self.layout = split_even(NUMEL, SEGMENTS)

    async def conclude(self, addresses: dict[str, str], transport, timeout: float = 5.0,
                       patience: Patience | None = None):
        await self.final.publish(self.vector)
        return await average_models(self.id, self.vector, addresses, self.layout, transport, timeout,
                                    Models(patience=patience))


def members(n: int, wire: str = "fp32") -> list[Member]:
    return [Member(f"p{k}", k, wire) for k in range(n)]


def in_memory(group: list[Member], wire: str = "fp32"):
    servers = {f"mem-{m.id}": m.server for m in group}
    addresses = {m.id: f"mem-{m.id}" for m in group}
    return addresses, {m.id: MemoryTransport(m.identity, servers, wire=wire) for m in group}


def reference(group: list[Member]) -> torch.Tensor:
    """The mean in float64: what every peer's fp32 result must be close to."""
    return torch.stack([m.vector.double() for m in group]).mean(0).float()


@pytest.mark.parametrize("wire", ["fp32", "bf16"])
async def test_n_peers_with_different_models_end_with_the_same_exact_average(wire):
    group = members(4, wire)
    addresses, transports = in_memory(group, wire)
    results = await asyncio.gather(*(m.conclude(addresses, transports[m.id]) for m in reversed(group)))
    first = results[0].vector
    for result in results:
        assert result.plan.members == ("p0", "p1", "p2", "p3")
        assert not result.left_out
        assert torch.equal(result.vector, first)  # bit for bit, also over a narrowed wire
        assert result.digest == results[0].digest
    torch.testing.assert_close(first, reference(group), rtol=1e-6, atol=1e-6)
    # Each names how far its own model was from the average (what gossip left undone).
    mean = reference(group)
    for member, result in zip(reversed(group), results):
        expected = float((member.vector - mean).norm() / mean.norm())
        assert result.own_gap == pytest.approx(expected, rel=1e-4)


async def test_a_peer_that_reaches_the_end_later_is_waited_for():
    group = members(3)
    addresses, transports = in_memory(group)
    # A long limit: on a busy machine the late one must still be in time.
    early = [asyncio.create_task(m.conclude(addresses, transports[m.id], timeout=60.0)) for m in group[:2]]
    await asyncio.sleep(0.2)  # the third is still training
    assert not any(t.done() for t in early)
    late = await group[2].conclude(addresses, transports["p2"], timeout=60.0)
    results = [*(await asyncio.gather(*early)), late]
    assert all(torch.equal(r.vector, late.vector) for r in results)
    assert late.plan.size == 3


async def test_a_peer_that_left_is_left_out_at_once_and_the_rest_agree():
    group = members(3)
    addresses, transports = in_memory(group)
    await group[1].final.finish()  # drained: it will never publish a final model
    results = await asyncio.gather(*(m.conclude(addresses, transports[m.id], timeout=30.0)
                                     for m in (group[0], group[2])))
    assert [r.plan.members for r in results] == [("p0", "p2"), ("p0", "p2")]
    assert all("left the job" in r.left_out["p1"] for r in results)
    assert torch.equal(results[0].vector, results[1].vector)
    torch.testing.assert_close(results[0].vector, reference([group[0], group[2]]), rtol=1e-6, atol=1e-6)


async def test_a_peer_still_serving_the_job_is_waited_for_past_each_tries_deadline(caplog):
    """A member still training long after the others' end (a newcomer that started
    from a stale state, a slower machine) is asked again while its daemon lists
    it, so that every peer ends with the same model; one that its daemon stops
    listing is left out then, not after the whole patience."""
    caplog.set_level(logging.INFO, logger="peerd.worker")
    group = members(4)
    addresses, transports = in_memory(group)
    transports["p0"] = counting = Counting(transports["p0"])
    listed = {"p0", "p1", "p2", "p3"}
    patience = Patience(lambda peer: peer in listed, 600.0)
    early = [asyncio.create_task(m.conclude(addresses, transports[m.id], timeout=0.2, patience=patience))
             for m in group[:2]]
    # Each try of p0 and p1 ends after 0.2 s with p2 and p3 still training: they ask again.
    await until(lambda: counting.tries.get("mem-p2", 0) >= 3 and counting.tries.get("mem-p3", 0) >= 3,
                "p0 to have asked the members still training three times", timeout_s=60.0)
    assert not any(t.done() for t in early)
    listed.discard("p3")  # p3 left the job without a final model (its daemon no longer lists it)
    late = await group[2].conclude(addresses, transports["p2"], timeout=5.0, patience=patience)
    results = [*(await asyncio.gather(*early)), late]
    assert [r.plan.members for r in results] == [("p0", "p1", "p2")] * 3
    assert all("p3" in r.left_out for r in results)
    assert all(torch.equal(r.vector, late.vector) for r in results)
    torch.testing.assert_close(late.vector, reference(group[:3]), rtol=1e-6, atol=1e-6)
    waits = [r.getMessage() for r in caplog.records if r.getMessage().startswith("the end: waiting for p2")]
    assert len(waits) == 2  # once for each early peer, at its first wait


class Counting:
    """A transport that counts the tries at each address (its segment 0 asked for)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.tries: dict[str, int] = {}

    async def fetch_segment(self, address, round_, segment, out, timeout, stage=0):
        if segment == 0:
            self.tries[address] = self.tries.get(address, 0) + 1
        await self.inner.fetch_segment(address, round_, segment, out, timeout, stage)


async def test_a_peer_that_never_gets_there_costs_the_deadline_and_a_lone_peer_keeps_its_own():
    group = members(2)
    addresses, transports = in_memory(group)
    alone = await group[0].conclude(addresses, transports["p0"], timeout=0.3)
    assert alone.plan.alone and "p1" in alone.left_out
    assert torch.equal(alone.vector, group[0].vector)


async def test_the_final_model_is_refused_while_training_or_for_a_bad_stage():
    m = members(1)[0]
    with pytest.raises(RoundMismatch, match="still training"):
        async for _ in m.server.segment("job", "fp", 0, 0, 0.0, FINAL_STAGE):
            pass
    for stage, round_ in ((FINAL_STAGE + 1, 0), (FINAL_STAGE + 2, 0), (FINAL_STAGE + 3, 3 << 48)):
        with pytest.raises(InvalidMessage):  # a part of no plan, or a stage past the end's
            async for _ in m.server.segment("job", "fp", round_, 0, 0.0, stage):
                pass


@pytest.mark.parametrize("bulk", [True, False])
async def test_three_peers_over_real_sockets_agree_bit_for_bit(bulk):
    group = members(3, "fp16")
    servers, addresses = [], {}
    for m in group:
        state = StateServer(m.identity, StateBoard(NUMEL, NUMEL), m.store, CHUNK)
        server, address = await start_exchange_server(m.server, state, "127.0.0.1", bulk=bulk)
        servers.append(server)
        addresses[m.id] = address
    transports = {m.id: GrpcTransport(m.identity, bulk=bulk, wire="fp16") for m in group}
    try:
        results = await asyncio.gather(*(m.conclude(addresses, transports[m.id]) for m in group))
    finally:
        for t in transports.values():
            await t.aclose()
        for s in servers:
            await s.stop(grace=None)
    assert all(r.plan.size == 3 and torch.equal(r.vector, results[0].vector) for r in results)
    torch.testing.assert_close(results[0].vector, reference(group), rtol=1e-6, atol=1e-6)
    assert all(m.final.served == 2 * SEGMENTS for m in group)  # each served its model to the two others


async def test_a_peer_that_sends_non_finite_values_is_left_out():
    group = members(3)
    group[2].vector[5] = float("nan")
    addresses, transports = in_memory(group)
    await group[2].final.publish(group[2].vector)
    results = await asyncio.gather(*(m.conclude(addresses, transports[m.id]) for m in group[:2]))
    assert all(r.plan.members == ("p0", "p1") and "finite" in r.left_out["p2"] for r in results), results[0].left_out
    assert torch.equal(results[0].vector, results[1].vector)


async def test_an_export_averages_one_rounds_snapshots_without_the_others_taking_part():
    from peerd.worker.state.consensus import round_consensus

    group = members(3)
    for m in group:
        await m.store.publish(7, m.vector)
    addresses, transports = in_memory(group)
    live = torch.zeros(NUMEL)  # the exporter's model of now is not what it exports
    mean = await round_consensus("p0", group[0].store, 7, live, addresses, group[0].layout, transports["p0"], 5.0)
    assert mean.plan.members == ("p0", "p1", "p2")
    torch.testing.assert_close(mean.vector, reference(group), rtol=1e-6, atol=1e-6)
    # A round the exporter does not hold (alone, or overlapped): its model of now.
    alone = await round_consensus("p0", group[0].store, 8, live, {"p0": "mem-p0"}, group[0].layout, transports["p0"], 0.1)
    assert alone.plan.alone and torch.equal(alone.vector, live)


async def test_a_gather_cancelled_midway_leaves_no_fetch_running_and_no_exception_unretrieved():
    """A leave cancels the end consensus while partners' fetches are under way."""
    from peerd.core.segments import split_even
    from peerd.worker.state.consensus import gather_models

    started = asyncio.Event()

    class Stalled:
        async def fetch_segment(self, address, round_, segment, out, timeout, stage=0):
            started.set()
            await asyncio.sleep(3600)

    before = asyncio.all_tasks()
    gather = asyncio.ensure_future(gather_models(Stalled(), {"a": "x", "b": "y"}, split_even(8, 2), 60.0))
    await started.wait()
    gather.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gather
    assert asyncio.all_tasks() - before - {asyncio.current_task()} == set()


async def test_a_fetch_that_ends_cancelled_by_itself_leaves_that_peer_out_and_the_gather_goes_on():
    """grpc.aio ends a call with CancelledError when its channel closes under it:
    one partner's failure, not a cancellation of the end itself."""
    from peerd.core.segments import split_even
    from peerd.worker.state.consensus import gather_models

    class ChannelClosed:
        async def fetch_segment(self, address, round_, segment, out, timeout, stage=0):
            if address == "gone":
                raise asyncio.CancelledError()
            out.fill_(1.0)

    got, why = await gather_models(ChannelClosed(), {"a": "here", "b": "gone"}, split_even(8, 2), 5.0)
    assert list(got) == ["a"] and torch.equal(got["a"], torch.ones(8))
    assert why == {"b": "its transfer was cancelled"}
