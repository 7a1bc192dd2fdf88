"""The overlap runner (peerd.worker.round.overlap): rounds in the background between
in-memory workers, local steps meanwhile, the correction one round stale."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from peerd.core.groups import plan_hierarchical
from peerd.core.segments import split_even
from peerd.core.topology import plan_round
from peerd.errors import PeerUnavailable
from peerd.worker.round.crossover import gossip_round
from peerd.worker.round.overlap import OverlapRunner, round_exchange
from peerd.worker.round.context import RoundBuffers, RoundContext, RoundInputs
from peerd.worker.wire.stores import Identity, SegmentServer, SnapshotStore, StageStore
from peerd.worker.wire.transport import MemoryTransport

NUMEL = 6_007
SEGMENTS = 6
CHUNK = 800
MEAN_TOL = 2e-6  # fp32: a few ulps of values of magnitude ~1-3, summed over the peers


class Peer:
    def __init__(self, peer_id: str, vector: torch.Tensor, servers: dict) -> None:
        self.id = peer_id
        self.identity = Identity("job", "fp", peer_id)
        self.model = vector.clone()  # what the local steps write, on and on
        self.store = SnapshotStore(NUMEL)
        self.stages = StageStore()
        self.layout = split_even(NUMEL, SEGMENTS)
        servers[f"mem-{peer_id}"] = SegmentServer(self.identity, self.store, SEGMENTS, CHUNK, self.stages)
        self.transport = MemoryTransport(self.identity, servers)
        self.runner = OverlapRunner(self.store, NUMEL, grace_s=0.5)

    @property
    def context(self) -> RoundContext:
        return RoundContext(self.id, self.layout, self.transport, self.stages)

    def flat(self, round_: int, addresses: dict[str, str]):
        plan = plan_round("job", round_, list(addresses), self.id, SEGMENTS)
        return round_exchange(self.context, plan, addresses)

    def hierarchical(self, round_: int, view: dict, addresses: dict[str, str]):
        plan = plan_hierarchical("job", round_, view, self.id, SEGMENTS, 3)
        return round_exchange(self.context, plan, addresses)


def make_peers(ids) -> tuple[dict[str, Peer], dict[str, str]]:
    gen = torch.Generator().manual_seed(3)
    servers: dict = {}
    peers = {p: Peer(p, torch.randn(NUMEL, generator=gen), servers) for p in ids}
    return peers, {p: f"mem-{p}" for p in ids}


def mean(peers: dict[str, Peer]) -> torch.Tensor:
    return torch.stack([p.model.double() for p in peers.values()]).mean(0)


def spread(peers: dict[str, Peer]) -> float:
    stacked = torch.stack([p.model.double() for p in peers.values()])
    return float((stacked - stacked.mean(0)).square().sum())


async def local_steps(peers: dict[str, Peer], gen: torch.Generator, scale: float) -> torch.Tensor:
    """Every peer changes its model while the rounds run; returns the mean change."""
    total = torch.zeros(NUMEL, dtype=torch.float64)
    for peer in peers.values():
        await asyncio.sleep(0)  # let the exchanges run between the steps
        step = scale * torch.randn(NUMEL, generator=gen)
        peer.model.add_(step)
        total += step.double()
    return total / len(peers)


async def overlapped_rounds(peers, addresses, rounds: int, scale: float, exchange=None) -> list:
    gen = torch.Generator().manual_seed(4)
    expected = mean(peers)
    results = []
    for r in range(1, rounds + 1):
        for p in peers.values():
            await p.runner.start(r, p.model, exchange(p, r) if exchange else p.flat(r, addresses), 5.0)
        expected += await local_steps(peers, gen, scale)
        results += await asyncio.gather(*(p.runner.finish(p.model) for p in peers.values()))
        torch.testing.assert_close(mean(peers), expected, rtol=0, atol=MEAN_TOL)
    return results


async def test_flat_rounds_in_the_background_keep_the_mean_with_local_steps():
    peers, addresses = make_peers(["a", "b", "c", "d"])
    results = await overlapped_rounds(peers, addresses, rounds=5, scale=0.01)
    assert all(r is not None and r.misses == 0 for r in results)


async def test_flat_rounds_in_the_background_contract_without_local_steps():
    peers, addresses = make_peers(["a", "b", "c", "d"])
    start = spread(peers)
    await overlapped_rounds(peers, addresses, rounds=6, scale=0.0)
    # E‖D‖² contracts by (n − 2)/(2(n − 1)) = 1/3 per round for n = 4: 6 rounds ≈ 0.0014.
    assert spread(peers) < 0.02 * start


async def test_hierarchical_rounds_in_the_background_keep_the_mean():
    ids = ["a1", "a2", "a3", "b1", "b2"]  # groups of 3 and 2: unequal weights
    view = {p: () for p in ids}
    peers, addresses = make_peers(ids)
    start = spread(peers)
    results = await overlapped_rounds(
        peers, addresses, rounds=4, scale=0.01, exchange=lambda p, r: p.hierarchical(r, view, addresses))
    assert all(r is not None and r.misses == 0 for r in results)
    assert spread(peers) < 0.1 * start


async def test_partners_read_the_snapshot_while_the_model_moves_on():
    peers, addresses = make_peers(["a", "b"])
    a, b = peers["a"], peers["b"]
    before = a.model.clone()
    await a.runner.start(1, a.model, a.flat(1, addresses), 5.0)
    assert a.runner.pending == 1
    a.model.add_(1.0)  # local steps
    async with a.store.hold(1, 0.0) as served:
        assert torch.equal(served, before)
    expected_a = (before + b.model) / 2 + 1.0
    await b.runner.start(1, b.model, b.flat(1, addresses), 5.0)
    ra, _ = await asyncio.gather(a.runner.finish(a.model), b.runner.finish(b.model))
    assert ra.misses == 0 and a.runner.pending is None
    torch.testing.assert_close(a.model, expected_a)


async def test_a_dead_partner_costs_only_its_segments():
    peers, addresses = make_peers(["a", "b"])
    addresses["c"] = "mem-nobody"  # in the view, serving nothing
    a, b = peers["a"], peers["b"]
    snapshot_a, snapshot_b = a.model.clone(), b.model.clone()
    await asyncio.gather(*(p.runner.start(1, p.model, p.flat(1, addresses), 2.0) for p in (a, b)))
    ra = await a.runner.finish(a.model)
    await b.runner.finish(b.model)
    assert ra.misses > 0 and "c" in ra.unreachable
    plan = plan_round("job", 1, list(addresses), "a", SEGMENTS)
    for s, span in enumerate(a.layout):
        got = a.model[span.start : span.stop]
        if plan.sources[s] == "c":  # missed: a keeps its own value (a correction of zero)
            assert torch.equal(got, snapshot_a[span.start : span.stop])
        else:
            torch.testing.assert_close(got, (snapshot_a + snapshot_b)[span.start : span.stop] / 2)


async def test_a_partner_that_never_reaches_the_round_is_missed_at_the_deadline():
    peers, addresses = make_peers(["a", "b"])
    a = peers["a"]
    before = a.model.clone()
    started = time.monotonic()
    await a.runner.start(1, a.model, a.flat(1, addresses), 0.3)
    a.model.add_(0.5)
    result = await a.runner.finish(a.model)
    assert time.monotonic() - started < 0.3 + 0.5
    assert result.misses == SEGMENTS and result.reached == set()
    assert torch.equal(a.model, before + 0.5)  # nothing arrived: only the local steps


async def test_a_partner_up_to_a_round_behind_is_waited_for_not_missed():
    """In the background a peer may start a round up to one round period before
    its partner publishes it: the round waits that long beyond the transfer's
    deadline (with the transfer deadline alone, 0.2 s here, every segment was
    missed and the partners were suspected)."""
    peers, addresses = make_peers(["a", "b"])
    a, b = peers["a"], peers["b"]
    await asyncio.gather(*(p.runner.start(1, p.model, p.flat(1, addresses), 0.2) for p in (a, b)))
    await asyncio.sleep(1.0)  # a round of local steps
    await asyncio.gather(a.runner.finish(a.model), b.runner.finish(b.model))
    expected = (a.model + b.model) / 2
    await a.runner.start(2, a.model, a.flat(2, addresses), 0.2)
    await asyncio.sleep(0.6)  # b is still computing: past the transfer deadline, within a round
    await b.runner.start(2, b.model, b.flat(2, addresses), 0.2)
    ra, rb = await asyncio.gather(a.runner.finish(a.model), b.runner.finish(b.model))
    assert ra.misses == 0 and rb.misses == 0
    torch.testing.assert_close(a.model, expected)
    torch.testing.assert_close(b.model, expected)


def stages_fetched(peer: Peer) -> list[int]:
    """The stage of every fetch `peer` makes from now on."""
    stages, fetch = [], peer.transport.fetch_segment

    async def counted(address, round_, segment, out, timeout, stage=0):
        stages.append(stage)
        await fetch(address, round_, segment, out, timeout, stage)

    peer.transport.fetch_segment = counted
    return stages


async def test_two_peers_in_the_background_run_a_pair_round_with_the_bits_of_a_flat_one():
    """The background picks its round as a round run now does (peerd.worker.round.dispatch):
    with two peers each averages the half it owns and takes the other half from
    its partner (stage 2), and the models end where flat rounds leave them."""
    paired, addresses = make_peers(["a", "b"])
    flat, _ = make_peers(["a", "b"])
    fetched = {p: stages_fetched(peer) for p, peer in paired.items()}

    def gossip(p: Peer, r: int):
        plan = plan_round("job", r, list(addresses), p.id, SEGMENTS)
        return lambda b: gossip_round(p.context, RoundInputs(plan, addresses, b))

    await overlapped_rounds(paired, addresses, rounds=2, scale=0.01)
    await overlapped_rounds(flat, addresses, rounds=2, scale=0.01, exchange=gossip)
    for p in ("a", "b"):
        assert fetched[p].count(2) == fetched[p].count(0) == SEGMENTS  # half of each, two rounds
        assert torch.equal(paired[p].model, flat[p].model)


async def fails(_: RoundBuffers):
    raise PeerUnavailable("the view emptied")


async def nobody(_: RoundBuffers):
    return None


async def hangs(_: RoundBuffers):
    await asyncio.sleep(3600)


@pytest.mark.parametrize("exchange", [fails, nobody, hangs])
async def test_a_failed_or_given_up_round_applies_no_correction(exchange):
    store = SnapshotStore(NUMEL)
    runner = OverlapRunner(store, NUMEL, grace_s=0.1)
    model = torch.randn(NUMEL)
    await runner.start(7, model, exchange, deadline_s=0.1)
    model.add_(2.0)
    after_steps = model.clone()
    started = time.monotonic()
    assert await runner.finish(model) is None
    assert time.monotonic() - started < 1.0
    assert torch.equal(model, after_steps)
    assert runner.pending is None


async def test_after_a_given_up_round_the_next_one_works():
    peers, addresses = make_peers(["a", "b"])
    a, b = peers["a"], peers["b"]
    a.runner = OverlapRunner(a.store, NUMEL, grace_s=0.05)
    await a.runner.start(1, a.model, hangs, deadline_s=0.05)
    assert await a.runner.finish(a.model) is None
    expected = (a.model + b.model) / 2
    await asyncio.gather(*(p.runner.start(2, p.model, p.flat(2, addresses), 5.0) for p in (a, b)))
    results = await asyncio.gather(a.runner.finish(a.model), b.runner.finish(b.model))
    assert all(r.misses == 0 for r in results)
    torch.testing.assert_close(a.model, expected)


async def test_a_bug_in_the_exchange_is_raised_not_hidden():
    async def bug(_: RoundBuffers):
        raise ValueError("a bug")

    runner = OverlapRunner(SnapshotStore(NUMEL), NUMEL)
    await runner.start(1, torch.zeros(NUMEL), bug, deadline_s=1.0)
    with pytest.raises(ValueError, match="a bug"):
        await runner.finish(torch.zeros(NUMEL))
    assert runner.pending is None


async def test_one_round_at_a_time_and_aclose_gives_up_the_one_in_flight():
    runner = OverlapRunner(SnapshotStore(NUMEL), NUMEL)
    model = torch.zeros(NUMEL)
    assert await runner.finish(model) is None  # nothing in flight
    await runner.start(1, model, hangs, deadline_s=60.0)
    with pytest.raises(RuntimeError, match="still in flight"):
        await runner.start(2, model, hangs, deadline_s=60.0)
    await runner.aclose()
    assert runner.pending is None
    assert await runner.finish(model) is None


async def test_with_nobody_to_gossip_with_the_snapshot_is_only_published():
    store = SnapshotStore(NUMEL)
    runner = OverlapRunner(store, NUMEL)
    model = torch.randn(NUMEL)
    before = model.clone()
    await runner.start(4, model, None)
    assert runner.pending is None
    model.add_(1.0)
    async with store.hold(4, 0.0) as served:
        assert torch.equal(served, before)
    assert await runner.finish(model) is None and torch.equal(model, before + 1.0)


async def test_overlapped_rounds_over_grpc_and_the_bulk_lane():
    """The same with real sockets on 127.0.0.1: partners read the handed-over
    snapshot over the bulk lane while the models move on."""
    from peerd.worker.state.pull import StateBoard, StateServer
    from peerd.worker.wire.server import start_exchange_server
    from peerd.worker.wire.transport import GrpcTransport

    peers, _ = make_peers(["a", "b"])
    servers, addresses = [], {}
    for p in peers.values():
        state = StateServer(p.identity, StateBoard(2 * NUMEL, NUMEL), p.store, CHUNK)
        server, address = await start_exchange_server(
            SegmentServer(p.identity, p.store, SEGMENTS, CHUNK, p.stages), state, "127.0.0.1")
        servers.append(server)
        addresses[p.id] = address
        p.transport = GrpcTransport(p.identity)
    try:
        results = await overlapped_rounds(peers, addresses, rounds=3, scale=0.01)
        assert all(r is not None and r.misses == 0 for r in results)
    finally:
        for p in peers.values():
            await p.transport.aclose()
        for server in servers:
            await server.stop(grace=None)


async def test_the_exchange_runs_while_a_local_step_runs():
    """The point of overlap: the round makes progress during a step (run in a
    thread, as the worker does), not only after it. The exchange here can only
    finish if it sees the step's progress."""
    loop = asyncio.get_running_loop()
    mid_step = asyncio.Event()
    seen_mid_step = []

    async def exchange(_: RoundBuffers):
        await mid_step.wait()
        seen_mid_step.append(True)
        return None

    def step(done: "threading.Event") -> None:
        loop.call_soon_threadsafe(mid_step.set)
        assert done.wait(5.0), "the exchange did not run while the step ran"

    import threading

    done = threading.Event()

    async def watch():
        await mid_step.wait()
        await asyncio.sleep(0)
        while not seen_mid_step:
            await asyncio.sleep(0.01)
        done.set()

    runner = OverlapRunner(SnapshotStore(NUMEL), NUMEL)
    model = torch.zeros(NUMEL)
    await runner.start(1, model, exchange, deadline_s=10.0)
    watcher = asyncio.create_task(watch())
    await asyncio.to_thread(step, done)
    await watcher
    assert await runner.finish(model) is None and seen_mid_step


async def test_a_cancelled_flat_round_leaves_no_fetch_behind():
    peers, addresses = make_peers(["a", "b"])  # b never publishes: a's fetches wait
    a = peers["a"]
    await a.store.publish(1, a.model)
    before = asyncio.all_tasks()
    plan = plan_round("job", 1, list(addresses), "a", SEGMENTS)
    buffers = RoundBuffers(a.model, torch.empty(NUMEL), 30.0, torch.empty(NUMEL))
    task = asyncio.create_task(gossip_round(a.context, RoundInputs(plan, addresses, buffers)))
    await asyncio.sleep(0.1)
    assert len(asyncio.all_tasks() - before) > 1  # the round and its fetches
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await asyncio.sleep(0)
    assert asyncio.all_tasks() - before == set()
