"""The exact average of the peers' whole models: at the job's end when the
way by parts cannot end (peerd.worker.state.endparts), and for an export.

Each peer pulls the whole model of every peer in its view (at the end its
final model, stage 3, fp32: the parameters and every buffer,
peerd.worker.state.finalmodel), waiting a bounded time for the last of them to
get there; the consensus is the mean over the peers whose whole model arrived,
summed in sorted-id order (peerd.core.consensus). Peers that got the same set
therefore hold the same model, bit for bit, and the same as the way by parts
gives for that set. An export averages the same way over the round snapshots
(stage 0) of one round, which the others serve anyway, so they need not take
part.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from peerd.core.consensus import ConsensusPlan, describe, plan_consensus
from peerd.core.segments import Span
from peerd.errors import InvalidMessage, PeerdError, Unauthenticated
from peerd.worker.wire.codec import finite_by_sum
from peerd.worker.state.finalmodel import largest_ints
from peerd.worker.state.modelfile import model_state
from peerd.worker.wire.stores import FINAL_STAGE, SnapshotStore
from peerd.worker.wire.transport import Transport

log = logging.getLogger("peerd.worker")

RETRY_PAUSE_S = 0.5  # between a peer's tries at the end, while its daemon still lists it


@dataclass
class Consensus:
    """An exact average and how it came about."""

    plan: ConsensusPlan
    vector: torch.Tensor  # the average (CPU, fp32)
    left_out: dict[str, str] = field(default_factory=dict)  # peer -> why its model is not in it
    seconds: float = 0.0
    own_gap: float = 0.0  # this peer's own model's relative L2 distance from the average
    owed_reads: int = 0  # reads of this peer's final values the others of the set still make (the finish waits)
    how: str = "whole models"  # how it came about: by parts (peerd.worker.state.endparts), or whole models

    @property
    def digest(self) -> str:
        """A short fingerprint of the values: equal on peers that hold the same model."""
        return hashlib.sha256(self.vector.numpy().tobytes()).hexdigest()[:16]

    def describe(self) -> str:
        return describe(self.plan, self.left_out)


@dataclass(frozen=True)
class Patience:
    """How long the end waits for a peer that has not sent its final model:
    asked again while `present(peer)` (its daemon still lists it serving the
    job: still training, or not answering yet), for at most `limit_s` in all
    (docs/algorithms.md, "One model at the end")."""

    present: Callable[[str], bool]
    limit_s: float


async def gather_models(
    transport: Transport, addresses: dict[str, str], layout: list[Span], timeout: float,
    round_: int = 0, stage: int = FINAL_STAGE, patience: Patience | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Every peer's whole vector (all its segments, all peers concurrently),
    under one deadline (each try's, and in all without `patience`); a peer counts
    only if every segment arrived finite. Returns the vectors and, for the
    others, why not."""
    numel = layout[-1].stop if layout else 0
    buffers = {p: torch.empty(numel, dtype=torch.float32) for p in addresses}

    async def whole(peer: str) -> None:
        buf, address = buffers[peer], addresses[peer]
        fetches = [asyncio.ensure_future(transport.fetch_segment(address, round_, s, buf[span.start : span.stop],
                                                                 timeout, stage)) for s, span in enumerate(layout)]
        try:
            await asyncio.gather(*fetches)
        finally:  # one segment failed (or the deadline): the others of this peer are not wanted
            for fetch in fetches:
                fetch.cancel()
            await asyncio.gather(*fetches, return_exceptions=True)

    async def one(peer: str) -> None:
        for tries in itertools.count(1):
            try:
                await asyncio.wait_for(whole(peer), timeout)
                break
            except (PeerdError, TimeoutError) as exc:
                # Without proof of the job secret between the two, asking again cannot help.
                if isinstance(exc, Unauthenticated) or patience is None or not patience.present(peer):
                    raise
                if tries == 1:
                    log.info("the end: waiting for %s's final model (its worker still serves the job: "
                             "still training, or slow to answer), up to %.0fs", peer, patience.limit_s)
            await asyncio.sleep(RETRY_PAUSE_S)  # a refused connection answers at once: not a busy loop
        if not finite_by_sum(buffers[peer]):
            raise InvalidMessage(f"{peer} sent non-finite values", "non_finite")

    tasks = {p: asyncio.ensure_future(one(p)) for p in addresses}
    done: set[asyncio.Future] = set()
    try:
        if tasks:
            done, _ = await asyncio.wait(tasks.values(), timeout=patience.limit_s if patience else timeout)
    finally:  # the deadline, or this gather cancelled (a leave): no fetch outlives it, none unretrieved
        for task in tasks.values():
            task.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
    got, why = {}, {}
    for peer, task in tasks.items():
        if task in done and task.cancelled():  # grpc.aio cancels a call whose channel closed under it
            why[peer] = "its transfer was cancelled"
            continue
        exc = task.exception() if task in done else TimeoutError("deadline")
        if exc is None:
            got[peer] = buffers[peer]
        elif isinstance(exc, (PeerdError, TimeoutError)):
            why[peer] = str(exc) or type(exc).__name__
        else:
            raise exc  # a bug, not a partner's fault
    return got, why


def exact_average(plan: ConsensusPlan, models: dict[str, torch.Tensor]) -> torch.Tensor:
    """The plan's weighted mean, summed in the plan's order. No fused
    multiply-add (equal weights: sum, then one division; else each term
    rounded, then added), so machines with different vector units agree.
    Where every member holds the same value the mean is that value, bit for
    bit ((a + a + a) / 3 can be a ulp off a in fp32): a frozen parameter or
    frozen statistics come out of the consensus unchanged."""
    first = models[plan.members[0]]
    out = first.clone()
    same, equal = torch.ones_like(first, dtype=torch.bool), torch.empty_like(first, dtype=torch.bool)
    if not plan.uniform:
        out.mul_(plan.weights[0])
    for peer, w in zip(plan.members[1:], plan.weights[1:]):
        out.add_(models[peer] if plan.uniform else models[peer].mul(w))
        same.logical_and_(torch.eq(models[peer], first, out=equal))
    if plan.uniform:
        out.div_(plan.size)
    return torch.where(same, first, out, out=out)


def mean_of(plan: ConsensusPlan, models: dict[str, torch.Tensor], int_tail: int = 0) -> torch.Tensor:
    """The exact average, but the last `int_tail` elements (integer buffers,
    finalmodel) the largest value among the members, not a mean."""
    out = exact_average(plan, models)
    if int_tail:
        out[-int_tail:] = largest_ints([models[p][-int_tail:] for p in plan.members])
    return out


@dataclass(frozen=True)
class Models:
    """Which models a consensus averages: the final ones, or one round's snapshots
    (stage 0); and, for final ones, how long members still in the job are waited for."""

    round: int = 0
    stage: int = FINAL_STAGE
    patience: Patience | None = None


FINAL_MODELS = Models()


async def average_models(
    me: str, own: torch.Tensor, addresses: dict[str, str], layout: list[Span], transport: Transport,
    timeout: float, which: Models = FINAL_MODELS, int_tail: int = 0,
) -> Consensus:
    """Pull the others' models (final ones, or one round's snapshots) and
    average them with `own` (a CPU fp32 copy of this peer's). The last
    `int_tail` elements hold integer buffers (finalmodel): the largest value
    among the members, not a mean."""
    started = time.monotonic()
    others = {p: a for p, a in addresses.items() if p != me and a}
    models, left_out = await gather_models(transport, others, layout, timeout, which.round, which.stage,
                                           which.patience)
    plan = plan_consensus(me, models)
    models[me] = own
    vector = own.clone() if plan.alone else mean_of(plan, models, int_tail)
    return Consensus(plan, vector, left_out, time.monotonic() - started,
                     distance_from_consensus(own, vector, int_tail))


def distance_from_consensus(own: torch.Tensor, mean: torch.Tensor, int_tail: int = 0) -> float:
    """How far a peer's own model was from the average, relative to the
    average's norm (integer buffers left out): what gossip left to the final
    exchange. Near 0 when the peers trained together."""
    end = own.numel() - int_tail
    norm = float(mean[:end].norm())
    return float((own[:end] - mean[:end]).norm()) / norm if norm > 0 else 0.0


async def round_consensus(me: str, store: SnapshotStore, round_: int, vector: torch.Tensor,
                          addresses: dict[str, str], layout: list[Span], transport: Transport,
                          timeout: float) -> Consensus:
    """peerctl export: the average of round `round_`'s snapshots, this peer's
    own (or, with none held, its model of now) and the others'."""
    try:
        async with store.hold(round_, 0.0) as snapshot:
            own = snapshot.clone()
    except PeerdError:  # nothing published for this round (alone, overlapped): the model of now
        own = vector.detach().to("cpu", copy=True)
    return await average_models(me, own, addresses, layout, transport, timeout, Models(round_, 0))


def state_with(model: nn.Module, vector: torch.Tensor, values: torch.Tensor) -> dict[str, torch.Tensor]:
    """The model's state_dict (CPU copies) as it would be with `values` in the
    gossiped `vector`; the model is left as it was. Synchronous: nothing else
    runs on the vector meanwhile."""
    live = vector.detach().clone()
    vector.copy_(values)
    try:
        return model_state(model)
    finally:
        vector.copy_(live)
