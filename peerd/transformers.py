"""`peerd.transformers`: a Hugging Face `transformers.Trainer` script trains
under peerd with one changed line (docs/operations.md, "Hugging Face Trainer"):

    from peerd.transformers import Trainer      # instead of: from transformers import Trainer

The model, TrainingArguments, datasets, collator and callbacks stay as they
are. It is a subclass, not a TrainerCallback: a callback is given the model,
the optimizer and a dataloader the Trainer has already built and sized its
schedule from, never the Trainer, so it cannot put peerd's sampler under it;
nor is it given a step's loss. The subclass changes those two and leaves the
rest to its own callback, put first in the Trainer's list so that the job's
position is in the TrainerState before any other callback reads it:

- get_train_dataloader: the Trainer's own loader's dataset and collator, over
  peerd's sampler (peerd.worker.train.trainerjob.JobBatches); the job's
  length checked against the Trainer's;
- on_train_begin: peerd.attach(model, optimizer, state={LR scheduler,
  TrainerState}), trainer.evaluate() as the job's evaluation;
- training_step: the step's loss and samples; on_step_end: peer.step(), the
  job's position as global_step and epoch, the LR schedule moved to it;
- train(): once trained, the job's final consensus (peer.close()), saved with
  save_pretrained beside model.pt.

The daemon never imports this module. Inside it `transformers` is the real
package: the imports are absolute.
"""

from __future__ import annotations

try:
    import accelerate  # noqa: F401 - the Trainer's own dependency, named here rather than at train()
    import transformers
except ImportError as exc:
    raise ImportError("peerd.transformers needs Hugging Face transformers and accelerate: "
                      "pip install peerd[transformers]") from exc

import logging
import math
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau
from torch.utils.data import DataLoader, IterableDataset

from peerd.control.launch import Launch, current_launch
from peerd.core.lifecycle import Outcome
from peerd.errors import ConfigError
from peerd.peer import Peer, attach
from peerd.worker.train.device import resolve_device
from peerd.worker.train.trainerjob import (JobBatches, TrainerStateOf, check_length, due, job_step, model_metrics,
                                           rows)

__all__ = ["Trainer"]

log = logging.getLogger("peerd.worker")


class Trainer(transformers.Trainer):
    """`transformers.Trainer`, training the peerd job its script was started
    for (the module's docstring says what changes)."""

    def __init__(self, *args, **kwargs) -> None:
        _use_the_workers_gpu()
        super().__init__(*args, **kwargs)
        self.peerd = _Job(self)
        self.callback_handler.callbacks.insert(0, _Events(self.peerd))

    def train(self, resume_from_checkpoint=None, trial=None, ignore_keys_for_eval=None, **kwargs):
        self.peerd.check(resume_from_checkpoint, trial)
        output = super().train(resume_from_checkpoint, trial, ignore_keys_for_eval, **kwargs)
        self.peerd.finish()
        return output._replace(training_loss=self.peerd.losses.mean(output.training_loss))

    def get_train_dataloader(self) -> DataLoader:
        return self.peerd.loader(super().get_train_dataloader())

    def training_step(self, model, inputs, *args, **kwargs) -> torch.Tensor:
        samples = rows(inputs)
        loss = super().training_step(model, inputs, *args, **kwargs)
        self.peerd.micro(loss, samples)
        return loss

    def log(self, logs: dict[str, float], *args, **kwargs) -> None:
        self.peerd.losses.into(logs)
        super().log(logs, *args, **kwargs)


class _Events(transformers.TrainerCallback):
    """The Trainer's events that reach its peerd job."""

    def __init__(self, job: _Job) -> None:
        self.job = job

    def on_train_begin(self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kwargs):
        self.job.begin(model, optimizer, lr_scheduler)

    def on_step_end(self, args, state, control, **kwargs):
        self.job.step(args, state, control)

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self.job.report(metrics or {})


class _Losses:
    """This peer's training loss per optimizer step, for the Trainer's logs: the
    Trainer divides its loss sum by the global_step's move, which is the job's
    (several per step with several peers), not this peer's steps."""

    def __init__(self) -> None:
        self.total = self.since = 0.0
        self.steps = self.since_steps = 0

    def add(self, loss: float | None) -> None:
        if loss is not None and math.isfinite(loss):  # as the Trainer's logging_nan_inf_filter
            self.total, self.steps = self.total + loss, self.steps + 1
            self.since, self.since_steps = self.since + loss, self.since_steps + 1

    def into(self, logs: dict[str, float]) -> None:
        if "loss" in logs and self.since_steps:
            logs["loss"] = self.since / self.since_steps
            self.since, self.since_steps = 0.0, 0
        if "train_loss" in logs and self.steps:
            logs["train_loss"] = self.total / self.steps

    def mean(self, default: float) -> float:
        return self.total / self.steps if self.steps else default


class _Job:
    """A Trainer's side of its peerd job."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.peer: Peer | None = None
        self.batches: JobBatches | None = None
        self.dataset = self.collate = None
        self.losses = _Losses()
        self.step_loss: torch.Tensor | None = None  # the micro-batches' losses of the step under way
        self.step_samples = 0
        self.at = 0  # the global_step set last
        self.evaluating = False  # peerd's evaluation under way (not one of the Trainer's own)

    def check(self, resume_from_checkpoint, trial) -> None:
        """What the job cannot take, refused before anything is joined."""
        launch = _launch()
        args = self.trainer.args
        refused = [
            (self.peer is not None, "train() trains the job once; it was called again"),
            (bool(resume_from_checkpoint), "peerd resumes a job itself (from the running peers or this "
                                           "worker's checkpoint); drop resume_from_checkpoint"),
            (trial is not None, "a hyperparameter search runs many trainings; a job is one"),
            (args.auto_find_batch_size, "every peer trains at per_device_train_batch_size; drop "
                                        "auto_find_batch_size"),
            (args.world_size > 1, "a peer is one process; run the script as a peerd job, not under "
                                  "torchrun or accelerate launch"),
            (launch.spec.global_batch > 0, "the Trainer's batch is per_device_train_batch_size; set "
                                           "[job] global_batch = 0 (no dynamic batch sizes)"),
        ]
        for bad, why in refused:
            if bad:
                raise ConfigError(f"peerd.transformers: {why}")

    def loader(self, base: DataLoader) -> DataLoader:
        """The Trainer's training loader over peerd's sampler: its dataset
        (columns removed as the Trainer does) and collator, its loader options."""
        spec, args = _launch().spec, self.trainer.args
        dataset = base.dataset
        if isinstance(dataset, IterableDataset):
            raise ConfigError("peerd.transformers: peerd splits a dataset it can index (a map-style one with "
                              "a length) among the peers; an IterableDataset cannot be split")
        accumulation = args.gradient_accumulation_steps
        check_length(spec.epochs, args.num_train_epochs, args.max_steps, len(dataset),
                     args.train_batch_size * accumulation)
        self.batches = JobBatches(len(dataset), args.train_batch_size, accumulation, by_epoch=args.max_steps <= 0)
        self.dataset, self.collate = dataset, base.collate_fn
        workers = base.num_workers
        # The worker process serves gRPC: its DataLoader workers start by forkserver, never fork (peerd.worker.train.data).
        context = base.multiprocessing_context or ("forkserver" if workers else None)
        return DataLoader(dataset, batch_sampler=self.batches, collate_fn=base.collate_fn, num_workers=workers,
                          pin_memory=base.pin_memory, worker_init_fn=base.worker_init_fn,
                          persistent_workers=base.persistent_workers, prefetch_factor=base.prefetch_factor,
                          multiprocessing_context=context)

    def begin(self, model, optimizer, scheduler) -> None:
        """Join the job: peerd.attach returns once this peer holds the job's
        state (a newcomer's: the running peers' model, optimizer, scheduler
        and TrainerState); then peerd's sampler from the job's position."""
        trainer = self.trainer
        evaluate = self.evaluate if trainer.eval_dataset is not None else None
        self.peer = attach(model, torch_optimizer(optimizer), state=registered(trainer, scheduler), evaluate=evaluate)
        self.at = trainer.state.global_step
        peerd_loader = self.peer.loader(self.dataset, batch_size=self.batches.step_batch, collate_fn=self.collate)
        self.batches.start(peerd_loader.batch_sampler)
        log.info("peerd.transformers: the Trainer trains from step %d of %d: optimizer steps of %d × %d samples "
                 "from peerd's sampler; its global_step, epoch and LR schedule follow the job's position; "
                 "peerd averages the model", self.at, trainer.state.max_steps, self.batches.batch,
                 self.batches.accumulation)

    def micro(self, loss: torch.Tensor, samples: int | None) -> None:
        """A micro-batch trained: the Trainer's loss (already divided for accumulation) and its samples."""
        loss = loss.detach()
        self.step_loss = loss if self.step_loss is None else self.step_loss + loss
        self.step_samples += samples or 0

    def step(self, args, state, control) -> None:
        """An optimizer step done: peerd's round when due, then the job's
        position as the Trainer's global_step and epoch, the intervals it
        passed, and the LR schedule at it."""
        peer = self.peer
        loss = float(self.step_loss) if self.step_loss is not None else None
        peer.step(batch_size=self.step_samples or None, loss=loss)
        self.step_loss, self.step_samples = None, 0
        self.losses.add(loss)
        epochs = peer.spec.epochs
        last, self.at = self.at, job_step(peer.progress, epochs, state.max_steps, self.at, peer.done)
        state.global_step = self.at
        state.epoch = float(epochs) if peer.done else min(peer.progress, epochs)
        for name in due(last, self.at, _intervals(args, state, self.at)):
            setattr(control, f"should_{name}", True)
        scheduler = self.trainer.lr_scheduler
        if isinstance(scheduler, LRScheduler) and not isinstance(scheduler, ReduceLROnPlateau):
            while scheduler.last_epoch < self.at:  # the steps the other peers took meanwhile
                scheduler.step()
        if peer.should_stop:
            control.should_training_stop = True

    def evaluate(self) -> dict[str, float]:
        """peerd's evaluation of the model (every eval_every_rounds rounds, and
        of the own and the consensus model at the end): trainer.evaluate()."""
        self.evaluating = True
        try:
            return model_metrics(self.trainer.evaluate())
        finally:
            self.evaluating = False

    def report(self, metrics: dict) -> None:
        """One of the Trainer's own evaluations (eval_strategy): shown as the job's."""
        if not self.evaluating and self.peer is not None and not self.peer.closed:
            self.peer.report(model_metrics(metrics))

    def finish(self) -> None:
        """Trained out here: peer.close() takes the final consensus and writes
        model.pt (or leaves, when drained), then the model, now the consensus,
        goes beside it with save_pretrained; the same files on every peer."""
        if self.peer is None:
            return
        out = Path(self.peer.launch.out_dir)
        before = _stamp(out / "model.pt")
        outcome = self.peer.close()
        written = _stamp(out / "model.pt")
        if outcome != Outcome.FINISHED or written is None or written == before:
            log.info("peerd.transformers: %s without a model of the job's end; nothing saved with save_pretrained",
                     outcome)
            return
        model = self.trainer.model
        if not callable(getattr(model, "save_pretrained", None)):
            log.info("peerd.transformers: %s has no save_pretrained; the model is in model.pt",
                     type(model).__name__)
            return
        with _no_progress_bars():
            model.save_pretrained(out)
            processor = getattr(self.trainer, "processing_class", None)
            if callable(getattr(processor, "save_pretrained", None)):
                processor.save_pretrained(out)
        log.info("peerd.transformers: the job's model saved with save_pretrained to %s", out)


def torch_optimizer(optimizer):
    """The torch optimizer inside accelerate's wrapper: peerd's LR factor hooks its step."""
    return getattr(optimizer, "optimizer", optimizer)


def registered(trainer: transformers.Trainer, scheduler) -> dict[str, object]:
    """What a newcomer and a checkpoint take besides the model and optimizer:
    the TrainerState's position and the LR scheduler."""
    state: dict[str, object] = {"trainer_state": TrainerStateOf(trainer)}
    if callable(getattr(scheduler, "state_dict", None)) and callable(getattr(scheduler, "load_state_dict", None)):
        state["lr_scheduler"] = scheduler
    return state


def _intervals(args, state, now: int) -> dict[str, int]:
    """The Trainer's step intervals in force (0: off), as DefaultFlowCallback reads them."""
    return {"log": int(state.logging_steps or 0) if args.logging_strategy == "steps" else 0,
            "evaluate": int(state.eval_steps or 0) if args.eval_strategy == "steps" and args.eval_delay <= now else 0,
            "save": int(state.save_steps or 0) if args.save_strategy == "steps" else 0}


def _use_the_workers_gpu() -> None:
    """A worker given a GPU ([worker] devices) trains on it: the device of a
    one-process Trainer is "cuda", accelerate's name for the current CUDA device."""
    launch = current_launch()
    device = resolve_device(launch.device) if launch is not None else None
    if device is not None and device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)


def _launch() -> Launch:
    launch = current_launch()
    if launch is None:
        raise ConfigError("peerd.transformers.Trainer: this script was not started by peerd; run it as a script "
                          "job (a job file with [job] script = \"...\", then peerctl join JOB.toml)")
    return launch


@contextmanager
def _no_progress_bars():
    """save_pretrained draws a bar of its shards; in the worker's log, a file,
    it is only noise. The library's own switch, put back as it was."""
    bars = transformers.utils.logging
    was_on = bars.is_progress_bar_enabled()
    bars.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            bars.enable_progress_bar()


def _stamp(path: Path) -> tuple[int, int] | None:
    """Which file is at `path` (a new one replaces it atomically): None when none."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns
