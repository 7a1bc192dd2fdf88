"""One model at the end, by parts (docs/algorithms.md, "One model at the end").

A finished peer publishes its final model (peerd.worker.state.finalmodel) and,
with the members it knows of in the job, averages it part by part: the plan
(peerd.core.endplan) cuts the vector into one part per member; this peer pulls
its own part from every member (stage 4), averages it in sorted-id order,
serves that average (stage 5) and pulls every other part's average from its
owner, or, when the owner fails, from a member that holds the whole average.
About two model sizes in and two out per peer, where pulling every whole model
costs n − 1 of each.

Members that fail are left out and the others plan again without them; a
member that names a set without one or two members (an owner refusing, or a
member asking for a part) is followed, as it saw them fail. When an owner
averages over a set this peer cannot tell, or three plans failed, it pulls
every member's whole model instead (peerd.worker.state.consensus), which gives
the same bits for the same set.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import dataclass, field

import torch

from peerd.core.consensus import plan_consensus
from peerd.core.endplan import EndPlan, Next, Refusal, after_attempt, plan_end, refusal, shrunk_to
from peerd.core.segments import Span
from peerd.errors import InvalidMessage, PeerdError, PeerUnavailable, RoundMismatch, Unauthenticated
from peerd.worker.state.consensus import (
    RETRY_PAUSE_S, Consensus, Models, Patience, average_models, distance_from_consensus, mean_of,
)
from peerd.worker.state.finalmodel import FinalModel
from peerd.worker.wire.codec import finite_by_sum
from peerd.worker.wire.finalstore import FinalStore
from peerd.worker.wire.transport import Transport
from peerd.worker.wire.values import FINAL_MEAN_STAGE, FINAL_PART_STAGE

log = logging.getLogger("peerd.worker")

GRACE_SHARE = 0.25  # of the end's time, kept past the wait for members still training: a plan again, or whole models


class _OtherSet(Exception):
    """An owner averages over another set (its plan's id): this plan cannot end here."""

    def __init__(self, plan_id: int) -> None:
        super().__init__(f"an owner averages over plan {plan_id:x}")
        self.plan_id = plan_id


@dataclass
class EndRun:
    """One peer's end consensus under way: what every step of it needs."""

    me: str
    own: torch.Tensor  # this peer's final model (published, never written)
    addresses: dict[str, str]  # the others in the job: their exchange addresses
    transport: Transport
    timeout: float  # one try's deadline
    patience: Patience | None
    until: float  # monotonic: every wait ends by then
    waits_until: float  # monotonic: members still in the job are asked again until then
    left_out: dict[str, str] = field(default_factory=dict)
    _told: set[tuple[str, int]] = field(default_factory=set)

    def again(self, peer: str) -> bool:
        """Ask `peer` again: it is still in the job and there is time."""
        return (self.patience is not None and self.patience.present(peer)
                and time.monotonic() + RETRY_PAUSE_S < self.waits_until)

    def note_wait(self, peer: str, stage: int) -> None:
        if (peer, stage) not in self._told:
            self._told.add((peer, stage))
            what = "final model" if stage == FINAL_PART_STAGE else "average of its part"
            log.info("the end: waiting for %s's %s (its worker still serves the job: still training, "
                     "or slow to answer), up to %.0fs", peer, what, max(self.waits_until - time.monotonic(), 0.0))


async def _pull(run: EndRun, peer: str, plan: EndPlan, part: int, out: torch.Tensor, stage: int,
                patient: bool = True) -> None:
    """Part `part` of `plan` (stage 4: `peer`'s final model; 5: its average)
    into `out`; asked again while `peer` is in the job when `patient` (not
    so a member asked whether it holds an average)."""
    for _ in itertools.count():
        limit = min(run.timeout, run.until - time.monotonic())
        if limit <= 0:
            raise TimeoutError("the end's time is spent")
        try:
            await _fetch(run, peer, plan, part, out, stage, limit)
            return
        except RoundMismatch as exc:
            said = refusal(plan.id, exc.current_round)
            if patient and said is Refusal.OTHER_SET:
                raise _OtherSet(exc.current_round) from None
            if not (patient and run.again(peer)):
                raise
        except (PeerdError, TimeoutError) as exc:
            # Without proof of the job secret, or with a bad reply, asking again cannot help.
            if isinstance(exc, (Unauthenticated, InvalidMessage)) or not (patient and run.again(peer)):
                raise
        run.note_wait(peer, stage)
        await asyncio.sleep(RETRY_PAUSE_S)  # a refused connection answers at once: not a busy loop


async def _fetch(run: EndRun, peer: str, plan: EndPlan, part: int, out: torch.Tensor, stage: int,
                 limit: float) -> None:
    try:
        await asyncio.wait_for(run.transport.fetch_segment(run.addresses[peer], plan.id, part, out, limit, stage),
                               limit)
    except TimeoutError:
        raise PeerUnavailable(f"{peer}: no answer in {limit:.1f}s") from None


async def _each(peers: list[str], work) -> dict[str, str]:
    """`work(peer)` for every peer at once: who failed, and why. An owner on
    another set stops the others and is raised."""
    tasks = {p: asyncio.ensure_future(work(p)) for p in peers}
    try:
        pending = set(tasks.values())
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                if not task.cancelled() and isinstance(task.exception(), _OtherSet):
                    raise task.exception()
    finally:  # the deadline, an owner on another set, or the end cancelled (a leave): no fetch outlives it
        for task in tasks.values():
            task.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
    failed = {}
    for peer, task in tasks.items():
        exc = asyncio.CancelledError("its transfer was cancelled") if task.cancelled() else task.exception()
        if exc is None:
            continue
        if not isinstance(exc, (PeerdError, TimeoutError, asyncio.CancelledError)):
            raise exc  # a bug, not a partner's fault
        failed[peer] = str(exc) or type(exc).__name__  # grpc.aio cancels a call whose channel closed under it
    return failed


async def _reduce(run: EndRun, plan: EndPlan, mean: torch.Tensor) -> dict[str, str]:
    """This peer's part from every other member, averaged into `mean`; who failed."""
    index = plan.index(run.me)
    span = plan.parts[index]
    if span.size == 0:
        return {}
    pieces = {p: torch.empty(span.size, dtype=torch.float32) for p in plan.members if p != run.me}
    failed = await _each(list(pieces), lambda p: _pull(run, p, plan, index, pieces[p], FINAL_PART_STAGE))
    if not failed:
        pieces[run.me] = run.own[span.start : span.stop]
        tail = plan.int_tail if span.stop == plan.numel else 0
        mean[span.start : span.stop] = mean_of(plan_consensus(run.me, pieces), pieces, tail)
    return failed


async def _from_holders(run: EndRun, plan: EndPlan, owner: str, out: torch.Tensor) -> bool:
    """The owner failed: its part's average from any member that holds the
    whole average over the plan's set. Every other member is asked at once,
    each into its own buffer; one still averaging over the set answers when it
    holds the whole, or at once when it lacks a part too. The first whole
    answer wins."""
    holders = [p for p in plan.members if p not in (run.me, owner)]
    buffers = {p: torch.empty_like(out) for p in holders}
    part = plan.index(owner)
    tasks = {asyncio.ensure_future(_pull(run, p, plan, part, buffers[p], FINAL_MEAN_STAGE, patient=False)): p
             for p in holders}
    try:
        pending = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                exc = asyncio.CancelledError() if task.cancelled() else task.exception()
                if exc is None:
                    out.copy_(buffers[tasks[task]])
                    return True
                if not isinstance(exc, (PeerdError, TimeoutError, asyncio.CancelledError)):
                    raise exc
        return False
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _gather(run: EndRun, plan: EndPlan, mean: torch.Tensor, final: FinalStore) -> dict[str, str]:
    """Every other part's average into `mean`; the owners that failed (and nobody held their part)."""

    async def one(owner: str) -> None:
        span = plan.part_of(owner)
        out = mean[span.start : span.stop]
        try:
            await _pull(run, owner, plan, plan.index(owner), out, FINAL_MEAN_STAGE)
            return
        except asyncio.CancelledError as exc:
            if asyncio.current_task().cancelling():
                raise  # the end itself is cancelled (a leave), not one partner's call (grpc.aio)
            why = str(exc) or "its transfer was cancelled"
        except (PeerdError, TimeoutError) as exc:
            why = str(exc) or type(exc).__name__
        await final.lacking()
        if not await _from_holders(run, plan, owner, out):
            raise PeerUnavailable(f"{why}; no other member held its part's average")

    owners = [p for p in plan.members if p != run.me and plan.part_of(p).size]
    return await _each(owners, one)


async def _reduce_and_gather(run: EndRun, plan: EndPlan, final: FinalStore, mean: torch.Tensor
                             ) -> tuple[dict[str, str], int]:
    """Reduce this peer's part, serve it, gather the others'. Who failed, and
    the plan an owner named instead (0: none)."""
    try:
        failed = await _reduce(run, plan, mean)
        if failed:
            return failed, 0
        await final.averaged()
        return await _gather(run, plan, mean, final), 0
    except _OtherSet as other:
        return {}, other.plan_id


def _learnable(plan: EndPlan, me: str):
    """Whether a plan id another member asked for is `plan`'s set without a
    member or two (never `me`): that member saw them fail."""
    known: dict[int, bool] = {}

    def test(id_: int) -> bool:
        if id_ not in known:
            known[id_] = shrunk_to(plan, me, id_) is not None
        return known[id_]

    return test


async def _attempt(run: EndRun, plan: EndPlan, final: FinalStore, mean: torch.Tensor) -> tuple[dict[str, str], int]:
    """One plan, until it ends here or a member asks this peer for its part
    under a smaller set this one can follow (a member that gave up waiting for
    another sooner: all then leave that one out, not only the first)."""
    await final.begin(plan, mean, plan.index(run.me))
    work = asyncio.ensure_future(_reduce_and_gather(run, plan, final, mean))
    follow = asyncio.ensure_future(final.asked_for(_learnable(plan, run.me)))
    try:
        await asyncio.wait({work, follow}, return_when=asyncio.FIRST_COMPLETED)
    finally:  # the other one stopped, or both when the end itself is cancelled
        for task in (work, follow):
            task.cancel()
        await asyncio.gather(work, follow, return_exceptions=True)
    return work.result() if not work.cancelled() else ({}, follow.result())


async def by_parts(run: EndRun, plan: EndPlan, final: FinalStore) -> tuple[Next, EndPlan, torch.Tensor]:
    """Plans until one ends with every part averaged over its set, or the way
    by parts gives up. What came of it, the last plan and its average."""
    for attempt in itertools.count(1):
        mean = torch.empty(plan.numel, dtype=torch.float32)  # a vector per plan: a late reader of the last one is not mixed
        if plan.alone:
            return Next.DONE, plan, mean.copy_(run.own)
        failed, other = await _attempt(run, plan, final, mean)
        run.left_out.update(failed)
        step, after = after_attempt(plan, run.me, failed, other, attempt)
        if step is not Next.REPLAN:
            return step, after, mean
        lost = sorted(set(plan.members) - set(after.members))
        run.left_out.update({p: "left out by an owner of the end's average" for p in lost if p not in failed})
        log.info("the end: %s left out; averaging again over %d peer(s)", ", ".join(lost), after.size)
        plan = after
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class FinalVector:
    """A final model as the end consensus moves it (peerd.worker.state.finalmodel):
    its values, its stage 3 segments, and the integer pieces at its end."""

    values: torch.Tensor
    layout: list[Span]
    int_tail: int = 0


async def final_consensus(me: str, model: FinalModel, final: FinalStore, addresses: dict[str, str],
                          gossip_layout: list[Span], transport: Transport, timeout: float,
                          patience: Patience | None = None) -> Consensus:
    """The job is done here: average this peer's final model (a CPU copy of
    its parameters and buffers) with the others'."""
    own = FinalVector(model.vector(), model.layout(gossip_layout), model.int_elems)
    return await end_consensus(me, own, final, addresses, transport, timeout, patience)


async def end_consensus(me: str, own: FinalVector, final: FinalStore, addresses: dict[str, str],
                        transport: Transport, timeout: float, patience: Patience | None = None) -> Consensus:
    """Publish `own` and average it with the final models of the others in
    `addresses`, by parts, or in the end by whole models. `timeout` bounds one
    try; `patience` says how long in all members still in the job are waited
    for (without it, `timeout` bounds the whole)."""
    started = time.monotonic()
    values, tail = own.values, own.int_tail
    if not finite_by_sum(values):  # the others would leave it out one part at a time: it takes no part
        await final.withdraw("its final model is not finite")
        log.error("the end: this peer's final model is not finite; it takes no part in the consensus")
        return Consensus(plan_consensus(me, []), values, {}, 0.0, 0.0)
    await final.publish(values, own.layout, tail)
    limit = patience.limit_s if patience is not None else timeout
    run = EndRun(me, values, {p: a for p, a in addresses.items() if p != me and a}, transport, timeout, patience,
                 started + limit, started + limit - min(timeout, GRACE_SHARE * limit) if patience else started)
    step, plan, mean = await by_parts(run, plan_end(me, run.addresses, values.numel(), tail), final)
    if step is Next.ALL_PULL:
        c = await _whole_models(run, plan, final, own)
    else:
        await final.conclude(plan, mean)
        c = Consensus(plan_consensus(me, plan.members), mean, run.left_out, 0.0,
                      distance_from_consensus(values, mean, tail), plan.size - 1 if plan.part_of(me).size else 0,
                      "by parts")
    c.seconds = time.monotonic() - started
    log.info("the end: averaged %s over %d peer(s) in %.2fs", c.how, c.plan.size, c.seconds)
    return c


async def _whole_models(run: EndRun, plan: EndPlan, final: FinalStore, own: FinalVector) -> Consensus:
    """Today's way over what is left of the set: every member's whole model."""
    log.info("the end: the average by parts did not end here (an owner averaged over a set this peer cannot "
             "tell, or three plans failed); pulling the whole models of %d peer(s)", plan.size - 1)
    left = max(run.until - time.monotonic(), 0.0)
    patience = Patience(run.patience.present, left) if run.patience is not None else None
    addresses = {p: a for p, a in run.addresses.items() if p in plan.members}
    c = await average_models(run.me, run.own, addresses, own.layout, run.transport, min(run.timeout, left),
                             Models(patience=patience), own.int_tail)
    await final.conclude(EndPlan(c.plan.members, run.own.numel(), own.int_tail), c.vector)
    c.left_out = {**run.left_out, **c.left_out}
    c.owed_reads = (c.plan.size - 1) * len(own.layout)
    return c
