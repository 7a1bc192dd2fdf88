"""How a worker comes into its job (docs/architecture.md, "A worker's start",
steps 2 to 4): hear from the daemon, hold at the start gate, take the state.

The decisions are peerd.core.startgate's and peerd.core.resume's; this module
carries them out on the engine's link, transport and checkpoints, and returns
what it took (`Joined`) for the engine to apply: the engine alone writes the
worker's round and view address (docs/architecture.md, "One writer for a
worker's state").
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Joined:
    """What a join decided, for the engine to apply (Engine.start)."""

    round: int | None = None  # the round of the state taken (peers' or checkpoint's); None: a fresh start
    # The members that finished the job while this worker was away (or before it
    # came): it trains nothing and ends with their model (JobEnd.take_jobs_model).
    ended_by: tuple[str, ...] = ()


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

    def report(self) -> None: ...

    def show_waiting(self, detail: str) -> str: ...

    def set_view_address(self, address: str) -> None: ...


class Join:
    def __init__(self, engine: Joining) -> None:
        self.engine = engine

    async def run(self, address: str) -> Joined:
        """From serving (at `address`, not yet in the view) to holding the state to train from."""
        e = self.engine
        # The first beat, without our address, shows the view without putting us
        # in it: partners do not wait for a worker that is still taking the state.
        e.report()  # ... and what the others need of it from the start (local data: its n_i)
        await e.link.beat()
        await self._wait_for_daemon_to_settle()
        checkpoint = await e.checkpoints.load_newest()
        if checkpoint is None and self._ended_by() and not self.donors():
            return self._end_here("before this worker came")
        if checkpoint is None and e.spec.min_peers > 1:  # a fresh start: the job wants its peers first
            if await self._wait_for_peers(address) == Start.BEGIN:
                return Joined()  # every member ready holds the same initial state
        return await self._resume(checkpoint)

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
        since, shown = time.monotonic(), ""
        e.set_view_address(address)
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
                    e.set_view_address("")
                    await link.beat()
                    return action
                if action == Start.GIVE_UP:
                    raise StartTimeout(
                        f"job {e.spec.name!r} wants {e.spec.min_peers} members to start ([job] min_peers), "
                        f"but only {gate.describe(e.me, ready)} within {e.spec.start_timeout_s:g} s "
                        "([job] start_timeout_s): not starting alone. Join again once the other peers are up, "
                        "or lower min_peers")
                phase = f"waiting for peers ({gate.describe(e.me, ready)})"
                if phase != shown:
                    log.info("%s: holding the initial state until %d members are ready", phase, gate.min_peers)
                    shown = phase
                    e.show_waiting(phase)
                    e.report()
                await asyncio.sleep(HEARTBEAT_S)
                await link.beat()
        finally:
            e.show_waiting("")

    def _ended_by(self) -> list[str]:
        """The other members that finished the job."""
        return sorted(self.engine.link.finished - {self.engine.me})

    def _end_here(self, when: str) -> Joined:
        """The job ended on its members (`when`: before this worker came, while it
        waited for their state, or while it was away) and nobody serves it now:
        there is nothing left to train. Training on alone, from the initial model
        or from an old checkpoint, would hand back a lone model as the job's: the
        worker trains nothing and ends with the members' model instead."""
        e, ended_by = self.engine, self._ended_by()
        log.warning("the job finished on %s %s: nothing left to train here; ending with their model (to train "
                    "it again, join it under a new name)", ", ".join(ended_by), when)
        e.source.adopt_state(e.state.vector(), e.state.extra(), 0, float(e.spec.epochs))
        return Joined(ended_by=tuple(ended_by))

    def donors(self) -> dict[str, str]:
        """The serving members that have trained: those whose state is worth taking."""
        link = self.engine.link
        return donors(link.view, self.engine.me, trained(link.speeds, link.progresses))

    async def _resume(self, checkpoint: Checkpoint | None) -> Joined:
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
                round_ = await self.take_state(serving, "joining")
                tried, taken = ((Tried.TOOK, (round_, e.source.step_count)) if round_ is not None
                                else (Tried.FAILED, None))
            elif action == Resume.WAIT:
                await asyncio.sleep(HEARTBEAT_S)
                await e.link.beat()
                serving, tried = self.donors(), Tried.WAITED
            elif action == Resume.ENDED:  # they finished while this one waited for their state
                return self._end_here("while this worker waited for their state")
            elif action == Resume.GIVE_UP:
                raise PeerdError(f"could not take the job's state from the running peers "
                                 f"({', '.join(sorted(serving))}) within {JOIN_RETRY_S:g} s; not starting "
                                 "from scratch beside them")
            else:
                if action != Resume.CHECKPOINT:  # KEEP the peers' state taken, or FRESH
                    return Joined(taken[0] if taken else None)
                if tried == Tried.TOOK:
                    log.info("the checkpoint of round %d is ahead of the peers' state: using it", position[0])
                if self._ended_by() and tried != Tried.TOOK:
                    return self._end_here(f"while this worker was away (its checkpoint is of round {position[0]})")
                return Joined(self._adopt_checkpoint(checkpoint))

    def _adopt_checkpoint(self, checkpoint: Checkpoint) -> int:
        """Continue from `checkpoint`; returns its round."""
        e, meta = self.engine, checkpoint.meta
        e.source.adopt_state(checkpoint.vector, meta.extra, meta.step, meta.progress)
        e.checkpoints.resumed(meta.round)
        log.info("resumed from checkpoint %s: round %d, step %d, epoch %.2f",
                 checkpoint.path.name, meta.round, meta.step, meta.progress)
        return meta.round

    async def take_state(self, donors: dict[str, str], why: str) -> int | None:
        """Pull the training state from `donors` in parallel and continue from it;
        returns its round (None: not taken)."""
        e = self.engine
        started, before = time.monotonic(), e.show_waiting("syncing")
        try:
            vector, meta, used = await pull_state(
                e.transport, donors, e.board.numel, e.spec.gossip.deadline_ceiling_s)
            e.source.adopt_state(vector, meta.extra, meta.step, meta.progress)
        except (PeerdError, ValueError) as exc:
            log.warning("%s: could not take the state from %s: %s", why, ", ".join(sorted(donors)), exc)
            return None
        finally:
            e.show_waiting(before)
        if e.rounds.deadline.measured == 0:
            # The state is two model sizes, a round moves about one: a first deadline
            # from this transfer, not the ceiling, so a partner that died while this
            # peer joined costs a short wait (found with peerd.sim, docs/simulation.md).
            e.rounds.deadline.observe((time.monotonic() - started) / 2)
        log.info("%s: took the state of round %d (step %d, epoch %.2f) from %s in %.2fs",
                 why, meta.round, meta.step, meta.progress, ", ".join(used), time.monotonic() - started)
        return meta.round
