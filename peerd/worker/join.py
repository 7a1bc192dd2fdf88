"""How a worker comes into its job (docs/architecture.md, "A worker's start",
steps 2 to 4): hear from the daemon, hold at the start gate, take the state.

The decisions are peerd.core.startgate's and peerd.core.resume's; this module
carries them out on the engine's link, transport and checkpoints.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

from peerd.core.resume import Attempt, Resume, Tried, donors, resume_action, trained
from peerd.core.startgate import Start, StartGate
from peerd.errors import ConfigError, PeerdError
from peerd.settings.jobspec import JobSpec
from peerd.worker.state.checkpoint import Checkpoint
from peerd.worker.state.checkpointer import Checkpointer
from peerd.worker.link import SupervisorLink
from peerd.worker.round.rounds import Rounds
from peerd.worker.train.source import Source
from peerd.worker.state.pull import StateBoard, pull_state
from peerd.worker.state.trainstate import TrainState

log = logging.getLogger("peerd.worker")

HEARTBEAT_S = 0.5
SETTLE_WAIT_S = 30.0  # longest wait for a freshly started daemon to hear from its peers
JOIN_RETRY_S = 30.0  # how long a newcomer retries taking the running peers' state


class StartTimeout(ConfigError):
    """Too few members came to start the job together: a restart would wait the
    same way, so the worker fails (ConfigError's exit code) and says why."""


class Joining(Protocol):
    """The engine, as a joining worker uses it."""

    spec: JobSpec
    me: str
    link: SupervisorLink
    source: Source
    transport: object
    board: StateBoard
    rounds: Rounds
    state: TrainState
    checkpoints: Checkpointer
    phase: str
    round: int

    def report(self) -> None: ...


class Join:
    def __init__(self, engine: Joining) -> None:
        self.engine = engine
        # The members that finished the job while this worker was away (or before it
        # came): it trains nothing and ends with their model (JobEnd.take_jobs_model).
        self.ended_by: list[str] = []

    async def run(self, address: str) -> None:
        """From serving (at `address`, not yet in the view) to holding the state to train from."""
        e = self.engine
        # The first beat, without our address, shows the view without putting us
        # in it: partners do not wait for a worker that is still taking the state.
        e.report()  # ... and what the others need of it from the start (local data: its n_i)
        await e.link.beat()
        await self._wait_for_daemon_to_settle()
        checkpoint = await e.checkpoints.load_newest()
        if checkpoint is None and self._ended_by() and not self.donors():
            self._end_here("before this worker came")
            return
        if checkpoint is None and e.spec.min_peers > 1:  # a fresh start: the job wants its peers first
            if await self._wait_for_peers(address) == Start.BEGIN:
                return  # every member ready holds the same initial state
        await self._resume(checkpoint)

    async def _wait_for_daemon_to_settle(self) -> None:
        """A daemon that just (re)started has not heard from its peers yet: an empty
        view then would start the job over from scratch beside the running one."""
        link, me = self.engine.link, self.engine.me
        settle_by = time.monotonic() + SETTLE_WAIT_S
        while not link.settled and not link.view.keys() - {me} and time.monotonic() < settle_by:
            await asyncio.sleep(HEARTBEAT_S)
            await link.beat()

    async def _wait_for_peers(self, address: str) -> Start:
        """[job] min_peers: hold the initial state and take no step until that
        many members hold it too, or until the job runs already (then _resume
        joins it). Serves meanwhile (its address in the view marks it ready)
        but publishes no speed or progress, so nobody takes it for a running
        job. Gives up after [job] start_timeout_s."""
        e, link = self.engine, self.engine.link
        gate = StartGate(e.spec.min_peers, e.spec.start_timeout_s)
        since = time.monotonic()
        link.address = address
        try:
            while True:
                if link.orphaned:
                    raise PeerdError("lost the daemon while waiting for the job's peers; stopping")
                ready = link.view.keys()
                action = gate.action(e.me, ready, trained(link.speeds, link.progresses), time.monotonic() - since)
                if action == Start.BEGIN:
                    log.info("%s: starting together", gate.describe(e.me, ready))
                    return action
                if action == Start.JOIN:  # not ready while it takes the state: out of the view again
                    link.address = ""
                    await link.beat()
                    return action
                if action == Start.GIVE_UP:
                    raise StartTimeout(
                        f"job {e.spec.name!r} wants {e.spec.min_peers} members to start ([job] min_peers), "
                        f"but only {gate.describe(e.me, ready)} within {e.spec.start_timeout_s:g} s "
                        "([job] start_timeout_s): not starting alone. Join again once the other peers are up, "
                        "or lower min_peers")
                phase = f"waiting for peers ({gate.describe(e.me, ready)})"
                if phase != e.phase:
                    log.info("%s: holding the initial state until %d members are ready", phase, gate.min_peers)
                    e.phase = phase
                    e.report()
                await asyncio.sleep(HEARTBEAT_S)
                await link.beat()
        finally:
            e.phase = "joining"

    def _ended_by(self) -> list[str]:
        """The other members that finished the job."""
        return sorted(self.engine.link.finished - {self.engine.me})

    def _end_here(self, when: str) -> None:
        """The job ended on its members (`when`: before this worker came, while it
        waited for their state, or while it was away) and nobody serves it now:
        there is nothing left to train. Training on alone, from the initial model
        or from an old checkpoint, would hand back a lone model as the job's: the
        worker trains nothing and ends with the members' model instead."""
        e = self.engine
        self.ended_by = self._ended_by()
        log.warning("the job finished on %s %s: nothing left to train here; ending with their model (to train "
                    "it again, join it under a new name)", ", ".join(self.ended_by), when)
        e.source.adopt_state(e.state.vector(), e.state.extra(), 0, float(e.spec.epochs))

    def donors(self) -> dict[str, str]:
        """The serving members that have trained: those whose state is worth taking."""
        link = self.engine.link
        return donors(link.view, self.engine.me, trained(link.speeds, link.progresses))

    async def _resume(self, checkpoint: Checkpoint | None) -> None:
        """Continue the job as resume_action (peerd.core.resume) says: from the
        running peers' state, this peer's newest valid checkpoint, or scratch."""
        e = self.engine
        serving, deadline = self.donors(), time.monotonic() + JOIN_RETRY_S
        position = (checkpoint.meta.round, checkpoint.meta.step) if checkpoint is not None else None
        tried, taken = Tried.NOTHING, None
        while True:
            attempt = Attempt(tried, bool(serving), position, taken, ended=bool(self._ended_by()))
            action = resume_action(attempt, time.monotonic(), deadline)
            if action == Resume.PULL:
                ok = await self.take_state(serving, "joining")
                tried, taken = (Tried.TOOK, (e.round, e.source.step_count)) if ok else (Tried.FAILED, None)
            elif action == Resume.WAIT:
                await asyncio.sleep(HEARTBEAT_S)
                await e.link.beat()
                serving, tried = self.donors(), Tried.WAITED
            elif action == Resume.ENDED:  # they finished while this one waited for their state
                self._end_here("while this worker waited for their state")
                return
            elif action == Resume.GIVE_UP:
                raise PeerdError(f"could not take the job's state from the running peers "
                                 f"({', '.join(sorted(serving))}) within {JOIN_RETRY_S:g} s; not starting "
                                 "from scratch beside them")
            else:
                if action == Resume.CHECKPOINT:
                    if tried == Tried.TOOK:
                        log.info("the checkpoint of round %d is ahead of the peers' state: using it", position[0])
                    if self._ended_by() and tried != Tried.TOOK:
                        self._end_here(f"while this worker was away (its checkpoint is of round {position[0]})")
                    else:
                        self._adopt_checkpoint(checkpoint)
                return

    def _adopt_checkpoint(self, checkpoint: Checkpoint) -> None:
        e, meta = self.engine, checkpoint.meta
        e.source.adopt_state(checkpoint.vector, meta.extra, meta.step, meta.progress)
        e.round = meta.round
        e.checkpoints.resumed(meta.round)
        log.info("resumed from checkpoint %s: round %d, step %d, epoch %.2f",
                 checkpoint.path.name, meta.round, meta.step, meta.progress)

    async def take_state(self, donors: dict[str, str], why: str) -> bool:
        """Pull the training state from `donors` in parallel and continue from it."""
        e = self.engine
        started, phase = time.monotonic(), e.phase
        e.phase = "syncing"
        try:
            vector, meta, used = await pull_state(
                e.transport, donors, e.board.numel, e.spec.gossip.deadline_ceiling_s)
            e.source.adopt_state(vector, meta.extra, meta.step, meta.progress)
        except (PeerdError, ValueError) as exc:
            log.warning("%s: could not take the state from %s: %s", why, ", ".join(sorted(donors)), exc)
            return False
        finally:
            e.phase = phase
        e.round = meta.round
        if e.rounds.deadline.measured == 0:
            # The state is two model sizes, a round moves about one: a first deadline
            # from this transfer, not the ceiling, so a partner that died while this
            # peer joined costs a short wait (found with peerd.sim, docs/simulation.md).
            e.rounds.deadline.observe((time.monotonic() - started) / 2)
        log.info("%s: took the state of round %d (step %d, epoch %.2f) from %s in %.2fs",
                 why, meta.round, meta.step, meta.progress, ", ".join(used), time.monotonic() - started)
        return True
