"""A reader cancelled while its wait times out must leave the lock as it found it.

Regression test for a hang the soak harness found: with asyncio.wait_for around
Condition.wait_for, a FetchSegment cancelled by its client at the moment its wait
timed out left the snapshot store's lock taken by an orphaned task, and the
worker's next publish() waited forever (a worker stuck at one round)."""

from __future__ import annotations

import asyncio

import torch

from peerd.worker.wire.stores import SnapshotStore
from peerd.worker.state.pull import StateBoard


async def _cancel_while_timing_out(condition: asyncio.Condition, reader) -> list:
    task = asyncio.create_task(reader())
    await asyncio.sleep(0)  # the reader now waits on the condition
    async with condition:  # taken elsewhere: the timed-out wait must queue to re-acquire it
        await asyncio.sleep(0.05)  # past the reader's wait_s
        task.cancel()  # its client gives up meanwhile
        await asyncio.sleep(0)
    return await asyncio.gather(task, return_exceptions=True)


async def test_snapshot_reader_cancelled_at_its_timeout_leaves_publish_working():
    store = SnapshotStore(4)
    await store.publish(0, torch.zeros(4))

    async def reader():
        async with store.hold(1, wait_s=0.01):
            pass

    [outcome] = await _cancel_while_timing_out(store._changed, reader)
    assert isinstance(outcome, asyncio.CancelledError)
    await asyncio.wait_for(store.publish(1, torch.ones(4)), 2.0)  # hung before the fix
    async with store.hold(1, wait_s=0.0) as vector:
        assert vector.tolist() == [1.0] * 4


async def test_state_reader_cancelled_at_its_timeout_leaves_capture_working():
    from peerd.worker.state.pull import StateMeta

    board = StateBoard(4, 2)

    async def reader():
        async with board.hold(5, wait_s=0.01):
            pass

    [outcome] = await _cancel_while_timing_out(board._changed, reader)
    assert isinstance(outcome, asyncio.CancelledError)
    await asyncio.wait_for(board.capture([torch.ones(2), torch.zeros(2)], StateMeta(5, 5, 0.1)), 2.0)
    assert not board.wanted
