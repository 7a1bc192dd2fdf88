"""Full training state for newcomers (docs/algorithms.md §1.8): capture, serve, pull, verify.

A donor captures its state (peerd.worker.trainstate: the vector, and the
small extra part) between two of its local steps when someone asks for it (at
once while its training waits for a round, else after the step under way: not
at the end of its round, which a joiner waited for), so a range it serves
never holds half a local step. A joiner cuts
the state into a few ranges per donor and pulls them in parallel, each donor
the next free range as soon as it has served one (no single donor carries
every joiner: hivemind issue #169; no slow donor holds the pull up), checks
each range against its SHA-256 and for finite values, and asks another donor
for a range whose donor fails.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

import torch

from peerd.core.segments import Span, chunk_spans, split_even
from peerd.errors import InvalidMessage, PeerUnavailable, PeerdError
from peerd.worker.codec import all_finite
from peerd.worker.snapshots import Identity, SnapshotStore, check_identity, wait_until

log = logging.getLogger("peerd.worker")

# A joiner cuts the state into this many ranges per donor and hands them out as
# donors become free (pull_state): a donor that starts late serves fewer.
RANGES_PER_DONOR = 4
# A donor's capture serves the ranges asked in its round and this many after it:
# a joiner's ranges from one donor arrive over a second or so, and a donor moving
# to its next round meanwhile made every later range wait for a fresh capture
# (0.15–0.5 s each, bench/bandwidth.py). Ranges are pieced from several donors'
# captures anyway; one round apart is what one more gossip round evens out.
CAPTURE_SERVES_ROUNDS = 1


@dataclass(frozen=True)
class StateMeta:
    round: int
    step: int
    progress: float  # epochs done, fractional
    extra: bytes = b""  # the state that is not the vector (TrainState.extra)


@dataclass(frozen=True)
class StatePart:
    meta: StateMeta
    span: Span
    values: torch.Tensor
    first_s: float = 0.0  # from the request to its first chunk: mostly the donor's wait for a capture


class _Capture:
    def __init__(self, numel: int) -> None:
        self.buffer = torch.empty(numel, dtype=torch.float32)
        self.meta: StateMeta | None = None
        self.readers = 0


class StateBoard:
    """The donor side: a copy of the state taken between two steps on request."""

    def __init__(self, numel: int, params: int) -> None:
        self._numel = numel  # the whole state vector
        self.params = params  # its first part, the one gossip averages
        self._capture = _Capture(numel)
        self._changed = asyncio.Condition()
        self._waiting = 0
        self.finished = False
        # Called (in the loop, synchronously) when a request starts waiting for a
        # capture: the engine takes one at once if its state is still.
        self.on_wanted: Callable[[], None] | None = None

    @property
    def numel(self) -> int:
        return self._numel

    @property
    def wanted(self) -> bool:
        """Someone waits for a capture: the round loop should call capture()."""
        return self._waiting > 0

    async def capture(self, parts: Sequence[torch.Tensor], meta: StateMeta | Callable[[], StateMeta],
                      when: Callable[[], bool] | None = None) -> bool:
        """Copy the state; `meta` may be a function, called at the copy. Never
        waits: a capture still being read is left to its readers and replaced.
        With `when`, copy only if it holds at the copy: it is checked under the
        lock with nothing awaited before the copy, so a state that another
        thread may move again after `when` turns false is never half-copied."""
        async with self._changed:
            if when is not None and not when():
                return False
            if callable(meta):
                meta = meta()
            if self._capture.readers:
                self._capture = _Capture(self.numel)
            offset = 0
            for part in parts:  # slice by slice: the parts may live on a GPU, the buffer does not
                self._capture.buffer[offset : offset + part.numel()].copy_(part.reshape(-1))
                offset += part.numel()
            self._capture.meta = meta
            self._changed.notify_all()
        return True

    async def finish(self) -> None:
        async with self._changed:
            self.finished = True
            self._changed.notify_all()

    @asynccontextmanager
    async def hold(self, current_round: int, wait_s: float) -> AsyncIterator[tuple[torch.Tensor, StateMeta]]:
        """A capture of `current_round` or later, taken now if needed (up to wait_s)."""
        async with self._changed:
            def fresh() -> bool:
                meta = self._capture.meta
                return meta is not None and meta.round >= current_round

            if not fresh() and not self.finished:
                self._waiting += 1
                if self.on_wanted is not None:
                    self.on_wanted()
                try:
                    await wait_until(self._changed, lambda: fresh() or self.finished, wait_s)
                finally:
                    self._waiting -= 1
            capture = self._capture
            if capture.meta is None:
                raise PeerUnavailable("no state captured yet")
            capture.readers += 1
        try:
            yield capture.buffer, capture.meta
        finally:
            capture.readers -= 1


class StateServer:
    """Serves ranges of a StateBoard, chunked; the gRPC servicer and the
    in-memory twin both call it."""

    def __init__(self, identity: Identity, board: StateBoard, store: SnapshotStore, chunk_elems: int) -> None:
        self.identity = identity
        self.board = board
        self.store = store
        self.chunk_elems = chunk_elems

    async def state(
        self, job: str, fingerprint: str, offset: int, length: int, wait_s: float, peer: str = "",
    ) -> AsyncIterator[tuple[StateMeta, int, int, bytes, bytes]]:
        """(meta, offset, total, sha256 on the first chunk, data) chunks of a range."""
        check_identity(self.identity, job, fingerprint)
        total = self.board.numel
        if length == 0 or offset + length > total:
            raise InvalidMessage(f"state range {offset}+{length} outside 0..{total}", "bad_range")
        asked = time.monotonic()
        async with self.board.hold(self.store.current_round - CAPTURE_SERVES_ROUNDS, wait_s) as (vector, meta):
            held = time.monotonic()
            values = vector[offset : offset + length]
            sha = digest(values, meta.extra)
            for piece in chunk_spans(length, self.chunk_elems):
                yield meta, offset + piece.start, total, sha, values[piece.start : piece.stop].numpy().tobytes()
                sha = b""
        # Joins are rare and their time matters (docs/benchmarks.md): say where it went.
        log.info("served state range %d+%d of round %d to %r: capture after %.2fs, sent in %.2fs",
                 offset, length, meta.round, peer or "?", held - asked, time.monotonic() - held)


def digest(values: torch.Tensor, extra: bytes = b"") -> bytes:
    """A range's checksum: its values, then the state's extra part, which
    travels with every range."""
    h = hashlib.sha256(values.numpy().tobytes())
    h.update(extra)
    return h.digest()


def verify_part(part: StatePart, sha256: bytes) -> None:
    if part.values.numel() != part.span.size:
        raise InvalidMessage(f"state range {part.span} arrived with {part.values.numel()} elements", "wrong_length")
    if digest(part.values, part.meta.extra) != sha256:
        raise InvalidMessage(f"state range {part.span.start}..{part.span.stop} failed its checksum", "bad_checksum")
    if not all_finite(part.values):
        raise InvalidMessage(f"state range {part.span.start}..{part.span.stop} holds non-finite values", "non_finite")
    if not math.isfinite(part.meta.progress) or part.meta.progress < 0:
        raise InvalidMessage(f"state range came with a bad progress value {part.meta.progress}", "bad_progress")


async def pull_state(
    transport, donors: dict[str, str], numel: int, timeout_s: float, max_round_spread: int = 10,
) -> tuple[torch.Tensor, StateMeta, list[str]]:
    """The state vector assembled from ranges pulled from `donors` in parallel.

    Returns the vector, the newest meta among the ranges, and the donors used.
    The state is cut into RANGES_PER_DONOR ranges per donor, and each donor is
    asked for the next range not taken yet as soon as it has served one: a
    donor whose capture comes late (a slow peer finishing its step) serves
    fewer, and once none is left a free donor also asks for a range another is
    still serving, the first copy to arrive winning, so a straggler holds up no
    range. A donor that fails serves no more; its range goes to the others, and
    so do the ranges it served already if what it sent was corrupt.
    Ranges whose rounds differ by more than `max_round_spread` are not pieced
    together: the whole state is then taken from one donor.
    """
    if not donors:
        raise PeerUnavailable("no donor to take the state from")
    ids = sorted(donors)
    spans = split_even(numel, min(len(ids) * RANGES_PER_DONOR, numel))
    out = torch.empty(numel, dtype=torch.float32)
    results: dict[int, tuple[StateMeta, str]] = {}
    tried: dict[int, set[str]] = {k: set() for k in range(len(spans))}
    serving: dict[int, dict[str, asyncio.Task]] = {k: {} for k in range(len(spans))}
    errors: dict[int, list[str]] = {k: [] for k in range(len(spans))}
    alive = set(ids)
    first_s: dict[str, float] = {}  # each donor's wait for its first chunk (its capture), for the log
    changed = asyncio.Event()  # a range arrived or a donor failed: what is open may have changed

    def next_range(donor: str) -> int | None:
        """A range nobody serves, else one a single other donor is still serving."""
        open_ = [k for k in range(len(spans)) if k not in results and donor not in tried[k]]
        fresh = [k for k in open_ if not serving[k]]
        hedge = [k for k in open_ if len(serving[k]) == 1]
        return (fresh or hedge or [None])[0]

    async def serve_from(donor: str) -> None:
        while donor in alive and len(results) < len(spans):
            k = next_range(donor)
            if k is None:
                if not any(serving.values()):  # nothing in flight: nothing will open up
                    return
                changed.clear()
                await changed.wait()
                continue
            tried[k].add(donor)
            task = asyncio.ensure_future(transport.fetch_state(donors[donor], spans[k], timeout_s))
            serving[k][donor] = task
            try:
                part = await task
            except asyncio.CancelledError:
                if asyncio.current_task().cancelling():
                    raise
                continue  # another donor's copy of this range came first
            except PeerdError as exc:
                errors[k].append(f"{donor}: {exc}")
                alive.discard(donor)
                if isinstance(exc, InvalidMessage):  # it sent a corrupt range: trust none of its others
                    for j in [j for j, (_, d) in results.items() if d == donor]:
                        del results[j]
                return
            finally:
                serving[k].pop(donor, None)
                changed.set()
            if k in results:
                continue
            span = spans[k]
            out[span.start : span.stop] = part.values
            results[k] = (part.meta, donor)
            first_s.setdefault(donor, part.first_s)
            for other in list(serving[k].values()):
                other.cancel()

    loops = [asyncio.ensure_future(serve_from(d)) for d in ids]
    try:
        await asyncio.gather(*loops)
    finally:
        for task in loops:
            task.cancel()
        for tasks in serving.values():
            for task in tasks.values():
                task.cancel()
        await asyncio.gather(*loops, *(t for tasks in serving.values() for t in tasks.values()),
                             return_exceptions=True)
    for donor in sorted({d for _, d in results.values()}):  # a donor voided for corruption has none
        mine = [k for k, (_, d) in results.items() if d == donor]
        log.info("state from %s: %d of %d ranges (round %d), first chunk after %.2fs", donor,
                 len(mine), len(spans), max(results[k][0].round for k in mine), first_s[donor])
    if missing := [k for k in range(len(spans)) if k not in results]:
        k = missing[0]
        raise PeerUnavailable(f"state range {spans[k].start}..{spans[k].stop}: " + "; ".join(errors[k]))
    rounds = sorted(meta.round for meta, _ in results.values())
    if len({d for _, d in results.values()}) > 1 and rounds[-1] - rounds[0] > max_round_spread:
        # The donors disagree (e.g. one was cut off by a partition and trained
        # alone): ranges of different models pieced together are no model at all.
        # Take everything from one donor, the one in the middle of the rounds.
        median = rounds[len(rounds) // 2]
        donor = next(d for meta, d in results.values() if meta.round == median)
        return await pull_state(transport, {donor: donors[donor]}, numel, timeout_s)
    newest = max((meta for meta, _ in results.values()), key=lambda m: (m.round, m.step))
    return out, newest, sorted({donor for _, donor in results.values()})
