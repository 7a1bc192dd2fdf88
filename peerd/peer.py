"""`peerd.attach`: a training script joins its peerd job with a handful of lines.

    import peerd
    peer = peerd.attach(model, optimizer, scheduler=sched, scheduler_interval="step", scaler=scaler,
                        evaluate=lambda: {"val_loss": evaluate(model)})
    for batch in peer.loader(train_set, batch_size=32):
        loss = compute_loss(model, batch); loss.backward()
        optimizer.step(); optimizer.zero_grad(); sched.step()
        peer.step(batch_size=len(batch[0]), loss=loss)
        if peer.should_stop:
            break

A script's own epoch loop may stay around the loader: peer.loader() hands out
this peer's batches of the whole job (every epoch, as far as the job's position
is when it is made), so the first pass of the outer loop trains the job to its
end and the later passes get no batch; peer.epoch is the job's epoch of the
batch in hand, for per-epoch logs:

    sched = OneCycleLR(optimizer, max_lr=0.1, total_steps=peerd.total_steps(train_set, 32))
    peer = peerd.attach(model, optimizer, scheduler=sched, scheduler_interval="step")
    for epoch in range(EPOCHS):
        for x, y in peer.loader(train_set, batch_size=32):
            ...; sched.step()
            peer.step(loss=loss)
        print(f"trained to epoch {peer.epoch}")

A scheduler given to attach() follows the job's position in the unit declared
(peerd.worker.train.scriptschedule): written for one process, it ends with the job;
peerd.total_steps() is the length a per-batch schedule (OneCycleLR's
total_steps) must have. The script runs in its worker's own directory (the
job's per-worker directory, where model.pt goes), so its relative writes stay
apart from other workers'.
attach() registers the training state (the model, the optimizer's state made up
front, the scheduler's and scaler's state, anything else with state_dict and
load_state_dict) and blocks until this peer holds the job's state: from the
running peers (verified), from its own checkpoint, or the fresh one when it is
the first. The engine (peerd.worker.engine) then runs in a background thread:
it serves partners while the script computes and takes the gossip round when
peer.step() says the round's local steps are done. peerd's own training loop
(peerd.worker.main) is a client of this same class. How the daemon started the
worker is in peerd.control.launch; a script's counters are peerd.worker.train.scriptsource.
"""

from __future__ import annotations

import asyncio
import logging
import math
import signal
import threading
from collections.abc import Callable, Mapping

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from peerd.core.lifecycle import Stage
from peerd.core.lr import ScaleRamp
from peerd.core.slowdown import Slowdown
from peerd.core.stepplan import StepPlan
from peerd.errors import ConfigError
from peerd.control.launch import Launch, current_launch, set_launch
from peerd.worker.train.scriptschedule import ScriptScheduler, check_scheduler
from peerd.worker.train.modes import script_evaluation as _script_evaluation
from peerd.worker.train.scriptsource import ScriptLoader, ScriptSource
from peerd.worker.train.scriptsource import loss_value as _loss_value
from peerd.worker.train.scriptsource import total_steps as _total_steps
from peerd.worker.train.data import PeerSampler, View, default_loader
from peerd.worker.train.device import resolve_device
from peerd.worker.ending import CLOSE_TIMEOUT_S
from peerd.worker.engine import Engine
from peerd.worker.link import SupervisorLink
from peerd.worker.loopthread import LoopThread
from peerd.worker.train.lrcontrol import LrControl
from peerd.worker.train.optim import init_state
from peerd.worker.train.slowdown import SlowedSteps
from peerd.worker.state.trainstate import Stateful, TrainState

__all__ = ["Launch", "Peer", "ScriptSource", "attach", "last_attached", "set_launch", "total_steps"]

log = logging.getLogger("peerd.worker")

_attached: list[Peer] = []


def attach(model: nn.Module, optimizer: torch.optim.Optimizer, *, scheduler: Stateful | None = None,
           scheduler_interval: str | None = None, scaler: Stateful | None = None,
           state: dict[str, Stateful] | None = None, evaluate: Callable[[], Mapping[str, float]] | None = None) -> Peer:
    """Join this script's peerd job with `model` and `optimizer` (and whatever
    else a newcomer must receive); returns once this peer holds the job's state.

    `evaluate()`, if given, returns the job's metrics of `model` as it is now;
    peerd calls it every `eval_every_rounds` rounds and at the end, on this
    peer's own model and on the members' average that becomes the final model
    (reported as consensus_<name>), with the model's train/eval mode restored.
    A `scheduler` needs its `scheduler_interval`, "step" or "epoch" (peerd.worker.train.scriptschedule)."""
    launch = current_launch()
    if launch is None:
        raise ConfigError("peerd.attach(): this script was not started by peerd; run it as a script job "
                          "(a job file with [job] script = \"...\", then peerctl join JOB.toml, "
                          "or peerd cluster --job JOB.toml)")
    if _attached and not _attached[-1].closed:
        raise ConfigError("peerd.attach() was called twice: a worker trains one job with one model")
    if any(p.dtype != torch.float32 for p in model.parameters() if p.requires_grad):
        raise ConfigError("peerd.attach(): peerd averages fp32 parameters; keep the model in fp32 and use "
                          "autocast (bf16/fp16) for speed")
    if scheduler is not None:
        check_scheduler(scheduler, scheduler_interval)
    objects = {k: v for k, v in (("scheduler", scheduler), ("scaler", scaler)) if v is not None}
    objects.update(state or {})
    init_state(optimizer)
    spec = launch.spec
    train_state = TrainState(model, optimizer, average_buffers=spec.gossip.average_buffers,
                             average_optimizer_state=spec.gossip.average_optimizer_state, objects=objects,
                             outer=spec.outer.enabled)
    lr = LrControl(spec.optimizer, lr_of="the script's")
    lr.install(optimizer)
    peer = Peer(launch, ScriptSource(train_state, spec, launch.peer_id, lr),
                evaluate=_script_evaluation(model, evaluate) if evaluate is not None else None)
    lr.before_step = peer._before_optimizer_step
    if scheduler is not None:  # at the job's position now
        peer.source.schedule = ScriptScheduler(scheduler, scheduler_interval, spec.epochs)
    _attached.append(peer)
    return peer


def last_attached() -> Peer | None:
    """The Peer that attach() made last in this process (None before the first)."""
    return _attached[-1] if _attached else None


def total_steps(dataset: Dataset | int, batch_size: int | None = None, epochs: float | None = None) -> int:
    """The steps a per-batch scheduler must allow (OneCycleLR's `total_steps`)
    for one process to train the job's `[job] epochs` over `dataset` (or a
    number of samples) at `batch_size` (default: the job's local_batch), the
    job's short last batch included. Callable before attach(), so the
    scheduler given to it can be made with it; outside a peerd job (a plain
    twin of the script), `epochs` and `batch_size` must be given. A registered
    scheduler is never stepped past it (Peer._advance_scheduler), and a peer's
    own scheduler.step() per local step never gets there first."""
    launch = current_launch()
    if epochs is None or batch_size is None:
        if launch is None:
            raise ConfigError("peerd.total_steps(): outside a peerd job, give epochs= and batch_size=")
        epochs = launch.spec.epochs if epochs is None else epochs
        batch_size = batch_size or launch.spec.local_batch
    samples = dataset if isinstance(dataset, int) else len(dataset)
    return _total_steps(epochs, samples, batch_size)


class Peer:
    """This worker's handle on its job: made by peerd.attach (a script) or by
    peerd's own loop. Not thread-safe: call it from the training thread."""

    def __init__(self, launch: Launch, source, evaluate: Callable[[], dict[str, float]] | None = None) -> None:
        self.launch = launch
        self.spec = launch.spec
        self.source = source
        self.state: TrainState = source.state
        self.metrics: dict[str, float] = {}
        self._script = isinstance(source, ScriptSource)
        self._since_round = 0
        self._steps = 0
        self._left = self.closed = False
        self.outcome = ""
        self._signals = 0
        self._loop = LoopThread()
        try:
            self._engine: Engine = self._loop.call(self._make_engine(evaluate))
            self._install_signals()
            self._plan: StepPlan = self._loop.call(self._engine.start())
        except BaseException:
            self._abort()
            raise
        self._watch = asyncio.run_coroutine_threadsafe(self._watch_first_step(), self._loop.loop)
        if self._script:
            self._update_lr()
        self._slowed = SlowedSteps(Slowdown(self.launch.slowdown, self.launch.slowdown_clock,
                                            self.launch.step_overhead_s))
        self._slowed.start()

    async def _make_engine(self, evaluate) -> Engine:
        """Made in the engine's loop: its gRPC channels belong to that loop."""
        launch = self.launch
        link = SupervisorLink(launch.control, self.spec.name, self.state.fingerprint(self.spec.fingerprint),
                              member=launch.peer_id)
        engine = Engine(self.source, link, launch)
        engine.evaluate = evaluate
        return engine

    # -- what a script reads ------------------------------------------------------------------

    @property
    def peer_id(self) -> str:
        return self.launch.peer_id

    @property
    def device(self) -> torch.device:
        """The device this worker was given ([worker] device / devices)."""
        return resolve_device(self.launch.device)

    @property
    def round(self) -> int:
        return self._engine.round

    @property
    def epoch(self) -> int:
        """The job's epoch (from 0) this peer is in: of the batch the script
        trains on now, between steps of the last one; never the job's end
        (`epochs`) itself. For per-epoch logs."""
        if self._script:
            return self.source.batch_epoch
        return min(self.source.epoch, max(0, math.ceil(self.spec.epochs) - 1))

    @property
    def progress(self) -> float:
        """The job's epochs done, fractional, as far as this peer's steps go."""
        return self.source.progress

    @property
    def local_steps(self) -> int:
        """peer.step() calls so far."""
        return self._steps

    @property
    def plan(self) -> StepPlan:
        """Members, trainers and the DBS batches for the next local steps."""
        return self._plan

    @property
    def done(self) -> bool:
        return getattr(self.source, "done", False)

    @property
    def should_stop(self) -> bool:
        """Stop training: the job's epochs are done, or this peer left (drained,
        or stopped by a signal after its round and checkpoint)."""
        return self._left or self.done

    # -- what a script calls ----------------------------------------------------------------

    def loader(self, dataset: Dataset, batch_size: int | None = None, **options) -> DataLoader:
        """This peer's part of `dataset` for the rest of the job (every epoch
        from the job's position on), in batches of the job's local_batch (or
        `batch_size`; with DBS, the size the measured speeds give). Once the job
        is done here (or this peer left) a loader yields nothing, so a script's
        own epoch loop around it ends. `options` go to the DataLoader
        (num_workers, pin_memory, collate_fn, ...); the sampler is peerd's."""
        if not self._script:
            raise ConfigError("peer.loader() is for scripts; peerd's own loop reads through its job module")
        if "batch_size" in options or "shuffle" in options or "sampler" in options:
            raise ConfigError("peer.loader(): peerd decides the batches (its sampler splits the data among "
                              "the peers); drop batch_size/shuffle/sampler from the options")
        size = batch_size or self.spec.local_batch
        if self.should_stop:
            return DataLoader(dataset, batch_sampler=[])
        source: ScriptSource = self.source
        cursor = source.new_cursor(len(dataset))
        view = View()

        def batch(v: View) -> int:
            plan = self._plan
            v.members, v.plan = plan.members, plan.plan
            return plan.plan.batch(self.peer_id) if plan.plan is not None else size

        source.sampler = PeerSampler(cursor, view, batch, 0)
        if source.schedule is not None:
            source.sampler.on_hand = source.schedule.at_batch
        source.local_batch = size
        source.samples_per_epoch = len(dataset)
        if size != source.planned_batch or self._steps == 0:  # the first step's LR has the law's factor too
            source.planned_batch = size
            self._update_lr(fresh=self._steps == 0)
        if not options:
            d = self.spec.data_loading
            loader = default_loader(dataset, source.sampler, d.loader_workers, False, d.prefetch_factor, ScriptLoader)
        else:
            loader = ScriptLoader(dataset, batch_sampler=source.sampler, **options)
        loader.source = source  # counts the batches the script takes: its accumulation
        return loader

    def total_steps(self, dataset: Dataset | int, batch_size: int | None = None) -> int:
        """peerd.total_steps() for this job: the steps a per-batch schedule over
        `dataset` at `batch_size` (default: the job's local_batch) must allow."""
        return total_steps(dataset, batch_size or self.spec.local_batch, self.spec.epochs)

    def step(self, batch_size: int | None = None, loss: float | torch.Tensor | None = None) -> None:
        """A local step is done (call it after optimizer.step(), also when a
        GradScaler skipped the step): the gossip round when one is due.
        `batch_size` (the samples of the optimizer step) defaults to the
        loader's batches of the step; `loss` is a number or the loss tensor
        (detached here)."""
        changed = False
        if self._script:
            elapsed = self._slowed.finish()  # the testing knob's sleep (a slower device) included
            changed = self.source.record(batch_size, _loss_value(loss), elapsed)
        self._count_step()
        self._since_round += 1
        if self._since_round >= self._plan.round_steps(self.peer_id, self.spec.gossip.period_steps) \
                and not self._left:
            steps, self._since_round = self._since_round, 0
            self._plan = self._loop.call(self._engine.end_round(steps))  # left there if the plan says stop
            if self._plan.stop:
                self._left = True
        elif self._engine.stop_signal and not self._left:
            # A signal within a long round ([gossip] period_steps, [outer] every): leave
            # after this step, not after the rest of the round, or the daemon's grace
            # runs out first and the worker is killed without its checkpoint.
            self._plan = self._loop.call(self._engine.ending.leave_mid_round(self._since_round))
            self._left = True
        if self._engine.board.wanted and not self._left:
            # A newcomer waits for this peer's state: copy it now, between two
            # steps (the training thread waits meanwhile, so the copy is of one
            # step's state), rather than at the end of the round. Also right
            # after a round whose exchange the request arrived during.
            self._loop.call(self._engine.capture_if_wanted())
        if self._script:
            self._advance_scheduler()
            # A first step no optimizer hook saw (skipped) showed the accumulation: no ramp from the guess.
            self._update_lr(fresh=self._steps == 1 and changed)
        self._slowed.start()

    def _count_step(self) -> None:
        """One more step; a first step that came after the no-step warning puts
        the phase shown back (checked at every step: the warning may land meanwhile)."""
        self._steps += 1
        self._engine.wait_for_first_step(False)

    def report(self, metrics: dict[str, float]) -> None:
        """The script's evaluation: shown by peerctl status and the metrics
        endpoint (the job's `metric` key is the headline), kept in model.json."""
        self.metrics = {str(k): float(v) for k, v in metrics.items()}
        self._engine.evaluated(self.metrics)

    def close(self, finished: bool | None = None) -> str:
        """Leave the job in order: "finished" (the model is saved to model.pt),
        "left" (drained), or "stopped". Idempotent; runs at exit too."""
        if self.closed:
            return self.outcome
        if finished is None:
            finished = not self._left
        try:
            self.outcome = self._loop.call(self._engine.end(finished, self.metrics))
        finally:
            self._abort()
        return self.outcome

    # -- inside -----------------------------------------------------------------------------

    def _advance_scheduler(self) -> None:
        """A registered scheduler follows the job's position in its own unit
        (peerd.worker.train.scriptschedule), never past the schedule's end:
        peerd.total_steps(), or a OneCycleLR's own."""
        source: ScriptSource = self.source
        if source.schedule is None or source.sampler is None:
            return
        end = min(source.total_steps, getattr(source.schedule.scheduler, "total_steps", source.total_steps))
        source.schedule.at_step(source.progress, source.steps_per_epoch, end, source.sampler.handed)

    def _before_optimizer_step(self) -> None:
        """The script's optimizer is about to step: the first step of this
        process shows its accumulation (ScriptSource.accumulation_at_step), so
        that step too has the factor of an optimizer step's global batch."""
        if self.source.accumulation_at_step():
            self._update_lr(fresh=self._steps == 0)

    def _update_lr(self, fresh: bool = False) -> None:
        """The multiplier for the script's next optimizer step: from the global
        batch planned (the DBS plan's, else the loader's batch × the trainers,
        each times the script's accumulation), never from one step's actual
        size (the job's short last batch). `fresh`: no step taken yet, so no
        ramp from the batch assumed before."""
        source: ScriptSource = self.source
        plan = self._plan
        if fresh:
            old = source.lr_control.ramp
            source.lr_control.ramp = ScaleRamp(old.reference_batch, old.ramp_steps, old.law, old.max_scale)
        if plan.plan is not None:
            batch = plan.plan.batch(self.peer_id)
            source.lr_control.update(plan.plan.total * source.accumulation, source.step_count,
                                     batch / plan.plan.mean)
        else:
            source.lr_control.update(source.step_batch * plan.trainers, source.step_count)

    async def _watch_first_step(self) -> None:
        wait_s = self.spec.first_step_warning_s
        await asyncio.sleep(wait_s)
        if self._steps == 0 and not self.closed:
            log.warning("no peer.step() in %g s since peerd.attach(): call it after every optimizer step, "
                        "or the job never averages", wait_s)
            self._engine.wait_for_first_step(True)  # shown only: what the worker does follows its stage

    def _install_signals(self) -> None:
        """SIGTERM/SIGINT: leave after the local step under way (a round that is not
        done skips its exchange), with a checkpoint; a second one, or one before
        training began, stops at once."""
        if threading.current_thread() is not threading.main_thread():
            return

        def handle(signum, frame) -> None:
            self._signals += 1
            if self._signals > 1 or self._engine.stage != Stage.TRAINING:
                raise KeyboardInterrupt
            self._engine.stop_signal = True

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, handle)

    def _abort(self) -> None:
        """Stop the engine and its thread, whatever state they are in."""
        self.closed = True
        watch = getattr(self, "_watch", None)
        if watch is not None:
            watch.cancel()
        engine = getattr(self, "_engine", None)
        try:
            if engine is not None:
                self._loop.call(engine.end(trained_out=False), CLOSE_TIMEOUT_S)  # closes it, once
        except Exception as exc:  # noqa: BLE001 - closing after a failure: say so, go on
            log.warning("closing the engine: %s: %s", type(exc).__name__, exc)
        finally:
            self._loop.stop(CLOSE_TIMEOUT_S)
