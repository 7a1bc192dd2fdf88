"""What a worker serves: its parameters as they were at the start of each round.

At the start of round r the worker's flat vector becomes the snapshot of round
r: handed over as it is when the model is on the CPU (the round then writes the
new model into another buffer, and the model moves there), copied when it is on
a GPU. A partner fetching segment s of round r reads that snapshot, so serving
never waits on the worker's own exchanges and never sees a half-averaged vector.
Two rounds are kept, because a partner may still be finishing round r while this
worker starts round r+1.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass

import numpy as np
import torch

from peerd.core.segments import Span, chunk_spans, split_even
from peerd.errors import InvalidMessage, JobMismatch, RoundMismatch
from peerd.worker.wire import quant
from peerd.worker.wire.finalstore import FinalStore  # importable from here
from peerd.worker.wire.values import FINAL_STAGE, STAGES, to_wire  # FINAL_STAGE: still importable from here
from peerd.worker.wire.waits import wait_until  # importable from here

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


class _Slot:
    def __init__(self, numel: int, buffer: torch.Tensor | None = None) -> None:
        self.buffer = torch.empty(numel, dtype=torch.float32) if buffer is None else buffer
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

    async def hand_over(self, round_: int, vector: torch.Tensor) -> torch.Tensor:
        """Take `vector` itself as the snapshot of `round_`, without a copy, and
        return the buffer the caller goes on in (the caller must not write
        `vector` again): the oldest snapshot's, or a new one while a partner
        still reads that. Saves the 64 MB copy per round that `publish` makes,
        the largest cost peerd had over gloo (docs/benchmarks.md)."""
        if vector.shape != (self._numel,) or vector.dtype != torch.float32 or vector.device.type != "cpu":
            raise ValueError("hand_over takes a CPU float32 vector of the store's size")
        k = round_ % len(self._slots)
        async with self._changed:
            old = self._slots[k]
            spare = old.buffer if not old.readers else torch.empty(self._numel, dtype=torch.float32)
            self._slots[k] = _Slot(self._numel, vector)
            self._slots[k].round = round_
            self.current_round = round_
            self._changed.notify_all()
        return spare

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


class StageStore:
    """What an owner computes in a hierarchical round (peerd.core.groups): stage 1
    is its in-group average of a segment it owns, stage 2 that average mixed
    with the partner group's. Kept two rounds, like snapshots.

    A pair round (peerd.worker.round.pair) and a hierarchical round that writes a new
    state *lend* their stage 2 values instead: views of the new state, served
    until read, then taken back before the state is trained on (`lend`, then
    `reclaim` or `settle`). A value can also be refused (`refuse`): the owner
    could not compute it, and a request is answered at once."""

    def __init__(self, keep: int = KEEP_ROUNDS) -> None:
        self._keep = keep
        self._owned: dict[int, frozenset[int]] = {}  # round -> segments this worker owns in it
        # (round, stage, segment) -> the value, or None for one refused or reclaimed
        self._values: dict[tuple[int, int, int], torch.Tensor | None] = {}
        self._wanted: dict[tuple[int, int, int], int] = {}  # a lent value's reads still to come
        self._reading: dict[tuple[int, int, int], set[asyncio.Task]] = {}  # tasks streaming a value now
        self._drained: dict[tuple[int, int, int], asyncio.Event] = {}  # set when a reclaimed value's reads stop
        # Buffers this store handed out (`buffer`), by address, and those free
        # again: a new 16 MiB tensor per round cost ~4000 page faults (9 % of a
        # hierarchical round's CPU), a recycled one none.
        self._mine: dict[int, torch.Tensor] = {}
        self._free: dict[int, list[torch.Tensor]] = {}  # by size
        self._changed = asyncio.Condition()
        self.current_round = -1
        self.finished = False

    async def begin(self, round_: int, owned: Iterable[int]) -> None:
        async with self._changed:
            self._owned[round_] = frozenset(owned)
            self.current_round = max(self.current_round, round_)
            oldest = self.current_round - self._keep + 1
            self._owned = {r: o for r, o in self._owned.items() if r >= oldest}
            dropped = [(k, v) for k, v in self._values.items() if k[0] < oldest]
            self._values = {k: v for k, v in self._values.items() if k[0] >= oldest}
            self._wanted = {k: v for k, v in self._wanted.items() if k[0] >= oldest}
            self._recycle(dropped)
            self._changed.notify_all()

    def buffer(self, numel: int) -> torch.Tensor:
        """A float32 tensor for this round, for a value to `put` or a scratch
        value: a recycled one when there is one. Valid until the next `begin`,
        which takes back every buffer no kept value holds; one a partner still
        reads then is left to the reader (and never recycled)."""
        free = self._free.get(numel)
        value = free.pop() if free else torch.empty(numel, dtype=torch.float32)
        self._mine[value.data_ptr()] = value
        return value

    def _recycle(self, dropped: list[tuple[tuple[int, int, int], torch.Tensor | None]]) -> None:
        """At the start of a round (the last one is over): every buffer handed
        out that no kept value holds is free again, unless a partner still
        reads it (then it is left to the reader)."""
        kept = {v.data_ptr() for v in self._values.values() if v is not None}
        read = {v.data_ptr() for k, v in dropped if v is not None and self._reading.get(k)}
        for ptr in [p for p in self._mine if p not in kept]:
            value = self._mine.pop(ptr)
            if ptr not in read:
                self._free.setdefault(value.numel(), []).append(value)

    async def put(self, round_: int, stage: int, segment: int, value: torch.Tensor) -> None:
        async with self._changed:
            if round_ in self._owned:
                self._values[round_, stage, segment] = value
                self._changed.notify_all()

    async def refuse(self, round_: int, stage: int, segment: int) -> None:
        """This worker will not have the value: a request for it is refused at once."""
        async with self._changed:
            if round_ in self._owned:
                self._values[round_, stage, segment] = None
                self._changed.notify_all()

    async def lend(self, round_: int, stage: int, segment: int, value: torch.Tensor, reads: int) -> None:
        """Serve `value`, a view of the caller's own state, for `reads` reads.
        The caller must `reclaim` or `settle` it before writing there again."""
        await self.put(round_, stage, segment, value)
        self._wanted[round_, stage, segment] = reads

    async def reclaim(self, round_: int, stage: int, segments: Iterable[int], wait_s: float) -> None:
        """Wait up to wait_s for the lent values' reads, then take them back:
        later requests are refused, and reads still streaming are cancelled
        (their partner counts a miss) and waited for, so that nothing reads
        them once this returns."""
        keys = [(round_, stage, s) for s in segments]
        async with self._changed:
            await wait_until(self._changed, lambda: all(self._wanted.get(k, 0) <= 0 for k in keys), wait_s)
            self._take_back(keys, {})
        await self._stop_reads(keys)

    async def settle(self, round_: int, stage: int, segments: Iterable[int], wait_s: float) -> None:
        """End a loan when its round is over: let the reads of the lent values
        that are streaming finish (up to wait_s; a reader that has not come is
        not waited for), then take back those read as often as they were lent
        for, and serve the others from a copy from now on: a reader still to
        come (a late member) gets the value as if it had been put, for the
        rounds a value is kept. A read still streaming after wait_s is
        cancelled, as in `reclaim`."""
        keys = [(round_, stage, s) for s in segments]
        until = time.monotonic() + wait_s
        for key in keys:
            await self._drain(key, max(0.0, until - time.monotonic()))
        async with self._changed:
            copies = {k: self.buffer(v.numel()).copy_(v) for k in keys
                      if self._wanted.get(k, 0) > 0 and (v := self._values.get(k)) is not None}
            self._take_back(keys, copies)
        await self._stop_reads(keys)

    def _take_back(self, keys: list[tuple[int, int, int]], copies: dict[tuple[int, int, int], torch.Tensor]) -> None:
        """Lent values refused from now on, or served from `copies` (the lock held)."""
        for key in keys:
            self._wanted.pop(key, None)
            if key[0] in self._owned:
                self._values[key] = copies.get(key)
        self._changed.notify_all()

    async def _stop_reads(self, keys: list[tuple[int, int, int]]) -> None:
        """Cancel the reads of taken-back values still streaming, and wait for them."""
        me = asyncio.current_task()
        for key in keys:
            reading = self._reading.get(key, set()) - {me}
            for task in reading:
                task.cancel()
            if reading:
                await self._drain(key, None)

    async def _drain(self, key: tuple[int, int, int], wait_s: float | None) -> None:
        """Wait until nobody reads `key` (up to wait_s; None: as long as it takes)."""
        if not self._reading.get(key):
            return
        drained = self._drained[key] = asyncio.Event()
        try:
            await asyncio.wait_for(drained.wait(), wait_s)
        except TimeoutError:
            pass
        finally:
            self._drained.pop(key, None)

    async def finish(self) -> None:
        async with self._changed:
            self.finished = True
            self._changed.notify_all()

    async def get(self, round_: int, stage: int, segment: int, wait_s: float) -> torch.Tensor:
        """The value, waited for up to wait_s. A value that will never come (this
        worker is past the round or went through it in no group, does not own
        the segment, or refused it) is refused at once, with this worker's round:
        a partner one round behind then steps up instead of waiting out its
        deadline for a round this worker skipped."""
        key = (round_, stage, segment)

        def gone() -> bool:  # a round this worker is past, or went through in no group
            return round_ < self.current_round and round_ not in self._owned

        def settled() -> bool:
            return key in self._values or self.finished or gone() or (
                round_ in self._owned and segment not in self._owned[round_])

        async with self._changed:
            await wait_until(self._changed, settled, wait_s)
            value = self._values.get(key)
            if value is None:
                owns = segment in self._owned.get(round_, (segment,))
                why = ("no group stage of that round here" if gone() else
                       f"segment {segment} not owned here" if not owns else
                       f"stage {stage} of segment {segment} not " + ("computed" if key in self._values else "ready"))
                raise RoundMismatch(f"round {round_}: {why} (peer in round {self.current_round})", self.current_round)
            return value

    @asynccontextmanager
    async def hold(self, round_: int, stage: int, segment: int, wait_s: float) -> AsyncIterator[torch.Tensor]:
        """`get`, and the value counted as read once the caller is through with
        it; `reclaim` cancels the caller while it is still reading a lent value."""
        key = (round_, stage, segment)
        value = await self.get(round_, stage, segment, wait_s)
        task = asyncio.current_task()
        reading = self._reading.setdefault(key, set())
        reading.add(task)
        read = False
        try:
            yield value
            read = True
        finally:
            if read and key in self._wanted:  # counted before anyone hears the read is over
                self._wanted[key] -= 1
            reading.discard(task)
            if not reading:
                self._reading.pop(key, None)
                if key in self._drained:
                    self._drained[key].set()
        if read and key in self._wanted:
            async with self._changed:
                self._changed.notify_all()


class SegmentServer:
    """Serves this worker's snapshots and stage values, chunked.
    Transport-independent: the gRPC servicer and the in-memory twin both call it."""

    def __init__(
        self, identity: Identity, store: SnapshotStore, segments: int, chunk_elems: int,
        stages: StageStore | None = None, wire: str = "fp32", final: FinalStore | None = None,
    ) -> None:
        self.identity = identity
        self.store = store
        self.stages = stages or StageStore()
        self.final = final or FinalStore()
        self.chunk_elems = chunk_elems
        self.wire = wire
        self.layout: list[Span] = split_even(store.numel, segments)

    async def segment(
        self, job: str, fingerprint: str, round_: int, segment: int, wait_s: float, stage: int = 0,
        chunk_elems: int = 0,
    ) -> AsyncIterator[tuple[int, int, np.ndarray]]:
        """(offset, total, data) chunks of one segment of one round, of
        `chunk_elems` (default: the server's) elements; data is a view into the
        snapshot (fp32 on the wire), valid until the next chunk is asked for."""
        chunk_elems = chunk_elems or self.chunk_elems
        if self.wire == "int8":  # whole blocks in every chunk but the last (peerd.worker.wire.quant)
            chunk_elems = -(-chunk_elems // quant.BLOCK) * quant.BLOCK
        check_identity(self.identity, job, fingerprint)
        if stage not in STAGES:
            raise InvalidMessage(f"stage {stage} out of range 0..{max(STAGES)}", "bad_segment")
        if stage >= FINAL_STAGE:  # the end consensus (peerd.worker.wire.finalstore)
            async with aclosing(self.final.serve(round_, segment, wait_s, stage, chunk_elems, self.layout)) as chunks:
                async for chunk in chunks:
                    yield chunk
            return
        if not 0 <= segment < len(self.layout):
            raise InvalidMessage(f"segment {segment} out of range 0..{len(self.layout) - 1}", "bad_segment")
        span = self.layout[segment]
        if stage:
            async with self.stages.hold(round_, stage, segment, wait_s) as value:
                for piece in chunk_spans(span.size, chunk_elems):
                    yield piece.start, span.size, to_wire(value[piece.start : piece.stop], self.wire)
            return
        async with self.store.hold(round_, wait_s) as vector:
            for piece in chunk_spans(span.size, chunk_elems):
                yield piece.start, span.size, to_wire(vector[span.start + piece.start : span.start + piece.stop], self.wire)
