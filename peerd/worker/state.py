"""Full training state for newcomers (DESIGN §1.8): capture, serve, pull, verify.

A donor captures its state (peerd.worker.trainstate: the vector, and the
small extra part) between two of its local steps when someone asks for it (at
once while its training waits for a round, else after the step under way: not
at the end of its round, which a joiner waited for), so a range it serves
never holds half a local step. A joiner cuts
the state into one range per donor and pulls them in parallel (no single donor
carries every joiner: hivemind issue #169), checks each range against its
SHA-256 and for finite values, and retries a failed range with another donor.
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
        async with self.board.hold(self.store.current_round, wait_s) as (vector, meta):
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
    A range whose donor fails is retried once with each other donor. Ranges
    whose rounds differ by more than `max_round_spread` are not pieced
    together: the whole state is then taken from one donor.
    """
    if not donors:
        raise PeerUnavailable("no donor to take the state from")
    ids = sorted(donors)
    spans = split_even(numel, min(len(ids), numel))
    out = torch.empty(numel, dtype=torch.float32)

    async def one(k: int, span: Span) -> tuple[StateMeta, str]:
        errors = []
        for donor in ids[k:] + ids[:k]:  # its own donor first, then the others
            try:
                asked = time.monotonic()
                part = await transport.fetch_state(donors[donor], span, timeout_s)
                out[span.start : span.stop] = part.values
                log.info("state range %d+%d of round %d from %s: first chunk after %.2fs, verified after %.2fs",
                         span.start, span.size, part.meta.round, donor, part.first_s, time.monotonic() - asked)
                return part.meta, donor
            except PeerdError as exc:
                errors.append(f"{donor}: {exc}")
        raise PeerUnavailable(f"state range {span.start}..{span.stop}: " + "; ".join(errors))

    results = await asyncio.gather(*(one(k, span) for k, span in enumerate(spans)))
    rounds = sorted(meta.round for meta, _ in results)
    if len(donors) > 1 and rounds[-1] - rounds[0] > max_round_spread:
        # The donors disagree (e.g. one was cut off by a partition and trained
        # alone): ranges of different models pieced together are no model at all.
        # Take everything from one donor, the one in the middle of the rounds.
        median = rounds[len(rounds) // 2]
        donor = next(d for meta, d in results if meta.round == median)
        return await pull_state(transport, {donor: donors[donor]}, numel, timeout_s)
    newest = max((meta for meta, _ in results), key=lambda m: (m.round, m.step))
    return out, newest, sorted({donor for _, donor in results})
