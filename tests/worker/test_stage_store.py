"""The stage store's buffers: values lent from a round's new state
(StageStore.lend / reclaim, used by peerd.worker.round.pair) and recycled stage
buffers (StageStore.buffer, used by peerd.worker.round.hierarchy). A partner reading
one through the SegmentServer, as the bulk lane and gRPC do, must never see it
overwritten: a lent one is taken back only after its reads stopped, a recycled
one is handed out again only when nobody reads it."""

from __future__ import annotations

import asyncio

import pytest
import torch

from peerd.errors import RoundMismatch
from peerd.worker.wire.stores import Identity, SegmentServer, SnapshotStore, StageStore

NUMEL, SEGMENTS, CHUNK = 1000, 2, 100  # segments of 500 elements, 5 chunks each
HANG_GUARD_S = 20.0  # only against a hang: nothing here should wait


def _server(stages: StageStore) -> SegmentServer:
    return SegmentServer(Identity("job", "fp", "me"), SnapshotStore(NUMEL), SEGMENTS, CHUNK, stages)


async def _read(server: SegmentServer, round_: int, segment: int, stage: int, stall: asyncio.Event | None = None,
                started: asyncio.Event | None = None) -> list[float]:
    """A partner's read, chunk by chunk; with `stall`, it stops after the first
    chunk until `stall` is set (a send blocked on a full socket)."""
    got = []
    async for _, _, data in server.segment("job", "fp", round_, segment, 0.0, stage):
        got.extend(data.tolist())
        if started is not None:
            started.set()
        if stall is not None:
            await stall.wait()
    return got


async def test_a_lent_value_read_to_the_end_is_taken_back_without_waiting():
    stages = StageStore()
    server = _server(stages)
    state = torch.arange(NUMEL, dtype=torch.float32)
    await stages.begin(1, [0])
    await stages.lend(1, 2, 0, state[:500], reads=1)
    assert await _read(server, 1, 0, 2) == state[:500].tolist()
    await asyncio.wait_for(stages.reclaim(1, 2, [0], wait_s=1e6), HANG_GUARD_S)
    with pytest.raises(RoundMismatch, match="not computed"):
        await _read(server, 1, 0, 2)


async def test_a_read_still_streaming_is_cancelled_before_reclaim_returns():
    stages = StageStore()
    server = _server(stages)
    state = torch.zeros(NUMEL)
    await stages.begin(1, [0])
    await stages.lend(1, 2, 0, state[:500], reads=1)
    started, stall = asyncio.Event(), asyncio.Event()
    reader = asyncio.create_task(_read(server, 1, 0, 2, stall, started))
    await started.wait()
    await stages.reclaim(1, 2, [0], wait_s=0.0)
    assert reader.done() and reader.cancelled()  # it can read the state no more
    state.fill_(7.0)  # the caller trains on its state again
    with pytest.raises(RoundMismatch):
        await _read(server, 1, 0, 2)


async def test_reclaim_waits_for_the_reads_it_was_lent_for():
    stages = StageStore()
    server = _server(stages)
    state = torch.ones(NUMEL)
    await stages.begin(1, [0, 1])
    await stages.lend(1, 2, 0, state[:500], reads=1)
    await stages.lend(1, 2, 1, state[500:], reads=1)
    reclaim = asyncio.create_task(stages.reclaim(1, 2, [0, 1], wait_s=1e6))
    assert await _read(server, 1, 0, 2) == [1.0] * 500
    await asyncio.sleep(0)
    assert not reclaim.done()  # segment 1 not read yet
    assert await _read(server, 1, 1, 2) == [1.0] * 500
    await asyncio.wait_for(reclaim, HANG_GUARD_S)


async def test_a_refused_value_is_refused_at_once():
    stages = StageStore()
    await stages.begin(3, [1])
    await stages.refuse(3, 2, 1)
    with pytest.raises(RoundMismatch, match="not computed"):
        await asyncio.wait_for(stages.get(3, 2, 1, wait_s=1e6), HANG_GUARD_S)


async def test_a_stage_buffer_is_recycled_only_when_nobody_reads_it():
    stages = StageStore()
    server = _server(stages)
    await stages.begin(1, [0, 1])
    read_late, unread = stages.buffer(500).fill_(1.0), stages.buffer(500).fill_(2.0)
    await stages.put(1, 2, 0, read_late)
    await stages.put(1, 2, 1, unread)
    started, stall = asyncio.Event(), asyncio.Event()
    reader = asyncio.create_task(_read(server, 1, 0, 2, stall, started))
    await started.wait()
    await stages.begin(2, [0])
    await stages.begin(3, [0])  # round 1 dropped: `unread` is free again, `read_late` is not
    handed = [stages.buffer(500) for _ in range(3)]
    ptrs = {b.data_ptr() for b in handed}
    assert unread.data_ptr() in ptrs and read_late.data_ptr() not in ptrs
    for b in handed:
        b.fill_(9.0)
    stall.set()
    assert await asyncio.wait_for(reader, HANG_GUARD_S) == [1.0] * 500  # never overwritten while read
    await stages.begin(4, [0])
    await stages.begin(5, [0])
    assert read_late.data_ptr() not in {stages.buffer(500).data_ptr() for _ in range(6)}


async def test_a_scratch_buffer_never_put_is_free_again_at_the_next_round():
    stages = StageStore()
    await stages.begin(1, [0])
    scratch = stages.buffer(500)
    assert stages.buffer(500).data_ptr() != scratch.data_ptr()
    await stages.begin(2, [0])
    assert scratch.data_ptr() in {stages.buffer(500).data_ptr() for _ in range(2)}


async def test_settle_takes_back_what_everyone_read_and_copies_what_someone_may_still_read():
    stages = StageStore()
    server = _server(stages)
    state = torch.arange(NUMEL, dtype=torch.float32)
    await stages.begin(1, [0, 1])
    await stages.lend(1, 2, 0, state[:500], reads=2)
    await stages.lend(1, 2, 1, state[500:], reads=2)
    first = await _read(server, 1, 0, 2)
    await _read(server, 1, 0, 2)
    await _read(server, 1, 1, 2)
    await asyncio.wait_for(stages.settle(1, 2, [0, 1], wait_s=1e6), HANG_GUARD_S)
    expected = state[500:].tolist()
    state.fill_(-1.0)  # the caller trains on its state again
    with pytest.raises(RoundMismatch, match="not computed"):
        await _read(server, 1, 0, 2)  # read as often as it was lent for: taken back
    assert first == torch.arange(500, dtype=torch.float32).tolist()
    assert await _read(server, 1, 1, 2) == expected  # a second reader may still come: a copy


async def test_settle_waits_for_no_reader_that_has_not_come():
    stages = StageStore()
    server = _server(stages)
    state = torch.ones(NUMEL)
    await stages.begin(1, [0])
    await stages.lend(1, 2, 0, state[:500], reads=3)
    await asyncio.wait_for(stages.settle(1, 2, [0], wait_s=1e6), HANG_GUARD_S)
    state.fill_(5.0)
    assert await _read(server, 1, 0, 2) == [1.0] * 500


async def test_settle_lets_a_streaming_read_finish_and_cancels_one_past_the_wait():
    stages = StageStore()
    server = _server(stages)
    state = torch.full((NUMEL,), 2.0)
    await stages.begin(1, [0, 1])
    await stages.lend(1, 2, 0, state[:500], reads=1)
    started, stall = asyncio.Event(), asyncio.Event()
    reader = asyncio.create_task(_read(server, 1, 0, 2, stall, started))
    await started.wait()
    settle = asyncio.create_task(stages.settle(1, 2, [0], wait_s=1e6))
    await asyncio.sleep(0.05)
    assert not settle.done()  # the read under way is let finish
    stall.set()
    assert await asyncio.wait_for(reader, HANG_GUARD_S) == [2.0] * 500
    await asyncio.wait_for(settle, HANG_GUARD_S)
    with pytest.raises(RoundMismatch, match="not computed"):
        await _read(server, 1, 0, 2)  # read in full: taken back

    await stages.lend(1, 2, 1, state[500:], reads=1)
    started, stall = asyncio.Event(), asyncio.Event()
    stuck = asyncio.create_task(_read(server, 1, 1, 2, stall, started))
    await started.wait()
    await asyncio.wait_for(stages.settle(1, 2, [1], wait_s=0.05), HANG_GUARD_S)
    assert stuck.done() and stuck.cancelled()  # it can read the state no more
    state.fill_(7.0)
    assert await _read(server, 1, 1, 2) == [2.0] * 500  # not read to the end: a copy for a late reader


async def test_a_round_this_worker_went_through_in_no_group_is_refused_at_once_with_its_round():
    # A partner one round behind asks for a round this worker trained alone:
    # the value will never come, and the answer says where this worker is.
    stages = StageStore()
    await stages.begin(2, [0])  # round 1 went by in no group
    with pytest.raises(RoundMismatch, match="no group stage") as refused:
        await asyncio.wait_for(stages.get(1, 1, 0, wait_s=1e6), HANG_GUARD_S)
    assert refused.value.current_round == 2
    # The round it is in keeps its values; one it has not reached is waited for.
    await stages.put(2, 1, 0, torch.ones(3))
    assert (await stages.get(2, 1, 0, wait_s=0.0)).tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(RoundMismatch, match="not ready"):
        await stages.get(3, 1, 0, wait_s=0.0)
