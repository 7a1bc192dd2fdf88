"""What a worker serves: its parameters as they were at the start of each round.

At the start of round r the worker copies its flat vector into a snapshot; a
partner fetching segment s of round r reads that copy, so serving never waits
on the worker's own exchanges and never sees a half-averaged vector. Two rounds
are kept, because a partner may still be finishing round r while this worker
starts round r+1.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import numpy as np
import torch

from peerd.core.segments import Span, chunk_spans, split_even
from peerd.errors import JobMismatch, RoundMismatch

KEEP_ROUNDS = 2


@dataclass(frozen=True)
class Identity:
    """Who a worker is and what it trains: checked on every exchange."""

    job: str
    fingerprint: str
    peer_id: str


def check_identity(identity: Identity, job: str, fingerprint: str) -> None:
    """Refuse a request for another job, or for the same job with another spec or model."""
    if job != identity.job or fingerprint != identity.fingerprint:
        raise JobMismatch(
            f"job mismatch: this worker runs {identity.job!r} with fingerprint "
            f"{identity.fingerprint}, the request is for {job!r} with {fingerprint}"
        )


async def wait_until(changed: asyncio.Condition, predicate, wait_s: float) -> None:
    """Wait (holding `changed`) until predicate() or wait_s passed, whichever is first.

    asyncio.timeout, not asyncio.wait_for: wait_for runs the wait in another task,
    and when the caller is cancelled (a partner gave up on its RPC) while that task
    still re-acquires the lock after the timeout, the caller leaves without the lock
    and the orphaned task takes it for good: the next publish() then hangs forever
    (found by the soak harness: workers stuck at one round)."""
    try:
        async with asyncio.timeout(max(wait_s, 0.0)):
            await changed.wait_for(predicate)
    except TimeoutError:
        pass


class _Slot:
    def __init__(self, numel: int) -> None:
        self.buffer = torch.empty(numel, dtype=torch.float32)
        self.round = -1
        self.readers = 0


class SnapshotStore:
    def __init__(self, numel: int, keep: int = KEEP_ROUNDS) -> None:
        self._numel = numel
        self._slots = [_Slot(numel) for _ in range(keep)]
        self._changed = asyncio.Condition()
        self.current_round = -1
        self.finished = False

    @property
    def numel(self) -> int:
        return self._numel

    async def publish(self, round_: int, vector: torch.Tensor) -> None:
        """Snapshot `vector` as this worker's state at the start of `round_`. Never
        waits: a slot a partner still reads is left to it and replaced."""
        k = round_ % len(self._slots)
        async with self._changed:
            if self._slots[k].readers:
                self._slots[k] = _Slot(self._numel)
            slot = self._slots[k]
            slot.buffer.copy_(vector)
            slot.round = round_
            self.current_round = round_
            self._changed.notify_all()

    async def finish(self) -> None:
        """No more rounds: partners waiting for one are answered at once."""
        async with self._changed:
            self.finished = True
            self._changed.notify_all()

    @asynccontextmanager
    async def hold(self, round_: int, wait_s: float) -> AsyncIterator[torch.Tensor]:
        """The snapshot of `round_`, waited for up to wait_s if this worker has not
        reached it, and kept from being overwritten while the caller reads it."""
        async with self._changed:
            if round_ > self.current_round and not self.finished:
                await wait_until(self._changed, lambda: self.current_round >= round_ or self.finished, wait_s)
            slot = self._slots[round_ % len(self._slots)]
            if round_ < 0 or slot.round != round_:
                state = "finished" if self.finished else "in"
                raise RoundMismatch(
                    f"round {round_} not held (peer {state} round {self.current_round})",
                    self.current_round,
                )
            slot.readers += 1
        try:
            yield slot.buffer
        finally:
            slot.readers -= 1  # no lock needed: the event loop runs one task at a time


class SegmentServer:
    """Serves this worker's snapshots, chunked. Transport-independent: the gRPC
    servicer and the in-memory twin both call it."""

    def __init__(self, identity: Identity, store: SnapshotStore, segments: int, chunk_elems: int) -> None:
        self.identity = identity
        self.store = store
        self.chunk_elems = chunk_elems
        self.layout: list[Span] = split_even(store.numel, segments)

    async def segment(
        self, job: str, fingerprint: str, round_: int, segment: int, wait_s: float
    ) -> AsyncIterator[tuple[int, int, np.ndarray]]:
        """(offset, total, data) chunks of one segment of one round; data is a view
        into the snapshot, valid until the next chunk is asked for."""
        check_identity(self.identity, job, fingerprint)
        if not 0 <= segment < len(self.layout):
            raise JobMismatch(f"segment {segment} out of range 0..{len(self.layout) - 1}")
        span = self.layout[segment]
        async with self.store.hold(round_, wait_s) as vector:
            for piece in chunk_spans(span.size, self.chunk_elems):
                yield piece.start, span.size, vector[span.start + piece.start : span.start + piece.stop].numpy()
