"""Full training state for newcomers (docs/algorithms.md §1.8): capture, serve, pull, verify.

A donor captures its state (peerd.worker.state.trainstate: the vector, and the
small extra part) between two of its local steps when someone asks for it (at
once while its training waits for a round, else after the step under way: not
at the end of its round, which a joiner waited for), so a range it serves
never holds half a local step. A joiner cuts the state into a few ranges per
donor and pulls them in parallel, each donor the next free range as soon as it
has served one (no single donor carries every joiner, as hivemind's averager
found; no slow donor holds the pull up), checks each range against its SHA-256
and for finite values, and asks another donor for a range whose donor fails.
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

from peerd.core.pullplan import PullPlan, Stop, Wait, one_donor_if_apart
from peerd.core.segments import Span, chunk_spans, split_even
from peerd.errors import InvalidMessage, PeerUnavailable, PeerdError
from peerd.worker.wire.codec import all_finite
from peerd.worker.wire.stores import Identity, SnapshotStore, check_identity, wait_until

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
            if self.finished:  # its last copy may be far behind the job: never handed on
                raise PeerUnavailable("this worker's part in the job is over: it hands on no state")
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
    The schedule is peerd.core.pullplan's; this carries it out.
    """
    if not donors:
        raise PeerUnavailable("no donor to take the state from")
    pull = _Pull(transport, donors, numel, timeout_s)
    await pull.run()
    plan = pull.plan
    pull.log_sources()
    if missing := plan.missing():
        span = pull.spans[missing[0]]
        raise PeerUnavailable(f"state range {span.start}..{span.stop}: " + plan.why(missing[0]))
    pieces = [(pull.metas[k].round, d) for k, d in plan.kept.items()]
    if (donor := one_donor_if_apart(pieces, max_round_spread)) is not None:
        # The donors disagree (e.g. one was cut off by a partition and trained
        # alone): ranges of different models pieced together are no model at all.
        return await pull_state(transport, {donor: donors[donor]}, numel, timeout_s)
    newest = max((pull.metas[k] for k in plan.kept), key=lambda m: (m.round, m.step))
    return pull.out, newest, plan.used()


class _Pull:
    """One pull_state: a loop per donor asks the plan what to fetch, fetches it
    and tells the plan how it went, until the plan says Stop. A loop never
    stops on its own once every range is in: a copy being called off may have
    ended corrupt first, voiding ranges someone must fetch again."""

    def __init__(self, transport, donors: dict[str, str], numel: int, timeout_s: float) -> None:
        self.transport = transport
        self.donors = donors
        self.spans = split_even(numel, min(len(donors) * RANGES_PER_DONOR, numel))
        self.timeout_s = timeout_s
        self.plan = PullPlan(len(self.spans), tuple(sorted(donors)))
        self.out = torch.empty(numel, dtype=torch.float32)
        self.metas: dict[int, StateMeta] = {}  # each kept range's
        self.first_s: dict[str, float] = {}  # each donor's wait for its first chunk (its capture), for the log
        self.fetches: dict[tuple[int, str], asyncio.Task] = {}  # (range, donor) under way
        self.changed = asyncio.Event()  # a fetch ended: what is open may have changed

    async def run(self) -> None:
        loops = [asyncio.ensure_future(self.serve_from(d)) for d in self.plan.donors]
        try:
            await asyncio.gather(*loops)
        finally:
            for task in loops:
                task.cancel()
            for task in self.fetches.values():
                task.cancel()
            await asyncio.gather(*loops, *self.fetches.values(), return_exceptions=True)

    async def serve_from(self, donor: str) -> None:
        while not isinstance(step := self.plan.assign(donor), Stop):
            if isinstance(step, Wait):
                self.changed.clear()
                await self.changed.wait()
            else:
                await self.fetch(donor, step.index)

    async def fetch(self, donor: str, k: int) -> None:
        task = asyncio.ensure_future(self.transport.fetch_state(self.donors[donor], self.spans[k], self.timeout_s))
        self.fetches[k, donor] = task
        try:
            part = await task
        except asyncio.CancelledError:
            if asyncio.current_task().cancelling():
                raise
            self.plan.cancelled(donor, k)  # another donor's copy of this range came first
            return
        except PeerdError as exc:
            # It serves no more; if what it sent was corrupt, none of its ranges is kept.
            self.plan.failed(donor, k, f"{donor}: {exc}", corrupt=isinstance(exc, InvalidMessage))
            return
        finally:
            del self.fetches[k, donor]
            self.changed.set()
        if not self.plan.arrived(donor, k):
            return
        span = self.spans[k]
        self.out[span.start : span.stop] = part.values
        self.metas[k] = part.meta
        self.first_s.setdefault(donor, part.first_s)
        for other in self.plan.serving[k]:  # copies no longer needed
            self.fetches[k, other].cancel()

    def log_sources(self) -> None:
        for donor in self.plan.used():  # a donor voided for corruption has none
            mine = self.plan.ranges_from(donor)
            log.info("state from %s: %d of %d ranges (round %d), first chunk after %.2fs", donor,
                     len(mine), self.plan.ranges, max(self.metas[k].round for k in mine), self.first_s[donor])
