"""The engine under every worker: the exchange server, the daemon link, rounds.

It trains nothing itself. Something that trains (peerd's own loop, or a user's
script through `peerd.attach`) tells it when local steps are done; the engine
then runs the gossip round on the registered state, serves newcomers, writes
checkpoints and reports progress. It lives in an asyncio loop of its own: the
Peer facade (peerd.peer) runs it in a background thread, so a script's loop and
the engine's server never wait on each other except at a round.

    start()   serve, hear from the daemon, resume (peers' state, or a checkpoint)
    end_round() after the round's local steps (period_steps, or fewer: StepPlan.round_steps): publish, exchange, checkpoint, report
    leave()   drained or signalled: announce, checkpoint
    conclude() the job is done: the exact average of the members' final models
    finish()  the job is done: final report
    close()   stop serving
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from pathlib import Path

from peerd.core.catchup import step_up
from peerd.core.consensus import consensus_timeout
from peerd.core.resume import Attempt, Resume, Tried, donors, resume_action, trained
from peerd.core.shares import BatchPlan, Rebalancer, published_costs
from peerd.core.startgate import Start, StartGate
from peerd.core.stepplan import StepPlan, members_of, own_view, step_plan
from peerd.errors import ConfigError, PeerdError
from peerd.jobspec import JobSpec
from peerd.rejections import Rejections
from peerd.security import Security
from peerd.worker.checkpoint import CheckpointDir
from peerd.worker.checkpointer import Checkpointer
from peerd.worker.consensus import Consensus, final_consensus, round_consensus, state_with
from peerd.worker.gossip import RoundResult
from peerd.worker.link import SupervisorLink
from peerd.worker.progress_report import EngineFigures, TimeSpent, progress_of
from peerd.worker.rounds import Rounds
from peerd.worker.snapshots import FinalStore, Identity, SegmentServer
from peerd.worker.source import Source
from peerd.worker.state import StateBoard, StateMeta, StateServer, pull_state
from peerd.worker.traffic import (
    CountingSegmentServer,
    CountingStateServer,
    CountingTransport,
    Traffic,
)
from peerd.worker.exchange_server import start_exchange_server
from peerd.worker.finalmodel import FinalModel
from peerd.worker.modelfile import write_model
from peerd.worker.transport import GrpcTransport

log = logging.getLogger("peerd.worker")

HEARTBEAT_S = 0.5
SETTLE_WAIT_S = 30.0  # longest wait for a freshly started daemon to hear from its peers
JOIN_RETRY_S = 30.0  # how long a newcomer retries taking the running peers' state


class StartTimeout(ConfigError):
    """Too few members came to start the job together: a restart would wait the
    same way, so the worker fails (ConfigError's exit code) and says why."""


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
    def __init__(
        self, spec: JobSpec, source: Source, peer_id: str, link: SupervisorLink, host: str, out_dir: Path,
        security: Security = Security(), intrahost=None,
    ) -> None:
        self.spec = spec
        self.out_dir = out_dir
        self.source = source
        self.state = source.state
        self.link = link
        self.host = host
        self.me = peer_id
        self.identity = Identity(spec.name, self.state.fingerprint(spec.fingerprint), self.me)
        self.board = StateBoard(self.state.numel, self.state.gossiped)
        self.board.on_wanted = self._wanted
        # The training thread waits in end_round: only this loop moves the state
        # then, so a newcomer's copy can be taken at once (_wanted).
        self._parked = False
        self._captures: set[asyncio.Task] = set()
        self.security = security
        self.rejections = Rejections(log)
        self.traffic = Traffic()
        wire_bytes = 4 if spec.gossip.wire == "fp32" else 2
        self.transport = CountingTransport(
            GrpcTransport(self.identity, security.auth, security.tls, self.rejections, wire=spec.gossip.wire),
            self.traffic, wire_bytes)
        self.rounds = Rounds(spec, self.me, self.state, link, self.transport, intrahost)
        self.store = self.rounds.store
        self.final = FinalStore()  # this peer's final model, for the consensus at the end
        self.consensus: Consensus | None = None
        self._final_segments = 0  # segments of this peer's final model (conclude): the reads finish waits for
        self.checkpoints = Checkpointer(
            CheckpointDir(out_dir / "checkpoints", spec.name, self.identity.fingerprint, self.state.numel),
            spec.checkpoint)
        self.stop_signal = False  # SIGTERM/SIGINT: finish the round, checkpoint, exit
        self.phase = "joining"
        self.round = 0
        self._round_steps = spec.gossip.period_steps  # local steps in the last round (end_round)
        self.metrics: dict[str, float] = {}  # the last evaluation
        self.evaluate = None  # a callable returning metrics every eval_every_rounds (peerd's own loop)
        self.rebalancer = rebalancer_of(spec)
        self._server = None
        self._beats: asyncio.Task | None = None
        self._closed = False
        self.left = False  # announced its leave: no more rounds
        self.exported, self.exported_round = "", 0  # peerctl export: the last file written
        self.time = TimeSpent()

    async def start(self) -> StepPlan:
        """Serve, hear from the daemon, resume; then the plan of the first steps."""
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
        # The first beat, without our address, shows the view without putting us
        # in it: partners do not wait for a worker that is still taking the state.
        self._report(None)  # ... and what the others need of it from the start (local data: its n_i)
        await self.link.beat()
        # A daemon that just (re)started has not heard from its peers yet: an empty
        # view then would start the job over from scratch beside the running one.
        settle_by = time.monotonic() + SETTLE_WAIT_S
        while not self.link.settled and not self.link.view.keys() - {self.me} and time.monotonic() < settle_by:
            await asyncio.sleep(HEARTBEAT_S)
            await self.link.beat()
        checkpoint = await self.checkpoints.load_newest()
        if checkpoint is None and self.spec.min_peers > 1:  # a fresh start: the job wants its peers first
            if await self._wait_for_peers(address) == Start.BEGIN:
                return await self._begin(address)  # every member ready holds the same initial state
        await self._resume(checkpoint)
        return await self._begin(address)

    async def _begin(self, address: str) -> StepPlan:
        """Train from the state this worker holds now."""
        self.phase = "training"
        self.time.start()
        log.info("training from round %d, step %d", self.round, self.source.step_count)
        await self.store.publish(self.round, self.state.flat.vector)
        self.link.address = address
        await self.link.beat()  # the view now decides the split of the first chunk
        self._beats = asyncio.create_task(self.link.run(HEARTBEAT_S, self._refresh))
        return self._next_plan()

    async def close(self) -> None:
        """Stop serving and say so to the daemon (idempotent)."""
        if self._closed:
            return
        self._closed = True
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

    async def _wait_for_peers(self, address: str) -> Start:
        """[job] min_peers: hold the initial state and take no step until that
        many members hold it too, or until the job runs already (then _resume
        joins it). Serves meanwhile (its address in the view marks it ready)
        but publishes no speed or progress, so nobody takes it for a running
        job. Gives up after [job] start_timeout_s."""
        gate = StartGate(self.spec.min_peers, self.spec.start_timeout_s)
        since = time.monotonic()
        self.link.address = address
        try:
            while True:
                if self.link.orphaned:
                    raise PeerdError("lost the daemon while waiting for the job's peers; stopping")
                ready = self.link.view.keys()
                action = gate.action(self.me, ready, trained(self.link.speeds, self.link.progresses),
                                     time.monotonic() - since)
                if action == Start.BEGIN:
                    log.info("%s: starting together", gate.describe(self.me, ready))
                    return action
                if action == Start.JOIN:  # not ready while it takes the state: out of the view again
                    self.link.address = ""
                    await self.link.beat()
                    return action
                if action == Start.GIVE_UP:
                    raise StartTimeout(
                        f"job {self.spec.name!r} wants {self.spec.min_peers} members to start ([job] min_peers), "
                        f"but only {gate.describe(self.me, ready)} within {self.spec.start_timeout_s:g} s "
                        "([job] start_timeout_s): not starting alone. Join again once the other peers are up, "
                        "or lower min_peers")
                phase = f"waiting for peers ({gate.describe(self.me, ready)})"
                if phase != self.phase:
                    log.info("%s: holding the initial state until %d members are ready", phase, gate.min_peers)
                    self.phase = phase
                    self._report(None)
                await asyncio.sleep(HEARTBEAT_S)
                await self.link.beat()
        finally:
            self.phase = "joining"

    def _donors(self) -> dict[str, str]:
        link = self.link
        return donors(link.view, self.me, trained(link.speeds, link.progresses))

    async def _resume(self, checkpoint) -> None:
        """Continue the job as resume_action (peerd.core.resume) says: from the
        running peers' state, this peer's newest valid checkpoint, or scratch."""
        serving, deadline = self._donors(), time.monotonic() + JOIN_RETRY_S
        position = (checkpoint.meta.round, checkpoint.meta.step) if checkpoint is not None else None
        tried, taken = Tried.NOTHING, None
        while True:
            action = resume_action(Attempt(tried, bool(serving), position, taken), time.monotonic(), deadline)
            if action == Resume.PULL:
                ok = await self._take_state(serving, "joining")
                tried, taken = (Tried.TOOK, (self.round, self.source.step_count)) if ok else (Tried.FAILED, None)
            elif action == Resume.WAIT:
                await asyncio.sleep(HEARTBEAT_S)
                await self.link.beat()
                serving, tried = self._donors(), Tried.WAITED
            elif action == Resume.GIVE_UP:
                raise PeerdError(f"could not take the job's state from the running peers "
                                 f"({', '.join(sorted(serving))}) within {JOIN_RETRY_S:g} s; not starting "
                                 "from scratch beside them")
            else:
                if action == Resume.CHECKPOINT:
                    if tried == Tried.TOOK:
                        log.info("the checkpoint of round %d is ahead of the peers' state: using it", position[0])
                    self._adopt_checkpoint(checkpoint)
                return

    def _adopt_checkpoint(self, checkpoint) -> None:
        meta = checkpoint.meta
        # Members that reached the job's end while this worker was away (it
        # crashed and restarted, say) ended the job: train no more of it alone.
        ended_by = sorted(self.link.finished - {self.me})
        progress = max(meta.progress, float(self.spec.epochs)) if ended_by else meta.progress
        self.source.adopt_state(checkpoint.vector, meta.extra, meta.step, progress)
        self.round = meta.round
        self.checkpoints.resumed(meta.round)
        log.info("resumed from checkpoint %s: round %d, step %d, epoch %.2f",
                 checkpoint.path.name, meta.round, meta.step, meta.progress)
        if ended_by:
            log.info("the job finished on %s while this worker was away: ending with this checkpoint",
                     ", ".join(ended_by))

    async def checkpoint(self, why: str) -> None:
        await self.checkpoints.write(self._meta(), self.state.vector(), why)

    def _next_plan(self) -> StepPlan:
        """The plan of the next local steps, from the view of now."""
        link = self.link
        if link.orphaned:
            raise PeerdError("lost the daemon: no heartbeat answer; stopping")
        self._view = view = own_view(link.view, self.me, link.address)
        return step_plan(view, self._plan(members_of(view)), link.stop or self.stop_signal, link.data_sizes,
                         link.terms)

    async def end_round(self, steps: int | None = None) -> StepPlan:
        """The local steps of a round are done (`steps` of them, when the caller
        counts): exchange, then the next plan."""
        if self.left:
            return StepPlan([self.me], 1, None, stop=True)
        if steps is not None and steps != self._round_steps:
            # Logged when it changes (a DBS plan gives this member fewer steps, or
            # the full period again): the steps the plan in force asked for.
            log.info("round %d: %d local steps per round from this round on", self.round + 1, steps)
            self._round_steps = steps
        self._parked = True
        try:
            started = time.monotonic()
            await self.capture_if_wanted()  # asked during the last step: at once, not after the exchange
            self.round += 1
            run = self.rounds.run_overlapped if self.rounds.overlap is not None else self.rounds.run
            result = await run(self.round, self._view, self.capture_if_wanted)
            await self._round_done(result)
            started = self.time.add("round", started)
            if self.link.export_path and self.link.export_path != self.exported:
                await self._export(self.link.export_path)
            if self.checkpoints.due(self.round):
                await self.checkpoint("periodic")
            started = self.time.add("checkpoint", started)
            if self.round % self.spec.eval_every_rounds == 0 and self.evaluate is not None:
                self.metrics = await asyncio.to_thread(self.evaluate)
            self.time.add("evaluate", started)
            self._report(result)
            return self._next_plan()
        finally:
            self._parked = False

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
                                    fingerprint=self.identity.fingerprint)
        except OSError as exc:
            log.error("export to %s failed: %s", path, exc)
            return
        self.exported, self.exported_round = path, self.round
        log.info("round %d: the average of round %d's models over %s exported to %s", self.round, self.round,
                 mean.describe(), path)

    async def leave(self) -> None:
        """Drained or signalled: tell the others, keep a checkpoint."""
        if self.left:
            return
        self.left = True
        await self._round_done(await self.rounds.finish_pending())  # the round in flight is this peer's last
        await self.rounds.leave_group()
        self.phase = "draining"
        why = "the operator asked" if self.link.stop else "stopped by signal"
        log.info("leaving at round %d: %s", self.round, why)
        await self._announce_leave()
        await self.checkpoint(why)

    async def settle(self) -> None:
        """Apply the round still in flight (overlapped mode), before the final
        evaluation and the model file."""
        await self._round_done(await self.rounds.finish_pending())

    def consensus_limit_s(self) -> float:
        """The longest the final exchange may take, with the view of now."""
        others = len(self.link.view.keys() - {self.me})
        return consensus_timeout(self.spec.gossip.deadline_ceiling_s, self.rounds.deadline.deadline(), others)

    async def conclude(self, metrics: dict[str, float]) -> dict[str, float]:
        """The job is done here: average the final models of the members still in
        it, take the average as this peer's model, and return `metrics` (of its
        own model) with the average's beside them, as consensus_<name>."""
        self.phase = "consensus"
        self._report(None)
        await self.rounds.leave_group()
        await self.store.finish()  # partners asking for a later round are answered at once
        await self.rounds.stages.finish()
        peers = {p: a for p, a in self.link.view.items() if p != self.me}
        model = FinalModel(self.state)
        self._final_segments = len(model.layout(self.rounds.layout))
        self.consensus = c = await final_consensus(self.me, model, self.final, peers, self.rounds.layout,
                                                   self.transport, self.consensus_limit_s())
        log.info("consensus at the end over %s: digest %s, own model %.3g%% from it, %.2fs", c.describe(),
                 c.digest, 100 * c.own_gap, c.seconds)
        theirs = metrics
        if not c.plan.alone:
            model.adopt(c.vector)
            theirs = await asyncio.to_thread(self.evaluate) if self.evaluate is not None else {}
        return {**metrics, **{f"consensus_{k}": v for k, v in theirs.items()}, "consensus_peers": float(c.plan.size)}

    async def finish(self, metrics: dict[str, float], model_path: Path | None) -> None:
        """The job is done: the last metrics and where the model went; then serve
        the final model until the others in the consensus have read it."""
        self.metrics = metrics
        self._report(None, finished=True)
        name = self.spec.metric
        log.info("finished: %d steps, %d rounds, %s %.4f (own model), %.4f (consensus of %d); model saved to %s",
                 self.source.step_count, self.round, name, metrics.get(name, math.nan),
                 metrics.get(f"consensus_{name}", math.nan), int(metrics.get("consensus_peers", 1)),
                 model_path or "nowhere (no trained model)")
        if self.consensus is not None and not self.consensus.plan.alone:
            reads = (self.consensus.plan.size - 1) * self._final_segments
            if not await self.final.wait_served(reads, self.consensus_limit_s()):
                log.info("not every peer of the consensus read this peer's final model in time")

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
            # period_steps: the S the steps per round were planned out of (plan_round).
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

    async def _announce_leave(self) -> None:
        """Leave after this round: partners asking for a later one are told at
        once (not after their deadline), and the daemon's next Hello, sent at once,
        no longer lists this worker, so the others plan the next round without it."""
        await self.store.finish()
        await self.rounds.stages.finish()
        await self.final.finish()  # no final model from here: the consensus does not wait for it
        self.link.address = ""
        await self.link.beat()

    async def _round_done(self, result: RoundResult | None) -> None:
        """A round's result: count the values it refused, step up to a partner ahead."""
        if result is not None:
            for source, why in result.non_finite.items():
                self.rejections.record(self._view.get(source, source), "non_finite", why)
        self._catch_up(result)

    def _catch_up(self, result: RoundResult | None) -> None:
        """A partner is rounds ahead: step up to its round, keeping this model (peerd.core.catchup)."""
        up = step_up(self.round, result.ahead_round) if result is not None else None
        if up is None:
            return
        if up.logged:
            log.info("round %d: %s is in round %d; stepping up to it", self.round, result.ahead_peer,
                     result.ahead_round)
        self.round = up.round

    async def _take_state(self, donors: dict[str, str], why: str) -> bool:
        """Pull the training state from `donors` in parallel and continue from it."""
        started, phase = time.monotonic(), self.phase
        self.phase = "syncing"
        try:
            vector, meta, used = await pull_state(
                self.transport, donors, self.board.numel, self.spec.gossip.deadline_ceiling_s)
            self.source.adopt_state(vector, meta.extra, meta.step, meta.progress)
        except (PeerdError, ValueError) as exc:
            log.warning("%s: could not take the state from %s: %s", why, ", ".join(sorted(donors)), exc)
            return False
        finally:
            self.phase = phase
        self.round = meta.round
        if self.rounds.deadline.measured == 0:
            # The state is two model sizes, a round moves about one: a first deadline
            # from this transfer, not the ceiling, so a partner that died while this
            # peer joined costs a short wait (found with peerd.sim, docs/simulation.md).
            self.rounds.deadline.observe((time.monotonic() - started) / 2)
        log.info("%s: took the state of round %d (step %d, epoch %.2f) from %s in %.2fs",
                 why, meta.round, meta.step, meta.progress, ", ".join(used), time.monotonic() - started)
        return True

    def _refresh(self) -> None:
        """Before each heartbeat while training: the counters as they are now (step,
        loss, speed, where the time went), not as of the last round, which with
        many local steps a round may be minutes old; the last round's figures kept."""
        if self.phase == "training" and not self.left:
            self._report(None)

    def _report(self, result: RoundResult | None, finished: bool = False) -> None:
        rounds = self.rounds
        figures = EngineFigures(self.round, self.phase, self.metrics, self.checkpoints.last,
                                (self.exported, self.exported_round), rounds.misses, rounds.exchange_times,
                                rounds.intrahost_status, self.rejections.counts, self.traffic, self.time)
        self.link.progress = progress_of(self.source, figures, self.spec, result, self.link.progress, finished)
