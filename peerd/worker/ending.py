"""How a worker's part in its job ends (peerd.core.lifecycle): a leave at the
round a stop came, or, once every epoch is trained, one model at the end
(docs/algorithms.md, "One model at the end") and the model file.

The end returns how it ended (`Ended`) for the engine to apply: the engine alone
writes the worker's stage, metrics and view address (docs/architecture.md, "One
writer for a worker's state"); this module moves the stage only through the
engine's `on`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from peerd.core.consensus import consensus_timeout, end_patience_s
from peerd.core.lifecycle import Event
from peerd.core.stepplan import StepPlan
from peerd.settings.jobspec import JobSpec
from peerd.worker.state.consensus import Consensus, Patience
from peerd.worker.state.endparts import final_consensus
from peerd.worker.state.finalmodel import FinalModel
from peerd.worker.round.shared import RoundResult
from peerd.worker.jobresult import first_end, take_jobs_model
from peerd.worker.link import SupervisorLink
from peerd.worker.state.modelfile import load_model, save_model
from peerd.worker.state.pull import StateBoard
from peerd.worker.round.rounds import Rounds
from peerd.worker.wire.stores import FinalStore, Identity, SnapshotStore
from peerd.worker.wire.traffic import Traffic
from peerd.worker.train.source import Source
from peerd.worker.tblog import TensorBoardLog
from peerd.worker.state.trainstate import TrainState

log = logging.getLogger("peerd.worker")

CLOSE_TIMEOUT_S = 30.0  # the longest a step of the end may take, beyond the consensus's own limit
# A leaving worker answers partners ("finished") until none has asked for this
# long (a heartbeat: their views drop it within one after its daemon's Hello),
# at most LEAVE_LINGER_S: gone at once, it would be a refused connection, a miss,
# and after two rounds a suspicion instead of a leave.
LEAVE_QUIET_S = 0.5
LEAVE_LINGER_S = 5.0


@dataclass(frozen=True)
class Ended:
    """How the job ended here, for the engine to apply (Engine.end): the move
    (peerd.core.lifecycle), the last metrics, where the model came from."""

    event: Event
    metrics: dict[str, float]
    model_source: str
    model_path: Path | None = None  # model.pt, when this worker's own end wrote one
    own: bool = False  # this worker's own end: said, and its final model served (JobEnd.serve_final)


class Ending(Protocol):
    """The engine, as a worker's end uses it."""

    spec: JobSpec
    me: str
    identity: Identity
    out_dir: Path
    link: SupervisorLink
    source: Source
    transport: object
    state: TrainState
    rounds: Rounds
    store: SnapshotStore
    board: StateBoard
    final: FinalStore
    traffic: Traffic
    round: int
    evaluate: Callable[[], dict[str, float]] | None
    tblog: TensorBoardLog
    collapsed: str
    left: set[str]

    def watch_health(self, metrics: dict[str, float] | None = None, ended: bool = False) -> None: ...

    def collapse_info(self) -> dict[str, object]: ...

    def on(self, event: Event) -> bool: ...

    def set_view_address(self, address: str) -> None: ...

    def report(self, result: RoundResult | None = None, finished: bool = False) -> None: ...

    async def finish_in_flight(self) -> RoundResult | None: ...

    async def checkpoint(self, why: str) -> None: ...


class JobEnd:
    def __init__(self, engine: Ending) -> None:
        self.engine = engine
        self.consensus: Consensus | None = None
        self._asked: set[str] = set()  # the members the end consensus asked for their final models

    async def leave(self) -> None:
        """Drained or signalled, at the end of a round (the engine has moved to
        LEFT): tell the others, keep a checkpoint."""
        e = self.engine
        await e.finish_in_flight()  # the round in flight is this peer's last
        await e.rounds.leave_group()
        why = ((e.link.stop_reason or "the operator asked") if e.link.stop
               else "lost the daemon" if e.link.orphaned else "stopped by signal")
        log.info("leaving at round %d: %s", e.round, why)
        await self._announce_leave()
        announced = time.monotonic()
        await e.checkpoint(why)
        e.tblog.close()
        await self._linger(announced)

    async def leave_mid_round(self, steps: int) -> StepPlan:
        """Signalled `steps` local steps into a round that is not done: leave now,
        without the round's exchange (the partners are still in their steps), with
        those steps in the checkpoint; a resumed worker goes on from them."""
        e = self.engine
        if e.on(Event.STOP):
            log.info("round %d: stopped by signal after %d local step(s) of the round; no exchange for it",
                     e.round, steps)
            await self.leave()
        return StepPlan([e.me], 1, None, stop=True)

    async def _announce_leave(self) -> None:
        """Leave after this round: partners asking for a later one are told at
        once (not after their deadline), and the daemon's next Hello, sent at once,
        no longer lists this worker, so the others plan the next round without it."""
        e = self.engine
        await e.store.finish()
        await e.rounds.stages.finish()
        await e.final.finish()  # no final model from here: the consensus does not wait for it
        e.set_view_address("")
        await e.link.beat()

    async def _linger(self, announced: float) -> None:
        """Serve on until the partners have stopped asking since the leave was
        announced: they have seen it."""
        traffic, until = self.engine.traffic, announced + LEAVE_LINGER_S
        while time.monotonic() < until and time.monotonic() - max(traffic.last_asked, announced) < LEAVE_QUIET_S:
            await asyncio.sleep(0.05)

    async def finish_job(self, metrics: dict[str, float]) -> Ended:
        """Every epoch is trained here: apply the round still in flight
        (overlapped mode), evaluate, average with the members still in the
        job, write the model file; returns how it ended, for the engine to report
        before serve_final."""
        e = self.engine
        await asyncio.wait_for(self._last_round_in(), CLOSE_TIMEOUT_S)
        # The own model's evaluation runs beside the consensus, not before it: the
        # consensus's first ask is how a member still training learns of the end
        # (Engine._end_if_reached_elsewhere), and it would train on alone for as
        # long as the job's validation set takes. The model changes only once both are done.
        own = asyncio.ensure_future(asyncio.to_thread(e.evaluate)) if e.evaluate is not None else None
        patience = end_patience_s(self.consensus_limit_s())
        try:
            c = await asyncio.wait_for(self._conclude(patience), patience + CLOSE_TIMEOUT_S)
        finally:
            if own is not None:  # a thread is not cancelled: it ends before the model changes
                metrics = {**metrics, **await own}
        # The end's evaluation (a script's report was watched as it came), and the end itself.
        e.watch_health(metrics if own is not None else None, ended=True)
        if not c.plan.alone:
            FinalModel(e.state).adopt(c.vector)
        if (taken := await self._first_end(c)) is not None:
            return taken
        # Evaluated outside that limit: the wait for the others may have used it all,
        # and an evaluation's length is the job's own (a large validation set).
        theirs = metrics
        if not c.plan.alone:
            theirs = await asyncio.to_thread(e.evaluate) if e.evaluate is not None else {}
        metrics = {**metrics, **{f"consensus_{k}": v for k, v in theirs.items()}, "consensus_peers": float(c.plan.size)}
        path = await asyncio.to_thread(self._write_model, metrics)
        source = ("none: no step was taken here" if path is None
                  else "own" if c is None or c.plan.alone else f"consensus of {c.plan.size}")
        return Ended(Event.AGREED if path is not None else Event.NO_STEP, metrics, source, path, own=True)

    async def serve_final(self, end: Ended) -> None:
        """This worker's own end, reported: say so, then serve the final model
        until the others in the consensus have read it."""
        await asyncio.wait_for(self._finish(end.metrics, end.model_path), self.consensus_limit_s() + CLOSE_TIMEOUT_S)

    async def _first_end(self, c: Consensus) -> Ended | None:
        """Members that ended before this one with another consensus (a frozen
        daemon hid one side from the other): the first end is the job's, so this
        worker takes that model rather than save its own average. Asked: the
        members in the view at the end and those seen leaving it, since a member
        that ended first leaves the view (with it, its daemon knows whom to ask)."""
        e = self.engine
        members = sorted((self._asked | e.left) - {e.me})
        if not members:
            return None
        taken = await first_end(e.link, e.identity.fingerprint, members, c.digest, e.spec.metric)
        if not taken.taken:
            return None
        await self._adopt_taken()
        return Ended(Event.TAKEN, taken.metrics, taken.source)

    async def take_jobs_model(self, ended_by: list[str]) -> Ended:
        """The job ended on `ended_by` while this worker was away: it trained
        nothing since, and ends with their model, or with none (peerd.worker.jobresult)."""
        e = self.engine
        e.report()  # its phase: taking the job's model (the stage's)
        taken = await take_jobs_model(e.link, e.identity.fingerprint, ended_by, e.spec.name, e.spec.metric)
        if taken.taken:
            await self._adopt_taken()
        return Ended(Event.TAKEN if taken.taken else Event.NONE_TAKEN, taken.metrics, taken.source)

    async def _adopt_taken(self) -> None:
        """The job's model, which the daemon saved as model.pt, into this worker's
        model: a script goes on with its module once training returns (its own
        evaluation, save_pretrained), and that must be the job's model."""
        e = self.engine
        await asyncio.to_thread(load_model, e.state.model, e.out_dir / "model.pt")

    async def _last_round_in(self) -> None:
        """The rounds' last effects in the model: the round in flight applied,
        the int8 wire's residual given back."""
        await self.engine.finish_in_flight()
        self.engine.rounds.settle_feedback()  # the end consensus averages the models alone, in fp32

    def consensus_limit_s(self) -> float:
        """The longest the final exchange may take, with the view of now."""
        e = self.engine
        others = len(e.link.view.keys() - {e.me})
        return consensus_timeout(e.spec.gossip.deadline_ceiling_s, e.rounds.deadline.deadline(), others)

    async def _conclude(self, patience_s: float) -> Consensus:
        """The job is done here: average the final models of the members still in
        it (waiting up to `patience_s` for those still training while their
        daemons list them); the caller makes the average this peer's model."""
        e = self.engine
        e.on(Event.TRAINED_OUT)
        e.report()  # its phase: consensus (the stage's)
        await e.board.finish()  # a newcomer now must not take a copy from before the end
        await e.rounds.leave_group()
        await e.store.finish()  # partners asking for a later round are answered at once
        await e.rounds.stages.finish()
        peers = {p: a for p, a in e.link.view.items() if p != e.me}
        self._asked = set(peers)
        model = FinalModel(e.state)
        # Waited for while its worker still serves, unless this one was asked to leave meanwhile.
        patience = Patience(lambda peer: bool(e.link.view.get(peer)) and not e.link.stop, patience_s)
        self.consensus = c = await final_consensus(e.me, model, e.final, peers, e.rounds.layout,
                                                   e.transport, self.consensus_limit_s(), patience)
        log.info("consensus at the end over %s: digest %s, own model %.3g%% from it, %.2fs", c.describe(),
                 c.digest, 100 * c.own_gap, c.seconds)
        return c

    def _write_model(self, metrics: dict[str, float]) -> Path | None:
        """model.pt, unless nobody's steps are in this model: it would hand back
        the initial model as the job's result."""
        e, c = self.engine, self.consensus
        if c.plan.alone and e.source.step_count == 0:
            log.error("finished without a trained model: no step was taken here and no peer's "
                      "model reached the consensus; model.pt not written")
            return None
        path = e.out_dir / "model.pt"
        save_model(e.state.model, path, job=e.spec.name, step=e.source.step_count,
                   progress=e.source.progress, round=e.round, metric=e.spec.metric, metrics=metrics,
                   fingerprint=e.identity.fingerprint, consensus=list(c.plan.members), consensus_digest=c.digest,
                   **e.collapse_info())
        return path

    async def _finish(self, metrics: dict[str, float], model_path: Path | None) -> None:
        """The job is done (reported with its last metrics and where the model
        went); serve the final model until the others in the consensus have read it."""
        e = self.engine
        e.tblog.finished(e.link.progress)
        name = e.spec.metric
        # A collapsed job ends all the same (its epochs are done), said beside it (docs/operations.md).
        say, collapsed = (log.warning, f", collapsed ({e.collapsed})") if e.collapsed else (log.info, "")
        say("finished%s: %d steps, %d rounds, %s %.4f (own model), %.4f (consensus of %d); model saved to %s",
            collapsed, e.source.step_count, e.round, name, metrics.get(name, math.nan),
            metrics.get(f"consensus_{name}", math.nan), int(metrics.get("consensus_peers", 1)),
            model_path or "nowhere (no trained model)")
        if self.consensus is not None and not self.consensus.plan.alone:
            if not await e.final.wait_served(self.consensus.owed_reads, self.consensus_limit_s()):
                log.info("not every peer of the consensus read this peer's final model in time")
