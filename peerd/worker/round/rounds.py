"""The rounds of a worker: the round number, each round's plan, its run (now,
or in the background with `[gossip] overlap`), and what its outcome teaches
(deadlines, suspicion, refused values, a partner ahead to step up to).

The engine decides when a round happens and what surrounds it (captures for
newcomers, checkpoints, evaluations); `next_round` runs the exchange on the
registered state's gossiped vector and returns the round it finished, processed.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import torch

from peerd.core.catchup import step_up
from peerd.core.deadline import DeadlineEstimator
from peerd.core.names import host_of
from peerd.core.groups import plan_hierarchical
from peerd.core.robust import PullClipper
from peerd.core.segments import split_even
from peerd.core.suspicion import Suspicion
from peerd.core.topology import plan_round
from peerd.security.rejections import Rejections
from peerd.settings.jobspec import JobSpec
from peerd.worker.round.dispatch import run_round
from peerd.worker.round.shared import RoundResult
from peerd.worker.intrahost.group import IntraHostGroup
from peerd.worker.link import SupervisorLink
from peerd.worker.round.overlap import OverlapRunner, RoundExchange, round_exchange
from peerd.worker.round.context import RoundBuffers, RoundContext, RoundInputs
from peerd.worker.round.changes import ChangeRounds, anchors_round
from peerd.worker.round.feedback import ErrorFeedback
from peerd.worker.round.outer import OuterStep
from peerd.worker.wire.quant import NonFiniteValues
from peerd.worker.wire.stores import SnapshotStore, StageStore
from peerd.worker.wire.traffic import ExchangeTimes
from peerd.worker.state.frozen import kept
from peerd.worker.state.trainstate import TrainState

log = logging.getLogger("peerd.worker")

GROUP_LOG_ROUNDS = 100


class Rounds:
    def __init__(self, spec: JobSpec, me: str, state: TrainState, link: SupervisorLink, transport,
                 rejections: Rejections, intrahost: IntraHostGroup | None = None) -> None:
        self.spec = spec
        self.rejections = rejections  # the engine's: a round's refused values count there
        self.intrahost = intrahost  # the group stage on torch.distributed, with the daemon's other workers
        self.me = me
        self.state = state
        self.link = link
        numel = state.gossiped
        segments = 1 if spec.gossip.mode == "whole" else min(spec.gossip.segments, numel)
        self.layout = split_even(numel, segments)
        self.store = SnapshotStore(numel)
        self.stages = StageStore()
        self.recv = torch.empty(numel, dtype=torch.float32)
        # Averaging runs on the CPU, where the network buffers are: a model on a GPU
        # is copied here for the round and back after it (two copies per round).
        # None: the model is on the CPU and the round works on its vector directly.
        device = state.flat.vector.device.type
        self.work = None if device == "cpu" else torch.empty(numel, dtype=torch.float32, pin_memory=device == "cuda")
        self.deadline = DeadlineEstimator(spec.gossip.deadline_floor_s, spec.gossip.deadline_ceiling_s)
        self.suspicion = Suspicion()
        self.clipper = PullClipper(spec.gossip.clip_factor)
        # What every round of the job shares (peerd.worker.round.context).
        # The int8 wire's error feedback (peerd.worker.round.feedback); a joiner's starts at zero.
        self.feedback = ErrorFeedback(self.layout) if spec.gossip.wire == "int8" else None
        self.context = RoundContext(me, self.layout, transport, self.stages, self.clipper,
                                    spec.gossip.wire, intrahost, self.feedback)
        self.clipped = 0
        self.misses = 0
        self._frozen_said = 0  # frozen values of the gossiped vector, as last logged
        self.exchange_times = ExchangeTimes()  # one per gossip round this process completed
        self._group_logged: tuple[tuple[str, ...], frozenset[str], int] = ((), frozenset(), 0)
        # [outer]: after each round the anchor's SGD step (peerd.worker.round.outer); on the
        # int8 wire the rounds average the changes θ − θ₀ instead (peerd.worker.round.changes).
        self.outer = OuterStep(spec.outer, state) if spec.outer.enabled else None
        self.changes = ChangeRounds(self) if self.outer is not None and self.feedback is not None else None
        # [gossip] overlap: rounds run in the background (peerd.worker.round.overlap); with
        # [outer], the outer step turns the round's result into the correction.
        self.overlap = OverlapRunner(self.store, numel, on_mixed=self._on_mixed) if spec.gossip.overlap else None
        self._in_flight: tuple[dict[str, str], float] = ({}, 0.0)  # view and start of the round in flight
        self._pending_kind = "models"  # what the round in flight averages (peerd.worker.round.changes)
        # The round this worker is in: counted up by next_round, stepped up to a
        # partner ahead, set by a resume. Engine.round reads and sets this one.
        self.round = 0

    @property
    def transport(self):
        """The rounds' transport: the context's (setting it makes a new context)."""
        return self.context.transport

    @transport.setter
    def transport(self, transport) -> None:
        self.context = replace(self.context, transport=transport)

    async def next_round(self, view: dict[str, str], capture) -> RoundResult | None:
        """The next round over `view` (the serving members, this worker
        included): run now, or started in the background with the one in flight
        applied (`[gossip] overlap`); `capture()` copies the state for newcomers
        between steps. Returns the round that finished (None: none did), its
        outcome processed: misses, deadline, suspicion, refused values, catch-up."""
        self.round += 1
        if self.overlap is not None:
            result = await self._run_overlapped(view, capture)
        elif self.changes is not None:
            result = await self.changes.run(view, capture)
        else:
            result = await self._run_now(view, capture)
            if self.outer is not None:
                self.outer.step()
        self._process_outcome(result, view)
        return result

    async def finish_in_flight(self, view: dict[str, str]) -> RoundResult | None:
        """Apply the overlapped round in flight, if any (before a leave or the
        final model), its outcome processed as next_round's; `view`: the members
        of now, for the names in the log."""
        result = await self._finish_pending()
        self._process_outcome(result, view)
        return result

    async def _run_now(self, view: dict[str, str], capture) -> RoundResult | None:
        """One round, now: publish, let `capture()` copy the state for newcomers
        (between steps), exchange."""
        self._quantise()
        with self.keeping_frozen():
            into = await self._publish()
            await capture()
            return await self._round(view, into)

    def keeping_frozen(self, vector=None):
        """What the training froze keeps its values through what follows (a
        round, its correction, the int8 wire's rounding), and owes nothing on
        the int8 wire (docs/algorithms.md, "Frozen tensors"). Said in the log
        when it changes. `vector()`: what to keep them in (the model's)."""
        spans = self.state.frozen.spans(self.state.gossiped)
        frozen = sum(b - a for a, b in spans)
        if frozen != self._frozen_said:
            self._frozen_said = frozen
            log.info("round %d: %d of the %d averaged values frozen (requires_grad=False, or a module in eval "
                     "mode): kept as they are", self.round, frozen, self.state.gossiped)
        return kept(spans, vector or (lambda: self.state.flat.vector),
                    lambda: self.feedback.residual if self.feedback is not None else None)

    def _quantise(self) -> None:
        """The int8 wire: the model becomes what its readers receive, the rest is
        owed to the next round (peerd.worker.round.feedback)."""
        if self.feedback is None:
            return
        try:
            with self.keeping_frozen():
                self.feedback.quantise_(self.state.flat.vector)
        except NonFiniteValues:  # published as it is: partners asking are told it is unavailable
            log.warning("round %d: the model holds non-finite values: not sent on the int8 wire", self.round)

    def settle_feedback(self) -> None:
        """The residual back into the model, before the exact average at the end."""
        if self.feedback is not None:
            with self.keeping_frozen():
                self.feedback.settle_(self.state.flat.vector)

    async def _publish(self) -> torch.Tensor | None:
        """Publish the model as this round's snapshot. On the CPU its vector itself
        becomes the snapshot, without a copy, and the round writes the new model
        into the buffer returned; on a GPU it is copied (None)."""
        if self.work is not None:
            await self.store.publish(self.round, self.state.flat.vector)
            return None
        return await self.store.hand_over(self.round, self.state.flat.vector)

    async def _round(self, view: dict[str, str], into: torch.Tensor | None) -> RoundResult | None:
        """This round's exchange; with `into`, the model moves there after it."""
        if into is None:
            return await self._gossip(view)
        snapshot = self.state.flat.vector
        result = None
        try:
            result = await self._gossip(view, into)
        finally:
            if result is None:  # nobody to gossip with (or a failure): the model as it was
                into.copy_(snapshot)
            self.state.flat.rebind(into)
        return result

    def round_plan(self, view: dict[str, str], now: float):
        """This round's plan, the addresses of the peers it was drawn over (those
        not suspected) and its deadline, or None with nobody to gossip with."""
        peers = self.suspicion.keep(view, now)
        if len(peers) < 2:
            return None
        addresses = {p: view[p] for p in peers}
        deadline = self.deadline.deadline()
        if self.spec.gossip.mode != "hierarchical":
            return plan_round(self.spec.name, self.round, peers, self.me, len(self.layout)), addresses, deadline
        # Paths are outermost first (label, host, daemon): a daemon's workers group first.
        localities = {p: (self.link.localities.get(p, ""), host_of(view[p]), self.link.daemons.get(p, p))
                      for p in peers}
        plan = plan_hierarchical(self.spec.name, self.round, localities, self.me, len(self.layout),
                                 self.spec.gossip.group_size)
        self._log_group(plan.group, len(plan.groups), frozenset(peers))
        # Three transfers one after another: the floor holds for each of them.
        return plan, addresses, max(deadline, 3 * self.spec.gossip.deadline_floor_s)

    async def _gossip(self, view: dict[str, str], into: torch.Tensor | None = None) -> RoundResult | None:
        now = time.monotonic()
        planned = self.round_plan(view, now)
        if planned is None:
            return None
        plan, addresses, deadline = planned
        vector = self.work if self.work is not None else self.state.flat.vector
        if vector is not self.state.flat.vector:
            vector.copy_(self.state.flat.vector)
        buffers = RoundBuffers(vector, self.recv, deadline, into)
        result = await run_round(self.context, RoundInputs(plan, addresses, buffers))
        if vector is not self.state.flat.vector:
            self.state.flat.vector.copy_(vector, non_blocking=True)
        await self.after_round(result, view, now)
        return result

    def _exchange(self, view: dict[str, str], now: float) -> tuple[RoundExchange | None, float]:
        """Overlapped mode: this round's exchange, to run in the background."""
        planned = self.round_plan(view, now)
        if planned is None:
            return None, 0.0
        plan, addresses, deadline = planned
        return round_exchange(self.context, plan, addresses), deadline

    async def _run_overlapped(self, view: dict[str, str], capture) -> RoundResult | None:
        """docs/algorithms.md §1.10: apply the correction of the round in flight (one round
        stale: x ← x + mix(x_r) − x_r), let `capture()` copy the state (nothing in
        flight: no correction is missing from the copy), then start the exchange
        of this round on a snapshot of the model of now; it runs while the
        next steps compute. Returns the finished round's result."""
        result = await self._finish_pending()
        await capture()
        now = time.monotonic()
        exchange, deadline = self._exchange(view, now)
        if exchange is None and self.outer is not None:
            self.outer.step()  # nobody to average with: the own change, now, as without overlap
        if self.changes is not None:
            self._pending_kind = "anchors" if anchors_round(self.round) else "changes"
            snapshot = self.changes.published(self._pending_kind == "anchors")
        else:
            self._quantise()
            snapshot = self.state.flat.vector
        await self.overlap.start(self.round, snapshot, exchange, deadline)
        self._in_flight = (view, now)
        return result

    async def _finish_pending(self) -> RoundResult | None:
        """Apply the overlapped round in flight, if any (before a leave, the final
        model, or the next round)."""
        if self.overlap is None or self.overlap.pending is None:
            return None
        with self.keeping_frozen():
            result = await self.overlap.finish(self.state.flat.vector)
        if self.outer is not None:
            self.outer.follow_frozen()
        if result is not None:
            view, started = self._in_flight
            await self.after_round(result, view, started)
        return result

    def _on_mixed(self, mixed: torch.Tensor) -> None:
        """[outer] overlapped: the round in flight completed; its result becomes
        the outer step's correction (docs/algorithms.md, "The outer step overlapped")."""
        if self.outer is not None:
            self.outer.on_mixed(mixed, self._pending_kind)

    @property
    def intrahost_status(self) -> str:
        group = self.intrahost
        if group is None or group.generation is None:
            return ""
        return f"{group.backend} generation {group.generation}, {group.rounds} rounds"

    async def leave_group(self) -> None:
        """No more rounds here (the job is done, or this worker leaves): out of the
        intra-host group at once, so that siblings still training are not held in
        a collective this worker will not join until it exits (up to the
        collective's timeout) but fall back to the bulk lane straight away."""
        if self.intrahost is not None:
            await self.intrahost.aclose()

    async def aclose(self) -> None:
        if self.overlap is not None:
            await self.overlap.aclose()
        if self.intrahost is not None:
            await self.intrahost.aclose()
        await self.store.finish()
        await self.stages.finish()

    async def after_round(self, result: RoundResult, view: dict[str, str], now: float) -> None:
        """A round's outcome as it ends: misses, deadlines, suspicion. Logged with
        its own round: an overlapped one ends in the round after it."""
        self.misses += result.misses
        self.exchange_times.observe(result.seconds)
        if result.clipped:
            self.clipped += result.clipped
            log.warning("round %d: clipped %d oversized pull(s) (%d so far; gossip.clip_factor = %g)",
                        result.round, result.clipped, self.clipped, self.spec.gossip.clip_factor)
        if result.misses == 0:
            self.deadline.observe(result.seconds)
        elif result.errors:
            log.debug("round %d: %d segment(s) missed: %s", result.round, result.misses,
                      "; ".join(f"{p}: {e}" for p, e in sorted(result.errors.items())))
        for partner in result.planned:
            if self.suspicion.record(partner, partner not in result.unreachable, now):
                log.info("round %d: suspecting %s (no answer in %d rounds): %s", result.round, partner,
                         self.suspicion.threshold, result.errors.get(partner, ""))

    def _process_outcome(self, result: RoundResult | None, view: dict[str, str]) -> None:
        """The rest of a finished round's outcome, once this round has started:
        count the values it refused, step up to a partner ahead (peerd.core.catchup),
        keeping this model."""
        if result is None:
            return
        for source, why in result.non_finite.items():
            self.rejections.record(view.get(source, source), "non_finite", why)
        up = step_up(self.round, result.ahead_round)
        if up is None:
            return
        if up.logged:
            log.info("round %d: %s is in round %d; stepping up to it", self.round, result.ahead_peer,
                     result.ahead_round)
        self.round = up.round

    def _log_group(self, group: tuple[str, ...], groups: int, view: frozenset[str]) -> None:
        """Hierarchical mode: say which group this worker is in when the view
        changes (a group re-cut every round is logged every 100 rounds)."""
        last, last_view, last_round = self._group_logged
        if view != last_view or (group != last and self.round - last_round >= GROUP_LOG_ROUNDS):
            self._group_logged = (group, view, self.round)
            log.info("round %d: in group %s of %d (%d in view)", self.round, ", ".join(group), groups, len(view))

