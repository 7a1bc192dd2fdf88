"""The engine under every worker: the exchange server, the daemon link, rounds.

It trains nothing itself. Something that trains (peerd's own loop, or a user's
script through `peerd.attach`) tells it when local steps are done; the engine
then runs the gossip round on the registered state, serves newcomers, writes
checkpoints and reports progress. It lives in an asyncio loop of its own: the
Peer facade (peerd.peer) runs it in a background thread, so a script's loop and
the engine's server never wait on each other except at a round.

Its life is peerd.core.lifecycle's:

    start()      serve; join (peerd.worker.join): hear from the daemon, the start gate,
                 the peers' state or a checkpoint; the round joined applied here
    end_round()  after the round's local steps (period_steps, or fewer: StepPlan.round_steps):
                 publish, exchange, checkpoint, report; when the plan says stop, leave
                 (peerd.worker.ending)
    end()        the one way out: for a job trained out here the exact average of the
                 members' final models and the model file (peerd.worker.ending); then close

The engine is the only writer of its worker's round, stage, phase, metrics and
view address (docs/architecture.md, "One writer for a worker's state"): Join
and JobEnd return what they decided and the engine applies it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path

from peerd.core.health import describe
from peerd.core.lifecycle import Event, Outcome, Stage, outcome_of, step
from peerd.core.outer import describe as describe_outer
from peerd.core.shares import BatchPlan, Rebalancer, published_costs
from peerd.core.stepplan import StepPlan, members_of, own_view, step_plan
from peerd.settings.jobspec import JobSpec
from peerd.control.launch import Launch
from peerd.security.rejections import Rejections
from peerd.worker.state.checkpoint import CheckpointDir
from peerd.worker.state.checkpointer import Checkpointer
from peerd.worker.state.consensus import round_consensus, state_with
from peerd.worker.ending import CLOSE_TIMEOUT_S, Ended, JobEnd
from peerd.worker.round.changes import anchor_rounds_note
from peerd.worker.round.shared import RoundResult
from peerd.worker.join import HEARTBEAT_S, Join
from peerd.worker.link import SupervisorLink
from peerd.worker.progress_report import EngineFigures, TimeSpent, progress_of
from peerd.worker.round.rounds import Rounds
from peerd.worker.wire.stores import FinalStore, Identity, SegmentServer
from peerd.worker.train.source import Source
from peerd.worker.state.pull import StateBoard, StateMeta, StateServer
from peerd.worker.tblog import TensorBoardLog
from peerd.worker.wire.traffic import (
    CountingSegmentServer,
    CountingStateServer,
    CountingTransport,
    Traffic,
)
from peerd.worker.wire.server import start_exchange_server
from peerd.worker.state.modelfile import write_model
from peerd.worker.wire.transport import GrpcTransport

log = logging.getLogger("peerd.worker")

NO_STEP_PHASE = "waiting for peer.step()"  # shown while a script has taken no step (Peer's watch)


def rebalancer_of(spec: JobSpec) -> Rebalancer | None:
    """The job's DBS plan keeper (None without DBS). Fewer steps per round for
    slow members with shared data only: local data's clock counts every member's
    steps alike (docs/algorithms.md), so there every member takes period_steps."""
    if not spec.global_batch:
        return None
    period = spec.gossip.period_steps if spec.data_mode == "shared" else 1
    return Rebalancer(spec.global_batch, spec.min_local_batch, spec.rebalance_rounds, spec.rebalance_threshold,
                      period=period)


class Engine:
    def __init__(self, source: Source, link: SupervisorLink, launch: Launch) -> None:
        """`launch`: the job, this worker's id, where to serve and write, the
        security and the intra-host group it was started with."""
        self.spec = spec = launch.spec
        self.out_dir = launch.out_dir
        self.source = source
        self.state = source.state
        self.link = link
        self.host = launch.host
        self.me = launch.peer_id
        self.identity = Identity(spec.name, self.state.fingerprint(spec.fingerprint), self.me)
        self.board = StateBoard(self.state.numel, self.state.gossiped)
        self.board.on_wanted = self._wanted
        # The training thread waits in end_round: only this loop moves the state
        # then, so a newcomer's copy can be taken at once (_wanted).
        self._parked = False
        self._captures: set[asyncio.Task] = set()
        self.security = security = launch.security
        self.rejections = Rejections(log)
        self.traffic = Traffic()
        self.transport = CountingTransport(
            GrpcTransport(self.identity, security.auth, security.tls, self.rejections, wire=spec.gossip.wire),
            self.traffic, spec.gossip.wire)
        self.rounds = Rounds(spec, self.me, self.state, link, self.transport, self.rejections, launch.intrahost)
        self.store = self.rounds.store
        self.final = FinalStore()  # this peer's final model, for the consensus at the end
        self.checkpoints = Checkpointer(
            CheckpointDir(self.out_dir / "checkpoints", spec.name, self.identity.fingerprint, self.state.numel),
            spec.checkpoint)
        self.stop_signal = False  # SIGTERM/SIGINT: leave after this step (Peer.step), checkpoint, exit
        self.stage = Stage.JOINING  # peerd.core.lifecycle
        self._waiting_for = ""  # what it waits for within its stage, for display only (phase)
        self._ended_by: list[str] = []  # the members that finished the job while this worker was away
        self._view: dict[str, str] = {}  # the serving members this round was planned with
        self.left: set[str] = set()  # members seen leaving the view: one may have ended the job (JobEnd)
        self._round_steps = spec.gossip.period_steps  # local steps in the last round (end_round)
        self.metrics: dict[str, float] = {}  # the last evaluation
        self.evaluate = None  # a callable returning metrics every eval_every_rounds (peerd's own loop)
        self.collapsed = ""  # why training collapsed, once the watch saw it (peerd.core.health); sticky
        self.rebalancer = rebalancer_of(spec)
        self._server = None
        self._beats: asyncio.Task | None = None
        self.exported, self.exported_round = "", 0  # peerctl export: the last file written
        self.time = TimeSpent()
        self.tblog = TensorBoardLog(launch.tensorboard)  # each round's Progress, when asked for
        self.join = Join(self)
        self.ending = JobEnd(self)

    @property
    def round(self) -> int:
        """The round this worker is in: Rounds keeps it (counts it up, steps it up)."""
        return self.rounds.round

    @property
    def phase(self) -> str:
        """What a status shows, derived for display only and never branched on: the
        stage, or what this worker waits for within it (show_waiting)."""
        return self._waiting_for or self.stage.shown

    def show_waiting(self, detail: str) -> str:
        """Show `detail` ("": nothing) as what this worker waits for within its
        stage, until it changes or the stage moves on; returns the one before."""
        before, self._waiting_for = self._waiting_for, detail
        return before

    def wait_for_first_step(self, waiting: bool) -> None:
        """Peer's watch: no peer.step() yet after first_step_warning_s (`waiting`),
        shown while training; a step shows the stage again (False)."""
        if waiting and self.stage == Stage.TRAINING:
            self._waiting_for = NO_STEP_PHASE
        elif not waiting and self._waiting_for == NO_STEP_PHASE:
            self._waiting_for = ""

    def set_view_address(self, address: str) -> None:
        """The address the daemon lists this worker at in the view ("": out of
        it, so partners do not plan rounds with it); sent with the next beat."""
        self.link.address = address

    async def start(self) -> StepPlan:
        """Serve, join; then the plan of the first steps."""
        address = await self._serve()
        joined = await self.join.run(address)
        if joined.round is not None:  # a resume: the round of the state taken
            self.rounds.round = joined.round
        self._ended_by = list(joined.ended_by)
        return await self._begin(address)

    async def _serve(self) -> str:
        """The Exchange service, its address not yet in the view."""
        chunk_elems = self.spec.gossip.chunk_kib * 1024 // 4
        server = CountingSegmentServer(
            SegmentServer(self.identity, self.store, len(self.rounds.layout), chunk_elems, self.rounds.stages,
                          self.spec.gossip.wire, self.final),
            self.traffic)
        state = CountingStateServer(StateServer(self.identity, self.board, self.store, chunk_elems), self.traffic)
        self._server, address = await start_exchange_server(
            server, state, self.host, auth=self.security.auth, tls=self.security.tls, rejections=self.rejections)
        g = self.spec.gossip
        log.info("serving exchange on %s; %d parameters in %d segments; %s gossip%s, %s on the wire",
                 address, self.state.flat.numel, len(self.rounds.layout), g.mode,
                 f" in groups of ≤ {g.group_size}" if g.mode == "hierarchical" else "", g.wire)
        outer = self.spec.outer
        if outer.enabled:  # the rounds come every H local steps, each followed by the outer step
            log.info("%s, after each round%s (the LR law scales the inner LR only)", describe_outer(outer.every, outer),
                     anchor_rounds_note(g.wire))
        return address

    async def _begin(self, address: str) -> StepPlan:
        """Train from the state this worker holds now."""
        self.on(Event.ENDED_ELSEWHERE if self._ended_by else Event.BEGIN)
        self.time.start()
        if not self._ended_by:  # else nothing is left to train: the job's model is taken at the end
            log.info("training from round %d, step %d", self.round, self.source.step_count)
        await self.store.publish(self.round, self.state.flat.vector)
        self.set_view_address(address)
        await self.link.beat()  # the view now decides the split of the first chunk
        self._beats = asyncio.create_task(self.link.run(HEARTBEAT_S, self._refresh))
        return self._next_plan()

    def on(self, event: Event) -> bool:
        """Move this worker through its lifecycle (peerd.core.lifecycle); False when
        `event` does not apply in its stage (a second stop, a stop during the end)."""
        move = step(self.stage, event)
        if move is None:
            return False
        self.stage, self._waiting_for = move.to, ""
        return True

    async def end(self, trained_out: bool, metrics: dict[str, float] | None = None) -> Outcome:
        """The one way out (peerd.core.lifecycle): for a job trained out here
        (`trained_out`, and this worker did not leave) the final consensus and
        the model file, `metrics` being the training side's last; then close.
        A failure on the way leaves the engine open: ending again closes it."""
        outcome = outcome_of(trained_out, self.stage == Stage.LEFT, self.link.stop)
        if outcome == Outcome.FINISHED and self.stage == Stage.TAKING:  # the job ended while it was away
            self._ended(await self.ending.take_jobs_model(self._ended_by))
        elif outcome == Outcome.FINISHED:
            ended = await self.ending.finish_job(metrics or {})
            self._ended(ended)
            if ended.own:
                await self.ending.serve_final(ended)
        try:
            await asyncio.wait_for(self._close(), CLOSE_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - closing after a failure: say so, go on
            log.warning("closing the engine: %s: %s", type(exc).__name__, exc)
        return outcome

    def _ended(self, end: Ended) -> None:
        """The job's end as JobEnd found it: the move, the last metrics, the final
        report, then where the model came from (on the Progress just made)."""
        self.on(end.event)
        self.metrics = end.metrics
        self.report(finished=True)
        self.link.progress.model_source = end.model_source

    async def _close(self) -> None:
        """Stop serving and say so to the daemon (once)."""
        if not self.on(Event.CLOSE):
            return
        self.tblog.close()
        await self.rounds.aclose()
        await self.final.finish()
        await self.board.finish()
        await asyncio.gather(*self._captures, return_exceptions=True)
        if self._beats is not None:
            self._beats.cancel()
            await asyncio.gather(self._beats, return_exceptions=True)
        await self.link.beat()
        if self._server is not None:
            await self._server.stop(grace=1.0)
        await self.transport.aclose()
        await self.link.aclose()

    async def checkpoint(self, why: str) -> None:
        await self.checkpoints.write(self._meta(), self.state.vector(), why)

    def _next_plan(self) -> StepPlan:
        """The plan of the next local steps, from the view of now."""
        link = self.link
        if link.orphaned and not self.stop_signal:
            # The data plane trained on without the daemon this long; now leave at this
            # round, checkpointed: a daemon that answers again restarts this worker.
            log.warning("lost the daemon: no heartbeat answer for %.0f s; leaving at round %d with a checkpoint",
                        link.silent_s, self.round)
            self.stop_signal = True
        before, self._view = self._view, own_view(link.view, self.me, link.address)
        view = self._view
        if before and view.keys() != before.keys():
            # A member that left (a drain, a pause for its owner, its end) is gone from the view
            # here, not suspected: the data split and the LR's global batch follow it.
            self.left |= before.keys() - view.keys()
            log.info("round %d: the view changed: %s; %d serving", self.round,
                     "; ".join(f"{what} {', '.join(sorted(ids))}" for what, ids in (
                         ("left:", before.keys() - view.keys()), ("joined:", view.keys() - before.keys())) if ids),
                     len(view))
        return step_plan(view, self._plan(members_of(view)), link.stop or self.stop_signal, link.data_sizes,
                         link.terms)

    async def end_round(self, steps: int | None = None) -> StepPlan:
        """The local steps of a round are done (`steps` of them, when the caller
        counts): exchange, then the next plan; leave when it says stop."""
        if self.stage in (Stage.LEFT, Stage.CLOSED):
            return StepPlan([self.me], 1, None, stop=True)
        plan = await self._round(steps)
        if plan.stop and self.on(Event.STOP):  # a stop applies while training only (peerd.core.lifecycle)
            await self.ending.leave()
        return plan

    async def _round(self, steps: int | None) -> StepPlan:
        if steps is not None and steps != self._round_steps:
            # Logged when it changes (a DBS plan gives this member fewer steps, or
            # the full period again): the steps the plan in force asked for.
            log.info("round %d: %d local steps per round from this round on", self.round + 1, steps)
            self._round_steps = steps
        self._parked = True
        try:
            started = time.monotonic()
            await self.capture_if_wanted()  # asked during the last step: at once, not after the exchange
            result = await self.rounds.next_round(self._view, self.capture_if_wanted)
            self._end_if_reached_elsewhere()
            started = self.time.add("round", started)
            if self.link.export_path and self.link.export_path != self.exported:
                await self._export(self.link.export_path)
            if self.checkpoints.due(self.round):
                await self.checkpoint("periodic")
            started = self.time.add("checkpoint", started)
            evaluated = self.round % self.spec.eval_every_rounds == 0 and self.evaluate is not None
            if evaluated:
                self.metrics = await asyncio.to_thread(self.evaluate)
            self.time.add("evaluate", started)
            self.watch_health(self.metrics if evaluated else None)
            self.report(result)
            self.tblog.round(self.link.progress, self.metrics)
            return self._next_plan()
        finally:
            self._parked = False

    def _end_if_reached_elsewhere(self) -> None:
        """A member asked for this worker's final model: it has reached the job's
        end, so this worker's training is over too, at this round, rather than
        alone past it on its own clock (docs/algorithms.md, "One agreed end")."""
        source = self.source
        if not self.final.end_reached_elsewhere or source.ended_elsewhere or self.stage != Stage.TRAINING:
            return
        source.ended_elsewhere = True
        log.info("round %d: another member has reached the job's end (it asked for this worker's final "
                 "model); ending here with it, at epoch %.3f of %g", self.round, source.progress, self.spec.epochs)

    async def _export(self, path: str) -> None:
        """peerctl export: the exact average of this round's snapshots of the
        members that answer in a round deadline, as a plain state_dict."""
        mean = await round_consensus(self.me, self.store, self.round, self.state.flat.vector, self._view,
                                     self.rounds.layout, self.transport, self.rounds.deadline.deadline())
        state = state_with(self.state.model, self.state.flat.vector, mean.vector)
        try:
            await asyncio.to_thread(write_model, state, Path(path), job=self.spec.name, round=self.round,
                                    step=self.source.step_count, progress=self.source.progress,
                                    metric=self.spec.metric, metrics=self.metrics, consensus=list(mean.plan.members),
                                    fingerprint=self.identity.fingerprint, **self.collapse_info())
        except OSError as exc:
            log.error("export to %s failed: %s", path, exc)
            return
        self.exported, self.exported_round = path, self.round
        log.info("round %d: the average of round %d's models over %s exported to %s", self.round, self.round,
                 mean.describe(), path)

    def watch_health(self, metrics: Mapping[str, float] | None = None, ended: bool = False) -> None:
        """An evaluation (`metrics`, this worker's own model's) to the collapse watch,
        which the training side feeds each step's loss, and the job's end (`ended`);
        once it sees a collapse, say so once, at the round it shows (docs/algorithms.md,
        "When training collapses")."""
        health = self.source.health
        if metrics is not None and self.spec.metric in metrics:
            health.metric(metrics[self.spec.metric], self.source.step_count)
        if ended:
            health.end(self.source.step_count)
        if health.collapse is None or self.collapsed:
            return
        self.collapsed = describe(health.collapse, self.round)
        log.warning("%s; its model will be marked collapsed (the job runs to its end): the same job would "
                    "collapse again, so change it (e.g. a lower [optimizer] lr) and start it again", self.collapsed)

    def evaluated(self, metrics: dict[str, float]) -> None:
        """A script's evaluation (peer.report): the last metrics, and to the collapse watch."""
        self.metrics = metrics
        self.watch_health(metrics)

    def collapse_info(self) -> dict[str, object]:
        """What a model file says of the collapse watch (model.json)."""
        return {"collapsed": bool(self.collapsed), "collapse_reason": self.collapsed}

    def _meta(self) -> StateMeta:
        """Where this worker stands, with the state that is not the vector."""
        t = self.source
        return StateMeta(self.round, t.step_count, t.progress, self.state.extra())

    def _plan(self, members: list[str]) -> BatchPlan | None:
        """DBS: the batch plan for this round from the members' published speeds
        and step models (this worker's own are fresher here than those its daemon
        relays)."""
        if self.rebalancer is None:
            return None
        meter, link = self.source.meter, self.link
        speeds = {**link.speeds, self.me: meter.speed}
        fixed: dict[str, float] = {}
        if self.spec.step_model == "affine":
            speeds, fixed = published_costs(speeds, {**link.fixed_s, self.me: meter.fixed_s},
                                            {**link.per_sample_s, self.me: meter.per_sample_s})
        if self.rebalancer.update(self.round, members, speeds, fixed):
            # The step models it was planned from, exact (JSON floats round-trip): a
            # reader can recompute the plan (peerd.core.shares.plan_batches).
            # period_steps: the S the steps per round were planned out of (plan_batches_and_steps).
            plan, period = self.rebalancer.plan, self.rebalancer.period
            log.info("round %d: batches %s (global %d) planned from %s", self.round,
                     " ".join(f"{p}={b}" for p, b in plan.batches), plan.total,
                     json.dumps({"speeds": speeds, "fixed_s": fixed, "period_steps": period}, sort_keys=True))
            if plan.steps:
                log.info("round %d: steps per round %s (period %d)", self.round,
                         " ".join(f"{p}={s}" for p, s in plan.steps), period)
        return self.rebalancer.plan

    async def capture_if_wanted(self) -> None:
        """Between steps: copy the state if a newcomer asked for it. Called at
        each round and, while a newcomer waits, after every local step
        (Peer.step): a newcomer then waits for one step of each donor, not for
        the end of each donor's round (docs/benchmarks.md, "Join on training
        donors")."""
        if self.board.wanted:
            await self.board.capture(self.state.parts(), self._meta())

    def _wanted(self) -> None:
        """A newcomer started waiting for a capture. While the training thread
        waits in end_round (an exchange, an overlapped round's finish: seconds
        with a slow partner) take it now; else Peer.step takes it after the step
        under way. A copy taken while a round is in flight lacks only that
        round's averaging, as any copy between two rounds' steps does."""
        if not self._parked:
            return

        async def take() -> None:
            await self.board.capture(self.state.parts(), self._meta, when=lambda: self._parked and self.board.wanted)

        task = asyncio.get_running_loop().create_task(take())
        self._captures.add(task)
        task.add_done_callback(self._captures.discard)

    async def finish_in_flight(self) -> RoundResult | None:
        """The overlapped round in flight applied and processed (a leave, the job's end)."""
        return await self.rounds.finish_in_flight(self._view)

    def _refresh(self) -> None:
        """Before each heartbeat while training: the counters as they are now (step,
        loss, speed, where the time went), not as of the last round, which with
        many local steps a round may be minutes old; the last round's figures kept."""
        if self.stage == Stage.TRAINING:
            self.report()

    def report(self, result: RoundResult | None = None, finished: bool = False) -> None:
        rounds = self.rounds
        figures = EngineFigures(self.round, self.phase, self.metrics, self.checkpoints.last,
                                (self.exported, self.exported_round), rounds.misses, rounds.exchange_times,
                                rounds.intrahost_status, self.rejections.counts, self.traffic, self.time,
                                self.collapsed)
        self.link.progress = progress_of(self.source, figures, self.spec, result, self.link.progress, finished)
        self.link.progress.training = self.stage == Stage.TRAINING  # what the daemon decides on, not `phase`
