"""Two workers exchanging segments: in memory, then over real gRPC on 127.0.0.1."""

from __future__ import annotations

import asyncio

import pytest
import torch

from peerd.core.segments import Span, split_even
from peerd.core.topology import plan_round
from peerd.errors import InvalidMessage, JobMismatch, PeerUnavailable, RoundMismatch
from peerd.worker.round.crossover import gossip_round
from peerd.worker.round.context import RoundBuffers, RoundInputs
from peerd.worker.wire.stores import Identity, SegmentServer, SnapshotStore
from peerd.worker.state.pull import (
    RANGES_PER_DONOR, StateBoard, StateMeta, StatePart, StateServer, digest, pull_state, verify_part,
)
from peerd.worker.wire.server import start_exchange_server
from peerd.worker.wire.transport import GrpcTransport, MemoryTransport

from exchange_helpers import CHUNK, NUMEL, SEGMENTS, Peer, two_peers


async def test_round_in_memory_gives_both_the_average():
    a, b = two_peers()
    expected = (a.vector + b.vector) / 2
    servers = {"mem-a": a.server, "mem-b": b.server}
    addresses = {"a": "mem-a", "b": "mem-b"}
    ra, rb = await asyncio.gather(
        a.round(1, addresses, MemoryTransport(a.identity, servers)),
        b.round(1, addresses, MemoryTransport(b.identity, servers)),
    )
    assert ra.misses == rb.misses == 0
    assert ra.reached == {"b"} and rb.reached == {"a"}
    torch.testing.assert_close(a.vector, expected)
    torch.testing.assert_close(b.vector, expected)


@pytest.fixture(params=["bulk", "grpc"])
async def grpc_pair(request):
    """Two peers serving over real sockets; segments go over the bulk lane, or
    over gRPC alone."""
    bulk = request.param == "bulk"
    a, b = two_peers()
    servers, addresses = [], {}
    for peer in (a, b):
        server, address = await start_exchange_server(peer.server, peer.state, "127.0.0.1", bulk=bulk)
        servers.append(server)
        addresses[peer.identity.peer_id] = address
        assert address.startswith("127.0.0.1:")
        assert (server.bulk is not None) == bulk
    transports = [GrpcTransport(a.identity, bulk=bulk), GrpcTransport(b.identity, bulk=bulk)]
    yield a, b, addresses, transports
    for t in transports:
        await t.aclose()
    for s in servers:
        await s.stop(grace=None)


async def test_round_over_grpc_gives_both_the_average(grpc_pair):
    a, b, addresses, (ta, tb) = grpc_pair
    expected = (a.vector + b.vector) / 2
    ra, rb = await asyncio.gather(a.round(1, addresses, ta), b.round(1, addresses, tb))
    assert ra.misses == rb.misses == 0
    assert ra.disagreement > 0.5  # independent random vectors are far apart
    torch.testing.assert_close(a.vector, expected)
    torch.testing.assert_close(b.vector, expected)
    # A second round: both already agree, so the disagreement they measure is zero.
    rb2 = (await asyncio.gather(a.round(2, addresses, ta), b.round(2, addresses, tb)))[1]
    assert rb2.disagreement == pytest.approx(0.0, abs=1e-6)


async def test_a_partner_in_an_earlier_round_is_waited_for(grpc_pair):
    a, b, addresses, (ta, tb) = grpc_pair
    await b.store.publish(1, b.vector)
    expected = (a.vector + b.vector) / 2
    ra = asyncio.create_task(a.round(2, addresses, ta))
    await asyncio.sleep(0.2)  # a waits: b has not reached round 2
    assert not ra.done()
    rb = await b.round(2, addresses, tb)
    assert (await ra).misses == 0 and rb.misses == 0
    torch.testing.assert_close(a.vector, expected)


async def test_wrong_fingerprint_is_refused_and_nothing_is_applied(grpc_pair):
    a, b, addresses, _ = grpc_pair
    await b.store.publish(1, b.vector)
    intruder = GrpcTransport(Identity("job", "another-model", "x"))
    out = torch.zeros(a.layout[0].size)
    try:
        with pytest.raises(JobMismatch, match="fingerprint"):
            await intruder.fetch_segment(addresses["b"], 1, 0, out, timeout=2.0)
        with pytest.raises(JobMismatch):
            await intruder.fetch_state(addresses["b"], Span(0, 10), timeout=2.0)
    finally:
        await intruder.aclose()
    assert not out.any()


async def test_a_round_no_longer_held_is_refused_with_the_current_round(grpc_pair):
    a, b, addresses, (ta, _) = grpc_pair
    for r in (1, 2, 3):
        await b.store.publish(r, b.vector)
    with pytest.raises(RoundMismatch) as info:
        await ta.fetch_segment(addresses["b"], 1, 0, torch.empty(a.layout[0].size), timeout=2.0)
    assert info.value.current_round == 3


async def test_a_dead_partner_costs_only_the_deadline_and_keeps_own_values(grpc_pair):
    a, b, addresses, (ta, _) = grpc_pair
    before = a.vector.clone()
    result = await a.round(1, {"a": addresses["a"], "b": "127.0.0.1:1"}, ta, deadline_s=1.0)
    assert result.misses == SEGMENTS and not result.reached
    torch.testing.assert_close(a.vector, before)


async def donate(peer: Peer, round_: int, step: int, progress: float) -> asyncio.Task:
    """Act as a donor's round loop: capture the state as soon as someone wants it."""
    async def loop():
        while not peer.board.wanted:
            await asyncio.sleep(0.01)
        momentum = torch.full((NUMEL,), 0.5)
        await peer.board.capture([peer.vector, momentum], StateMeta(round_, step, progress, f"extra {step}".encode()))

    await peer.store.publish(round_, peer.vector)
    return asyncio.create_task(loop())


async def test_a_joiner_pulls_the_state_from_two_donors_in_parallel(grpc_pair):
    a, b, addresses, (ta, tb) = grpc_pair
    c = Peer("c", torch.zeros(NUMEL))
    server, address_c = await start_exchange_server(c.server, c.state, "127.0.0.1")
    joiner = GrpcTransport(Identity("job", "fp", "j"))
    try:
        tasks = [await donate(a, 7, 70, 2.5), await donate(b, 8, 80, 2.75)]
        vector, meta, used = await pull_state(joiner, {"a": addresses["a"], "b": addresses["b"]}, 2 * NUMEL, 5.0)
        await asyncio.gather(*tasks)
    finally:
        await joiner.aclose()
        await server.stop(grace=None)
    assert set(used) <= {"a", "b"}
    # The newest range's meta, with its extra part (scalars, registered objects), checksummed.
    newest = (8, 80, 2.75, b"extra 80") if "b" in used else (7, 70, 2.5, b"extra 70")
    assert (meta.round, meta.step, meta.progress, meta.extra) == newest
    # Each range whole from one donor: its parameters all a's or all b's.
    for span in split_even(2 * NUMEL, 2 * RANGES_PER_DONOR):
        if span.stop <= NUMEL:
            got = vector[span.start : span.stop]
            assert any(torch.equal(got, p.vector[span.start : span.stop]) for p in (a, b))
    torch.testing.assert_close(vector[NUMEL:], torch.full((NUMEL,), 0.5))


async def test_a_donor_whose_capture_never_comes_holds_up_no_range():
    """A slow donor (its step under way) answers its first range late; the others
    take the remaining ranges, then ask for its range too, and the pull ends
    without it. Before, each donor had one range and the pull waited for the
    slowest: here, its whole timeout_s (60 s; the guard below gives up at 20)."""
    gen = torch.Generator().manual_seed(4)
    fast, slow = Peer("fast", torch.randn(NUMEL, generator=gen)), Peer("slow", torch.randn(NUMEL, generator=gen))
    task = await donate(fast, 4, 40, 1.0)
    await slow.store.publish(4, slow.vector)  # in the round, but it never captures
    transport = MemoryTransport(Identity("job", "fp", "j"), {}, {"mem-fast": fast.state, "mem-slow": slow.state})
    vector, meta, used = await asyncio.wait_for(
        pull_state(transport, {"fast": "mem-fast", "slow": "mem-slow"}, 2 * NUMEL, 60.0), 20.0)
    await task
    assert used == ["fast"] and meta.round == 4
    torch.testing.assert_close(vector[:NUMEL], fast.vector)
    assert not slow.board.wanted  # its pending request was cancelled, not left waiting


async def test_a_donor_whose_part_in_the_job_is_over_hands_on_no_state_not_even_an_old_copy():
    # A peer in the end consensus still holds the copy it took for an earlier
    # joiner, rounds behind the job. A newcomer that took it would train the
    # rest of the job alone once the others finish: it must get nothing.
    gen = torch.Generator().manual_seed(8)
    ending, running = Peer("ending", torch.randn(NUMEL, generator=gen)), Peer("running", torch.randn(NUMEL, generator=gen))
    await ending.store.publish(4, ending.vector)
    await ending.board.capture([ending.vector, torch.zeros(NUMEL)], StateMeta(4, 40, 0.5))
    await ending.store.publish(90, ending.vector)  # its last round, far past that copy
    await ending.store.finish()
    await ending.board.finish()  # what its end does first
    transport = MemoryTransport(Identity("job", "fp", "j"), {}, {"mem-e": ending.state, "mem-r": running.state})
    with pytest.raises(PeerUnavailable, match="hands on no state"):
        await asyncio.wait_for(pull_state(transport, {"ending": "mem-e"}, 2 * NUMEL, 10.0), 20.0)
    # Beside a donor still training, the pull takes that one's state only.
    task = await donate(running, 90, 900, 1.9)
    vector, meta, used = await asyncio.wait_for(
        pull_state(transport, {"ending": "mem-e", "running": "mem-r"}, 2 * NUMEL, 10.0), 20.0)
    await task
    assert used == ["running"] and meta.round == 90
    torch.testing.assert_close(vector[:NUMEL], running.vector)


class LyingAfterFirstServer(StateServer):
    """Serves its first range honestly, then ranges that fail their checksum."""

    served = 0

    async def state(self, *args, **kwargs):
        self.served += 1
        async for meta, offset, total, sha, data in super().state(*args, **kwargs):
            yield meta, offset, total, sha, data if self.served == 1 else bytes([data[0] ^ 0xFF]) + data[1:]


async def test_the_ranges_a_donor_served_before_it_sent_a_corrupt_one_are_taken_again():
    gen = torch.Generator().manual_seed(6)
    good, liar = Peer("good", torch.randn(NUMEL, generator=gen)), Peer("liar", torch.randn(NUMEL, generator=gen))
    liar.state = LyingAfterFirstServer(liar.identity, liar.board, liar.store, CHUNK)
    task = await donate(liar, 4, 40, 1.0)  # captures at once: it serves first

    async def late_good() -> None:  # the good donor's capture comes 0.3 s later
        await good.store.publish(4, good.vector)
        await asyncio.sleep(0.3)
        await good.board.capture([good.vector, torch.full((NUMEL,), 0.5)], StateMeta(4, 40, 1.0))

    late = asyncio.create_task(late_good())
    transport = MemoryTransport(Identity("job", "fp", "j"), {}, {"mem-good": good.state, "mem-liar": liar.state})
    vector, meta, used = await asyncio.wait_for(
        pull_state(transport, {"good": "mem-good", "liar": "mem-liar"}, 2 * NUMEL, 10.0), 20.0)
    await asyncio.gather(task, late)
    assert liar.state.served >= 2  # one honest range, then a corrupt one
    assert used == ["good"]  # the honest range it served was dropped with it
    torch.testing.assert_close(vector[:NUMEL], good.vector)


async def test_a_failed_donor_is_replaced_and_a_corrupt_range_is_rejected(grpc_pair):
    a, b, addresses, (ta, _) = grpc_pair
    task = await donate(b, 3, 30, 1.0)
    vector, meta, used = await pull_state(ta, {"dead": "127.0.0.1:1", "b": addresses["b"]}, 2 * NUMEL, 3.0)
    await task
    assert used == ["b"] and meta.round == 3
    torch.testing.assert_close(vector[:NUMEL], b.vector)

    part = StatePart(meta, Span(0, 4), torch.tensor([1.0, 2.0, 3.0, 4.0]))
    with pytest.raises(PeerUnavailable, match="checksum"):
        verify_part(part, b"not the digest")
    bad = StatePart(meta, Span(0, 2), torch.tensor([1.0, float("nan")]))
    with pytest.raises(PeerUnavailable, match="non-finite"):
        verify_part(bad, digest(bad.values, meta.extra))  # the checksum covers the extra part too


async def test_state_in_memory_matches_the_grpc_path():
    a, _ = two_peers()
    task = await donate(a, 1, 1, 0.1)
    transport = MemoryTransport(Identity("job", "fp", "j"), {}, {"mem-a": a.state})
    vector, meta, used = await pull_state(transport, {"a": "mem-a"}, 2 * NUMEL, 2.0)
    await task
    torch.testing.assert_close(vector[:NUMEL], a.vector)


async def test_a_donor_whose_state_is_still_captures_when_asked_and_never_once_it_moves():
    # The engine's hook (Engine._wanted): a request that starts waiting is told
    # at once; the copy is taken only while the state is still (the training
    # thread parked in end_round), checked at the copy itself.
    a, _ = two_peers()
    await a.store.publish(3, a.vector)
    still = True
    momentum = torch.full((NUMEL,), 0.5)

    def wanted() -> None:
        asyncio.get_running_loop().create_task(a.board.capture(
            [a.vector, momentum], lambda: StateMeta(3, 30, 1.5), when=lambda: still))

    a.board.on_wanted = wanted
    transport = MemoryTransport(Identity("job", "fp", "j"), {}, {"mem-a": a.state})
    vector, meta, _ = await pull_state(transport, {"a": "mem-a"}, 2 * NUMEL, 10.0)  # not after wait_s = 5 s
    torch.testing.assert_close(vector, torch.cat([a.vector, momentum]))
    assert (meta.round, meta.step) == (3, 30)

    await a.store.publish(4, a.vector)  # the next round: the capture of round 3 still serves it ...
    still = False  # ... while the state moves (the training thread stepping)
    part = await asyncio.wait_for(transport.fetch_state("mem-a", Span(0, NUMEL), 60.0), 10.0)
    assert part.meta.round == 3 and not a.board.wanted  # served at once, no new capture asked for

    await a.store.publish(5, a.vector)  # two rounds on: the capture of round 3 is stale
    part = await transport.fetch_state("mem-a", Span(0, NUMEL), 0.2)  # waits 0.1 s for a capture in vain
    assert part.meta.round == 3  # the last one taken: none was taken while the state moved
    assert not await a.board.capture([a.vector, momentum], StateMeta(5, 50, 2.0), when=lambda: still)


async def test_memory_transport_reports_missing_peer():
    a, _ = two_peers()
    with pytest.raises(PeerUnavailable):
        await MemoryTransport(a.identity, {}).fetch_segment("nowhere", 1, 0, torch.empty(3), 1.0)


async def test_a_client_that_gives_up_mid_stream_releases_the_snapshot(grpc_pair):
    a, b, addresses, (ta, _) = grpc_pair
    big = 16_000_000  # 64 MB: the stream is still running when the client's 1 ms deadline hits
    store = SnapshotStore(big)
    server = SegmentServer(Identity("job", "fp", "big"), store, 1, CHUNK)
    grpc_server, address = await start_exchange_server(
        server, StateServer(server.identity, StateBoard(2 * big, big), store, CHUNK), "127.0.0.1")
    try:
        await store.publish(1, torch.ones(big))
        # Generous deadlines where the fetch must succeed: 64 MB over gRPC on a loaded machine.
        await ta.fetch_segment(address, 1, 0, torch.empty(big), timeout=120.0)  # the lane is known now
        for _ in range(3):
            with pytest.raises(PeerUnavailable):
                await ta.fetch_segment(address, 1, 0, torch.empty(big), timeout=0.001)
        await asyncio.sleep(0.2)  # the server side notices the cancellation
        # Round 3 reuses round 1's slot: publishing must neither wait nor corrupt a reader.
        await asyncio.wait_for(store.publish(3, torch.full((big,), 3.0)), timeout=2.0)
        out = torch.empty(big)
        await ta.fetch_segment(address, 3, 0, out, timeout=120.0)
        assert bool((out == 3.0).all())
    finally:
        await grpc_server.stop(grace=None)


async def test_publishing_over_a_round_still_being_read_keeps_the_reader_consistent():
    store = SnapshotStore(4)
    await store.publish(1, torch.ones(4))
    async with store.hold(1, 0.0) as held:
        await asyncio.wait_for(store.publish(3, torch.full((4,), 3.0)), timeout=1.0)  # same slot as round 1
        assert bool((held == 1.0).all())  # the reader still sees round 1
    async with store.hold(3, 0.0) as held:
        assert bool((held == 3.0).all())


async def test_the_bulk_lane_carries_segments_and_survives_garbage():
    a, b = two_peers()
    server, address = await start_exchange_server(b.server, b.state, "127.0.0.1")
    transport = GrpcTransport(a.identity)
    try:
        await b.store.publish(1, b.vector)
        out = torch.empty(a.layout[2].size)
        await transport.fetch_segment(address, 1, 2, out, timeout=5.0)
        span = a.layout[2]
        torch.testing.assert_close(out, b.vector[span.start : span.stop])
        assert transport._lanes[address] == server.bulk._sock.getsockname()[1]
        # Junk on the lane: oversized lengths, undecodable requests, a half frame.
        host, port = "127.0.0.1", transport._lanes[address]
        for junk in (b"\xff\xff\xff\xff", b"\x05\x00\x00\x00\xff\xff\xff\xff\xff", b"\x10\x00"):
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(junk)
            await writer.drain()
            writer.close()
        # A refusal comes back as the same error as over gRPC, with the round.
        for r in (2, 3):
            await b.store.publish(r, b.vector)
        with pytest.raises(RoundMismatch) as info:
            await transport.fetch_segment(address, 1, 0, torch.empty(a.layout[0].size), timeout=2.0)
        assert info.value.current_round == 3
        with pytest.raises(InvalidMessage, match="expected"):
            await transport.fetch_segment(address, 3, 0, torch.empty(7), timeout=2.0)
        await transport.fetch_segment(address, 3, 2, out, timeout=5.0)  # still serving
        torch.testing.assert_close(out, b.vector[span.start : span.stop])
    finally:
        await transport.aclose()
        await server.stop(None)


async def test_a_partner_without_a_bulk_lane_is_served_over_grpc():
    a, b = two_peers()
    server, address = await start_exchange_server(b.server, b.state, "127.0.0.1", bulk=False)
    transport = GrpcTransport(a.identity, wire="fp32", bulk=True)
    try:
        await b.store.publish(1, b.vector)
        out = torch.empty(a.layout[0].size)
        await transport.fetch_segment(address, 1, 0, out, timeout=5.0)
        assert transport._lanes[address] == 0
        torch.testing.assert_close(out, b.vector[: a.layout[0].size])
    finally:
        await transport.aclose()
        await server.stop(None)


class LyingStateServer(StateServer):
    """Serves a range whose bytes do not match the checksum it sends."""

    async def state(self, *args, **kwargs):
        async for meta, offset, total, sha, data in super().state(*args, **kwargs):
            yield meta, offset, total, sha, bytes([data[0] ^ 0xFF]) + data[1:]


async def test_a_joiner_refuses_corrupt_and_mismatched_states_and_uses_a_good_donor():
    gen = torch.Generator().manual_seed(3)
    good = Peer("a", torch.randn(NUMEL, generator=gen))
    nan = Peer("b", torch.randn(NUMEL, generator=gen))
    nan.vector[::97] = float("nan")  # lands in every range the joiner may ask b for
    nan.vector[5] = float("inf")
    other = Peer("c", torch.randn(NUMEL, generator=gen), fingerprint="another-model")
    liar = Peer("d", torch.randn(NUMEL, generator=gen))
    liar.state = LyingStateServer(liar.identity, liar.board, liar.store, CHUNK)
    servers, donors, tasks = [], {}, []
    joiner = GrpcTransport(Identity("job", "fp", "j"))
    try:
        for peer in (good, nan, other, liar):
            server, address = await start_exchange_server(peer.server, peer.state, "127.0.0.1")
            servers.append(server)
            donors[peer.identity.peer_id] = address
            tasks.append(await donate(peer, 5, 50, 1.5))
        vector, meta, used = await pull_state(joiner, donors, 2 * NUMEL, 5.0)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await joiner.aclose()
        await asyncio.gather(*(s.stop(None) for s in servers))
    assert used == ["a"]  # every range refused by the others came from the good donor
    torch.testing.assert_close(vector[:NUMEL], good.vector)
    assert meta.round == 5


@pytest.mark.parametrize("factor", [0.0, 3.0])
async def test_clipping_bounds_what_a_poisoner_does_to_honest_peers(factor):
    from peerd.core.robust import PullClipper

    gen = torch.Generator().manual_seed(5)
    peers = {p: Peer(p, torch.randn(NUMEL, generator=gen)) for p in ("a", "b", "c", "evil")}
    servers = {f"mem-{p}": peer.server for p, peer in peers.items()}
    addresses = {p: f"mem-{p}" for p in peers}
    clippers = {p: PullClipper(factor) for p in peers}
    clipped = 0

    async def one(p, r):
        peer = peers[p]
        if p == "evil" and r >= 4:
            peer.vector.fill_(1e4)  # publishes garbage every round from round 4 on
        await peer.store.publish(r, peer.vector)
        plan = plan_round("job", r, list(addresses), p, SEGMENTS)
        return await gossip_round(peer.context(MemoryTransport(peer.identity, servers), clippers[p]),
                                  RoundInputs(plan, addresses, RoundBuffers(peer.vector, peer.recv, 5.0)))

    for r in range(12):
        results = await asyncio.gather(*(one(p, r) for p in peers))
        clipped += sum(res.clipped for res, p in zip(results, peers) if p != "evil")
    worst = max(float(peers[p].vector.abs().max()) for p in ("a", "b", "c"))
    if factor:
        assert clipped > 0
        assert worst < 50, worst  # honest values started ~N(0, 1): moved by honest-sized pulls only
    else:
        assert clipped == 0
        assert worst > 1000, worst  # without the defence the garbage spreads


async def test_a_partner_that_went_away_is_a_miss_not_a_crash():
    """Idle bulk connections to a partner that died are closed under the client's
    feet: the next fetch must fail as PeerUnavailable, like any dead partner."""
    a, b = two_peers()
    server, address = await start_exchange_server(b.server, b.state, "127.0.0.1")
    transport = GrpcTransport(a.identity)
    try:
        await b.store.publish(1, b.vector)
        out = torch.empty(a.layout[0].size)
        await transport.fetch_segment(address, 1, 0, out, timeout=5.0)  # leaves an idle connection
        await server.stop(None)
        with pytest.raises(PeerUnavailable):
            await transport.fetch_segment(address, 1, 0, out, timeout=2.0)
    finally:
        await transport.aclose()
        await server.stop(None)


async def test_donors_far_apart_in_rounds_are_not_pieced_together(grpc_pair):
    """After a partition one donor may have trained alone for many rounds: ranges of
    its model and of the others' would make no model at all. All from one donor."""
    a, b, addresses, (ta, _) = grpc_pair
    joiner = GrpcTransport(Identity("job", "fp", "j"))
    try:
        tasks = [await donate(a, 5, 50, 1.0), await donate(b, 500, 5000, 9.0)]
        vector, meta, used = await pull_state(joiner, addresses, 2 * NUMEL, 5.0)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await joiner.aclose()
    assert len(used) == 1
    source = a if used == ["a"] else b
    torch.testing.assert_close(vector[:NUMEL], source.vector)
    assert meta.round == (5 if used == ["a"] else 500)


async def test_a_handed_over_vector_is_served_unchanged_and_the_round_writes_a_new_one():
    """The worker's path for a model on the CPU: no snapshot copy; the vector
    itself is the snapshot and the round writes the new state elsewhere."""
    a, b = two_peers()
    expected = (a.vector + b.vector) / 2
    servers = {"mem-a": a.server, "mem-b": b.server}
    addresses = {"a": "mem-a", "b": "mem-b"}
    before = {p.identity.peer_id: p.vector.clone() for p in (a, b)}

    async def round_(peer: Peer, r: int, transport) -> torch.Tensor:
        into = await peer.store.hand_over(r, peer.vector)
        plan = plan_round("job", r, list(addresses), peer.identity.peer_id, SEGMENTS)
        result = await gossip_round(peer.context(transport),
                                    RoundInputs(plan, addresses, RoundBuffers(peer.vector, peer.recv, 60.0, into)))
        assert result.misses == 0
        return into

    new_a, new_b = await asyncio.gather(round_(a, 1, MemoryTransport(a.identity, servers)),
                                        round_(b, 1, MemoryTransport(b.identity, servers)))
    torch.testing.assert_close(new_a, expected)
    assert torch.equal(new_a, new_b)
    assert torch.equal(a.vector, before["a"]) and torch.equal(b.vector, before["b"])  # what was served
    # A partner alone (its source gone): the new state is its own, segment for segment.
    lonely = await b.store.hand_over(2, new_b)
    plan = plan_round("job", 2, list(addresses), "b", SEGMENTS)
    result = await gossip_round(b.context(MemoryTransport(b.identity, {})),
                                RoundInputs(plan, addresses, RoundBuffers(new_b, b.recv, 0.5, lonely)))
    assert result.misses == SEGMENTS and torch.equal(lonely, new_b)


async def test_hand_over_gives_back_the_oldest_buffer_unless_it_is_being_read():
    store = SnapshotStore(4)
    v1, v2 = torch.full((4,), 1.0), torch.full((4,), 2.0)
    first = await store.hand_over(1, v1)
    await store.hand_over(2, v2)
    assert (await store.hand_over(3, first)).data_ptr() == v1.data_ptr()  # round 1's buffer, free again
    async with store.hold(2, 0.0) as held:
        spare = await store.hand_over(4, torch.full((4,), 4.0))  # round 2's slot, still being read
        assert spare.data_ptr() != v2.data_ptr()
        assert bool((held == 2.0).all())
    with pytest.raises(ValueError):
        await store.hand_over(5, torch.zeros(3))
