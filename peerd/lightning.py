"""`peerd.lightning`: a PyTorch Lightning script trains under peerd with one
line (docs/operations.md, "Lightning"):

    trainer = lightning.Trainer(max_epochs=EPOCHS, callbacks=[peerd.lightning.Peerd()])

The LightningModule, its configure_optimizers, its data and the rest of the
Trainer stay as they are. A callback is enough: Lightning asks its strategy
for every loader it makes (Strategy.process_dataloader), so the callback puts
peerd's sampler under the training loader there; its hooks see the
optimizer, the schedulers, each batch's loss and every optimizer step. So:

- setup: the Trainer's settings checked against the job (peerd.worker.train.
  lightningjob), before anything is joined; the training loader made over
  peerd's sampler (EpochBatches) from then on;
- on_fit_start: peerd.attach(module, optimizer, scaler, state={LR schedulers})
  returns once this peer holds the job's state; a loader the Trainer made
  before (estimated_stepping_batches) is made again;
- on_train_start, on_train_epoch_start: the job's position as current_epoch
  and global_step, each schedule moved to it;
- on_train_batch_end: after each optimizer step, peer.step() with the step's
  samples and loss, then the job's position again;
- on_validation_end: what the module logged is the job's metrics
  (peer.report); peerd's own evaluations (its `evaluate`) run
  Trainer.validate on a Trainer of their own;
- on_train_end: the job's final consensus (peer.close()), while the model is
  still on its device: the module then holds the job's model, as model.pt.

The daemon never imports this module.
"""

from __future__ import annotations

try:
    import lightning.pytorch as pl
except ImportError as exc:
    raise ImportError("peerd.lightning needs PyTorch Lightning (lightning>=2.4,<3): "
                      "pip install peerd[lightning]") from exc

import contextlib
import logging
import math
import signal
import threading

import torch
from lightning.pytorch.callbacks import GradientAccumulationScheduler, Timer
from lightning.pytorch.strategies import SingleDeviceStrategy
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch.utils.data import DataLoader, IterableDataset

from peerd.control.launch import Launch, current_launch
from peerd.errors import ConfigError
from peerd.peer import Peer, attach
from peerd.worker.train.device import resolve_device
from peerd.worker.train.lightningjob import (EpochBatches, Optimization, Schedule, StepScale, TrainerSetup, check,
                                             optimization_refusals, refusals, scheduler_target)

__all__ = ["Peerd"]

log = logging.getLogger("peerd.worker")

# The training DataLoader's options a loader over peerd's sampler keeps.
_LOADER_OPTIONS = ("num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn", "multiprocessing_context",
                   "generator", "prefetch_factor", "persistent_workers", "pin_memory_device", "in_order")


class Peerd(pl.Callback):
    """Trains the Trainer's module as this worker's part of its peerd job
    (the module's docstring says what changes)."""

    def __init__(self) -> None:
        self.peer: Peer | None = None
        self.data: _TrainData | None = None
        self.schedules: list[tuple[Schedule, object]] = []
        self._handlers: dict[int, object] = {}  # peerd's signal handlers, put back over Lightning's
        self._step_loss = 0.0
        self._step_batches = 0
        self._before = 0  # global_step at the batch's start

    # -- before the job is joined ---------------------------------------------------------

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        launch = _launch()
        if self.data is not None:
            raise ConfigError("peerd.lightning: a Peerd callback trains one job once; fit() was called again")
        check(refusals(_setup_of(trainer), launch.spec.epochs, launch.spec.global_batch))
        mine, theirs = _device_name(resolve_device(launch.device)), _device_name(trainer.strategy.root_device)
        if mine != theirs:  # it trains all the same; the operator gave this worker another device
            log.warning("peerd.lightning: the Trainer trains on %s; this worker's device is %s ([worker] device)",
                        theirs, mine)
        self.data = _TrainData(trainer, launch.spec.epochs)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit" and self.data is not None:
            self.data.close()

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Join the job: attach returns once this peer holds the job's state (a
        newcomer's: the running peers' model, optimizer, schedulers and scaler)."""
        self.schedules = [(_schedule_of(k, c), c.scheduler) for k, c in enumerate(trainer.lr_scheduler_configs)]
        check(optimization_refusals(Optimization(pl_module.automatic_optimization, len(trainer.optimizers),
                                                 tuple(s for s, _ in self.schedules))))
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        state = {s.name: scheduler for s, scheduler in self.schedules}
        evaluate = _Validation(trainer, pl_module) if _validates(trainer, pl_module) else None
        peer = self.peer = attach(pl_module, trainer.optimizers[0], scaler=scaler, state=state, evaluate=evaluate)
        if threading.current_thread() is threading.main_thread():
            self._handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
        self.data.bind(lambda dataset, step_batch: peer.loader(dataset, batch_size=step_batch).batch_sampler,
                       lambda: peer.should_stop)

    # -- training -------------------------------------------------------------------------

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """The job's position in the Trainer's counters (the loader was read
        from the job's position meanwhile); peerd's signal handling back."""
        for sig, handler in self._handlers.items():  # the Trainer put its own over them
            signal.signal(sig, handler)
        self.data.start(self.peer.progress)
        _follow_schedules(trainer, self.schedules, self.data.scale)
        if self.peer.should_stop:
            trainer.should_stop = True

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        _follow_schedules(trainer, self.schedules, self.data.scale)  # an epoch with no step here moved none

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        self.data.taken(batch_idx)
        self._before = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        """After an optimizer step: peerd's round when due, then the job's
        position as global_step and in the schedules."""
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor):
            # Lightning divides each batch's loss by accumulate_grad_batches for backward.
            self._step_loss += float(loss.detach()) * trainer.accumulate_grad_batches
            self._step_batches += 1
        if trainer.global_step == self._before:
            return
        peer = self.peer
        mean = self._step_loss / self._step_batches if self._step_batches else None
        self._step_loss, self._step_batches = 0.0, 0
        peer.step(batch_size=self.data.stepped(), loss=mean)
        self.data.at(peer.progress)
        _follow_schedules(trainer, self.schedules, self.data.scale)
        if peer.should_stop:
            trainer.should_stop = True

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Lightning's validation of this peer's model: the job's metrics in peerctl status."""
        if trainer.sanity_checking or self.peer is None or self.peer.closed:
            return
        metrics = _numbers(trainer.callback_metrics)
        if metrics:
            self.peer.report(metrics)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """The job is trained here (its final consensus: model.pt), or this peer
        left; before the Trainer's teardown moves the model off its device."""
        peer = self.peer
        if peer is None or peer.closed:
            return
        if not peer.done and not peer.should_stop:
            log.warning("peerd.lightning: the Trainer stopped at epoch %d, before the job's end (epoch %g): "
                        "this peer leaves the job without its final consensus", trainer.current_epoch,
                        peer.spec.epochs)
        outcome = peer.close(finished=peer.done)
        log.info("peerd.lightning: %s at epoch %d, global_step %d", outcome, trainer.current_epoch,
                 trainer.global_step)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if self.peer is not None and not self.peer.closed:
            self.peer.close(finished=False)


class _TrainData:
    """The Trainer's training loader over peerd's sampler, and the job's
    position in the Trainer's counters. Lightning asks its strategy for what
    to make of every loader (Strategy.process_dataloader): the training one
    becomes a DataLoader over EpochBatches, with its dataset and options."""

    def __init__(self, trainer: pl.Trainer, epochs: float) -> None:
        self.trainer, self.epochs = trainer, epochs
        self.batches: EpochBatches | None = None  # the training loader's, once bound
        self.scale: StepScale | None = None
        self._sampler = self._stop = None
        self._made = trainer.strategy.process_dataloader
        trainer.strategy.process_dataloader = self._process

    def close(self) -> None:
        if "process_dataloader" in vars(self.trainer.strategy):
            del self.trainer.strategy.process_dataloader

    def bind(self, sampler, stop) -> None:
        """From now on the training loader reads `sampler(dataset, step_batch)`
        (peer.loader's batch sampler: this peer's steps from the job's
        position); `stop()`: this peer stops. A loader the Trainer made
        before (estimated_stepping_batches in configure_optimizers) is made
        again, as Lightning's own tuner does."""
        self._sampler, self._stop = sampler, stop
        fit_loop = self.trainer.fit_loop
        if fit_loop._combined_loader is not None:
            if fit_loop._data_fetcher is not None:
                fit_loop._data_fetcher.teardown()
            fit_loop._combined_loader = None

    def _process(self, dataloader):
        dataloader = self._made(dataloader)
        return self._train_loader(dataloader) if self.trainer.training else dataloader

    def _train_loader(self, dataloader: object) -> DataLoader:
        if not isinstance(dataloader, DataLoader) or isinstance(dataloader.dataset, IterableDataset):
            raise ConfigError("peerd.lightning: peerd splits a training DataLoader over a map-style dataset "
                              f"(one it can index) among the peers; got {type(dataloader).__name__}")
        if dataloader.batch_size is None:
            raise ConfigError("peerd.lightning: peerd's sampler decides the batches; give the training DataLoader "
                              "a batch_size instead of a batch_sampler")
        dataset = dataloader.dataset
        batches = EpochBatches(len(dataset), dataloader.batch_size, self.trainer.accumulate_grad_batches)
        if self._sampler is not None:
            batches.bind(self._sampler(dataset, batches.step_batch), self._stop)
            self.batches = batches
            self.scale = StepScale(self.epochs, len(dataset), batches.step_batch)
        options = {k: getattr(dataloader, k) for k in _LOADER_OPTIONS if hasattr(dataloader, k)}
        if not options.get("num_workers"):
            options.pop("prefetch_factor", None)
            options.pop("persistent_workers", None)
        elif options.get("multiprocessing_context") is None:
            # The worker process serves gRPC: its loader's workers start by forkserver, never fork
            # (peerd.worker.train.data).
            options["multiprocessing_context"] = "forkserver"
        return DataLoader(dataset, batch_sampler=batches, **options)

    def start(self, progress: float) -> None:
        """Training starts where this peer's first batch (read ahead by now)
        starts, at or after the state's position `progress`: current_epoch is
        the job's epoch there, global_step one process's steps to there."""
        if self.batches is not None and self.batches.origin is not None:
            progress = self.batches.origin
        epoch = min(int(progress), int(self.epochs))
        for tracker in (self.trainer.fit_loop.epoch_progress.current, self.trainer.fit_loop.epoch_progress.total):
            tracker.ready = tracker.started = tracker.processed = tracker.completed = epoch
        _set_global_step(self.trainer, self.scale.position_steps(progress) if self.scale is not None else 0)

    def taken(self, batch_idx: int) -> None:
        """The Trainer takes this epoch's batch `batch_idx`."""
        if self.batches is not None:
            self.batches.trained = batch_idx + 1

    def stepped(self) -> int | None:
        """An optimizer step is done: its samples (peerd's step)."""
        return self.batches.step_sizes.popleft() if self.batches is not None and self.batches.step_sizes else None

    def at(self, progress: float) -> None:
        """After a step: global_step is the job's position (never behind the Trainer's own count)."""
        if self.scale is not None:
            _set_global_step(self.trainer, max(self.trainer.global_step, self.scale.position_steps(progress)))


def _set_global_step(trainer: pl.Trainer, steps: int) -> None:
    progress = trainer.fit_loop.epoch_loop.automatic_optimization.optim_progress.optimizer.step.total
    progress.ready = progress.completed = steps


def _follow_schedules(trainer: pl.Trainer, schedules: list[tuple[Schedule, object]], scale: StepScale | None) -> None:
    """Each schedule at the job's position: an "epoch" one at current_epoch,
    a "step" one at global_step (Lightning stepped it once for this peer's
    step; the steps of the others are added here), never past the job's
    steps nor a OneCycleLR's own."""
    limit = scale.total if scale is not None else None
    for schedule, scheduler in schedules:
        own = getattr(scheduler, "total_steps", None)
        end = limit if own is None else own if limit is None else min(limit, own)
        target = scheduler_target(schedule, trainer.current_epoch, trainer.global_step, end)
        while target is not None and scheduler.last_epoch < target:
            scheduler.step()


class _Validation:
    """peerd's evaluation of the module (every [job] eval_every_rounds rounds,
    and of the own and the consensus model at the end): Lightning's
    validation, by Trainer.validate on a Trainer of its own (no loggers, no
    callbacks), so the fitting Trainer's loops and callbacks never see it. Run
    in peerd's thread while the training thread waits."""

    def __init__(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        self.trainer, self.module = trainer, module

    def __call__(self) -> dict[str, float]:
        outer = self.trainer
        with _quiet():
            device = outer.strategy.root_device
            inner = pl.Trainer(accelerator=device.type, strategy=_InPlace(device), precision=outer.precision,
                               logger=False, enable_checkpointing=False, enable_progress_bar=False,
                               enable_model_summary=False, inference_mode=False,
                               limit_val_batches=outer.limit_val_batches, default_root_dir=outer.default_root_dir)
            try:
                if outer.val_dataloaders is not None:
                    results = inner.validate(self.module, dataloaders=outer.val_dataloaders, verbose=False)
                else:
                    results = inner.validate(self.module, datamodule=outer.datamodule, verbose=False)
            finally:
                self.module.trainer = outer  # the module is the fitting Trainer's again
        return {k: v for result in results for k, v in _numbers(result).items()}


class _InPlace(SingleDeviceStrategy):
    """The evaluating Trainer's strategy: it leaves the module where it is. A
    strategy's teardown moves the module to the CPU; its parameters are views
    of peerd's vector on the device (docs/algorithms.md, "Segments")."""

    def teardown(self) -> None:
        self.precision_plugin.teardown()
        self.accelerator.teardown()
        self.checkpoint_io.teardown()


@contextlib.contextmanager
def _quiet():
    """Without the lines each new Trainer logs (the devices it found)."""
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


def _launch() -> Launch:
    launch = current_launch()
    if launch is None:
        raise ConfigError("peerd.lightning.Peerd: this script was not started by peerd; run it as a script job "
                          "(a job file with [job] script = \"...\", then peerctl join JOB.toml)")
    return launch


def _setup_of(trainer: pl.Trainer) -> TrainerSetup:
    """The Trainer's settings peerd checks (peerd.worker.train.lightningjob.refusals)."""
    callbacks = trainer.callbacks
    stoppers = [name for name, kind in (("EarlyStopping", pl.callbacks.EarlyStopping), ("max_time", Timer))
                if any(isinstance(cb, kind) for cb in callbacks)]
    interval = trainer.val_check_interval
    return TrainerSetup(
        max_epochs=trainer.max_epochs if trainer.max_epochs is not None else -1,
        max_steps=trainer.max_steps,
        single_device=isinstance(trainer.strategy, SingleDeviceStrategy) and trainer.num_nodes == 1,
        val_every_epoch=isinstance(interval, float) and interval == 1.0,  # an int counts batches
        whole_data=trainer.limit_train_batches == 1.0 and not trainer.overfit_batches and not trainer.fast_dev_run,
        reload_every=int(trainer.reload_dataloaders_every_n_epochs or 0),
        stoppers=tuple(stoppers),
        accumulation_scheduled=any(isinstance(cb, GradientAccumulationScheduler) for cb in callbacks),
        resumed=bool(trainer.ckpt_path),
    )


def _schedule_of(k: int, config) -> Schedule:
    scheduler = config.scheduler
    return Schedule(f"lr_scheduler_{k}", config.interval, int(config.frequency), bool(config.reduce_on_plateau),
                    isinstance(scheduler, torch.optim.lr_scheduler.LRScheduler))


def _validates(trainer: pl.Trainer, module: pl.LightningModule) -> bool:
    return is_overridden("validation_step", module) and trainer.limit_val_batches != 0


def _device_name(device: torch.device) -> str:
    """A device as the Trainer names its root device: with its index."""
    if device.type == "cpu":
        return "cpu"
    index = device.index
    if index is None:
        index = torch.cuda.current_device() if device.type == "cuda" else 0
    return f"{device.type}:{index}"


def _numbers(metrics) -> dict[str, float]:
    """The scalars of what the module logged (callback_metrics, validate()'s results)."""
    out = {}
    for key, value in dict(metrics).items():
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[str(key)] = float(value)
    return out
