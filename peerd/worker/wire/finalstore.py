"""What a finished worker serves for the end consensus (docs/algorithms.md,
"One model at the end"; docs/protocol.md, stages 3 to 5):

- stage 3, its final model, segment by segment in the layout it published,
  for a member that pulls every member's whole model (what the way by parts
  falls back to);
- stage 4, its part i of a plan: its final model cut as the plan's size says
  (peerd.core.endplan.end_parts); `round` carries the plan's id;
- stage 5, the average of part i over the plan's set: served by the owner of
  the part once it has averaged it, and by any member that holds the whole
  average over that set. A member averaging over another set refuses at once
  when it can never come to the asked one, else lets the request wait.

The final model never changes once published. Each attempt's average is a
vector of its own, so a reader still streaming a part of an abandoned plan
never sees the next plan's values.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import torch

from peerd.core.endplan import EndPlan, Refusal, end_parts, plan_size, reachable, refusal, refusal_round
from peerd.core.segments import Span, chunk_spans
from peerd.errors import InvalidMessage, RoundMismatch
from peerd.worker.wire.values import FINAL_MEAN_STAGE, FINAL_PART_STAGE, to_wire
from peerd.worker.wire.waits import wait_until


class FinalStore:
    """A finished worker's final model and its averages, for the consensus
    (peerd.worker.state.consensus, peerd.worker.state.endparts). A request
    waits up to its wait_s for the model; one to a worker that will never
    publish it (it left) is refused at once."""

    def __init__(self) -> None:
        self.vector: torch.Tensor | None = None
        self.layout: list[Span] | None = None  # its segments: the gossip's, then the buffers' (finalmodel)
        self.int_tail = 0  # integer pieces at the vector's end: the last part keeps them whole
        self.finished = False  # no final model will come
        self.why = "left the job"  # what a request is told once finished without one
        self.served = 0  # stage 3 segments and stage 5 parts streamed whole: the finish waits for its set's reads
        self.working: EndPlan | None = None  # the plan this worker averages over now
        self._mean: torch.Tensor | None = None  # its average: this worker's part once `_ready`, all of it once done
        self._ready = False
        self._mine = -1  # the part of `working` this worker owns
        self._lacking = False  # an owner of `working` failed it: it asks the others, so it refuses theirs at once
        self.done: EndPlan | None = None  # the plan of `working` once it holds the whole average
        self._asked: set[int] = set()  # plans the others asked this worker for parts of
        # Asked for a final model while still training: the asker has reached the
        # job's end, so this worker ends too, at its next round (docs/algorithms.md,
        # "One agreed end").
        self.end_reached_elsewhere = False
        self._changed = asyncio.Condition()

    async def publish(self, vector: torch.Tensor, layout: list[Span] | None = None, int_tail: int = 0) -> None:
        async with self._changed:
            self.vector, self.layout, self.int_tail = vector, layout, int_tail
            self._changed.notify_all()

    async def finish(self) -> None:
        async with self._changed:
            self.finished = True
            self._changed.notify_all()

    async def withdraw(self, why: str) -> None:
        """Take no part: requests for the final model are refused at once with `why`."""
        async with self._changed:
            self.vector, self.why, self.finished = None, why, True
            self._changed.notify_all()

    async def get(self, wait_s: float) -> torch.Tensor:
        async with self._changed:
            await wait_until(self._changed, lambda: self.vector is not None or self.finished, wait_s)
            if self.vector is None:
                why = self.why if self.finished else "still training"
                raise RoundMismatch(f"no final model here (peer {why})", -1)
            return self.vector

    async def begin(self, plan: EndPlan, mean: torch.Tensor, mine: int) -> None:
        """Average over `plan`'s set from now, into `mean` (a vector of this
        attempt's own); `mine` is the part this worker owns."""
        async with self._changed:
            self.working, self._mean, self._ready, self._mine, self._lacking = plan, mean, False, mine, False
            self._changed.notify_all()

    async def averaged(self) -> None:
        """This worker's part of the plan it works on is averaged: serve it."""
        async with self._changed:
            self._ready = True
            self._changed.notify_all()

    async def lacking(self) -> None:
        """An owner's part did not come: this worker asks the others whether
        they hold it, and answers theirs at once (two members waiting on each
        other for a part neither will get would each wait out a deadline)."""
        async with self._changed:
            self._lacking = True
            self._changed.notify_all()

    async def conclude(self, plan: EndPlan, mean: torch.Tensor) -> None:
        """`mean` is the whole average over `plan`'s set: serve any part of it."""
        async with self._changed:
            self.working = self.done = plan
            self._mean, self._ready = mean, True
            self._changed.notify_all()

    def _holds(self, plan_id: int, segment: int) -> bool:
        plan = self.working
        return plan is not None and plan.id == plan_id and (
            self.done is not None or (self._ready and segment == self._mine))

    def _settled(self, plan_id: int, segment: int) -> bool:
        """Whether a request for part `segment` of `plan_id`'s average can be answered now."""
        if self.done is not None or self.finished:
            return True
        if self.working is None:
            return False  # still training, or not yet planned: it may come to any plan
        if self.working.id != plan_id:
            return not reachable(plan_id, self.working.id)
        # Its own part once averaged; another's once it holds the whole average (above),
        # waited for unless it lacks a part itself.
        return self._ready if segment == self._mine else self._lacking

    async def mean_part(self, plan_id: int, segment: int, wait_s: float) -> torch.Tensor:
        """Part `segment` of the average over plan `plan_id`'s set, waited for up to wait_s."""
        async with self._changed:
            await wait_until(self._changed, lambda: self._settled(plan_id, segment), wait_s)
            if not self._holds(plan_id, segment):
                plan = None if self.finished and self.done is None else self.working
                now = refusal_round(plan_id, plan.id if plan is not None else -1, self.done is not None)
                why = {Refusal.NOT_YET: "not averaged here yet", Refusal.OTHER_SET: "it averages over another set",
                       Refusal.NO_PLAN: f"peer {self.why}" if self.finished else "no average under way"}
                raise RoundMismatch(f"part {segment} of plan {plan_id:x}: {why[refusal(plan_id, now)]}", now)
            span = self.working.parts[segment]
            return self._mean[span.start : span.stop]

    async def asked_for(self, wanted) -> int:
        """The first plan a request named (stage 4 or 5) for which `wanted(id)`."""
        async with self._changed:
            await self._changed.wait_for(lambda: any(wanted(i) for i in self._asked))
            return next(i for i in self._asked if wanted(i))

    async def _note_asked(self, plan_id: int) -> None:
        if plan_id not in self._asked:
            async with self._changed:
                self._asked.add(plan_id)
                self._changed.notify_all()

    async def wait_served(self, reads: int, wait_s: float) -> bool:
        """Wait until `reads` segments or parts were streamed (or wait_s passed)."""
        async with self._changed:
            await wait_until(self._changed, lambda: self.served >= reads, wait_s)
            return self.served >= reads

    async def note_served(self) -> None:
        async with self._changed:
            self.served += 1
            self._changed.notify_all()

    async def serve(self, round_: int, segment: int, wait_s: float, stage: int, chunk_elems: int,
                    layout: list[Span]) -> AsyncIterator[tuple[int, int, object]]:
        """(offset, total, fp32 data) chunks of what a stage 3, 4 or 5 request
        asks for; stage 3 in the published layout (`layout`, the gossip's,
        when none was)."""
        if self.vector is None and not self.finished:
            self.end_reached_elsewhere = True
        if stage in (FINAL_PART_STAGE, FINAL_MEAN_STAGE):
            if not 0 <= segment < plan_size(round_):
                raise InvalidMessage(f"part {segment} out of range for a plan of {plan_size(round_)}", "bad_segment")
            await self._note_asked(round_)
        if stage == FINAL_MEAN_STAGE:
            values = await self.mean_part(round_, segment, wait_s)
        else:
            vector = await self.get(wait_s)
            if stage == FINAL_PART_STAGE:
                span = end_parts(vector.numel(), self.int_tail, plan_size(round_))[segment]
            else:
                layout = self.layout or layout
                if not 0 <= segment < len(layout):
                    raise InvalidMessage(f"segment {segment} out of range 0..{len(layout) - 1}", "bad_segment")
                span = layout[segment]
            values = vector[span.start : span.stop]
        for piece in chunk_spans(values.numel(), chunk_elems):
            yield piece.start, values.numel(), to_wire(values[piece.start : piece.stop], "fp32")
        if stage != FINAL_PART_STAGE:
            await self.note_served()

