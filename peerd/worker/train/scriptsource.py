"""A script's training as the engine sees it (`ScriptSource`): the step,
sample and position counters that peer.step() and peer.loader() keep for a
script under `peerd.attach`; peerd's own loop has its Trainer instead. Also
`total_steps`, the length a script's per-batch schedule must have."""

from __future__ import annotations

import math

import torch

from peerd.core.health import Health
from peerd.core.meter import StepMeter
from peerd.settings.jobspec import JobSpec
from peerd.worker.train.data import DataCursor, PeerSampler
from peerd.worker.train.lrcontrol import LrControl
from peerd.worker.train.scriptschedule import ScriptScheduler
from peerd.worker.state.trainstate import TrainState


def total_steps(epochs: float, samples: int, batch: int) -> int:
    """The steps a per-batch scheduler must allow for a job of `epochs` over
    `samples` samples at the script's `batch`: one process's steps, the job's
    short last batch counted as one (batches run on across epoch ends), so
    ceil(epochs × samples / batch), one more than epochs × samples // batch when
    the batch does not divide the job's samples. Nothing reaches further: not
    peer.step()'s catching-up (int(progress × samples / batch), at most this at
    the job's end) and not a peer's own scheduler.step() calls, one per local
    step: as many as this alone, fewer with more peers."""
    if samples <= 0 or batch <= 0 or epochs <= 0:
        raise ValueError(f"total_steps needs epochs, samples and batch > 0, got {epochs}, {samples}, {batch}")
    return math.ceil(math.ceil(round(epochs * samples, 6)) / batch)


class ScriptSource:
    """A script's training as the engine sees it: counted by peer.step()."""

    def __init__(self, state: TrainState, spec: JobSpec, peer_id: str, lr: LrControl) -> None:
        self.state = state
        self.spec = spec
        self.peer_id = peer_id
        self.lr_control = lr
        self.schedule: ScriptScheduler | None = None  # the registered scheduler, in its unit
        self.cursor: DataCursor | None = None
        self.sampler: PeerSampler | None = None
        self.steps_per_epoch = 0.0  # a single process's steps per epoch at the script's batch size
        self.samples_per_epoch = 0  # the loader's data set
        self.total_steps = 0  # total_steps() of the loader's data set and batch: the schedule's end
        # The batch the script's loader plans each step for: the LR law's (a short
        # step, the job's last, does not change the global batch).
        self.planned_batch = spec.local_batch
        self.step_count = self.samples = self.skipped_steps = 0
        self.progress = 0.0
        self.share = self.lr = math.nan
        self.meter = StepMeter()
        self.health = Health(spec.metric, spec.metric_mode == "max", spec.chance)  # the collapse watch
        self.local_batch = spec.local_batch  # of the last step
        self.compute_s = 0.0
        self._epoch: int | None = None  # the job epoch of the last step's batch

    @property
    def epoch(self) -> int:
        return int(self.progress)

    @property
    def batch_epoch(self) -> int:
        """The job's epoch (from 0) of the batch the script trains on now (the
        oldest one the loader handed out and peer.step() has not counted yet),
        else of the last step's; before any, of the position taken at attach.
        Never the job's end (`epochs`) itself: at the end, the last epoch."""
        if self.sampler is not None and self.sampler.handed:
            return self.sampler.handed[0].epoch
        if self._epoch is not None:
            return self._epoch
        return max(0, min(int(self.progress), math.ceil(self.spec.epochs) - 1))

    @property
    def global_batch(self) -> int:
        return self.lr_control.ramp.batch

    @property
    def loss_ema(self) -> float:
        return self.meter.loss

    @property
    def speed_ema(self) -> float:
        return self.meter.speed

    @property
    def done(self) -> bool:
        read = self.cursor is not None and self.cursor.done and not (self.sampler and self.sampler.handed)
        return self.progress >= self.spec.epochs or read

    def adopt_state(self, vector: torch.Tensor, extra: bytes, step: int, progress: float) -> None:
        self.state.adopt(vector, extra)
        self.step_count, self.progress = step, progress
        if self.cursor is not None:
            self.cursor.seek(progress)

    def new_cursor(self, samples: int) -> DataCursor:
        """The cursor of a new loader over `samples` samples: the one in use when
        it reads a data set of that size (a later loader goes on where the last
        stopped), else one at the job's position (the state adopted at attach, or
        how far the script's steps got), never at epoch 0 of a job under way."""
        if self.cursor is not None and self.cursor.bounds[-1] == samples:
            return self.cursor
        self.cursor = DataCursor(self.spec, self.peer_id, samples)
        if self.progress > 0:
            self.cursor.seek(self.progress)
        return self.cursor

    def record(self, batch_size: int | None, loss: float | None, seconds: float) -> None:
        """One step of the script: its samples (from the loader's record when not
        given), loss and compute time."""
        taken = consumed = 0
        while self.sampler is not None and self.sampler.handed and (batch_size is None or taken < batch_size):
            micro = self.sampler.handed.popleft()
            taken, consumed = taken + len(micro.indices), consumed + 1
            self.progress, self.share, self._epoch = micro.progress, micro.share, micro.epoch
            if micro.last and batch_size is None:
                break
        if batch_size is not None and consumed > 1 and taken == batch_size:
            # Accumulation: one optimizer step over several of the loader's batches.
            # The global batch (the LR law, DBS) counts the samples of an optimizer step.
            self.planned_batch = batch_size
        size = batch_size if batch_size is not None else taken
        self.step_count += 1
        self.samples += size
        self.local_batch = size
        self.compute_s += seconds
        self.lr = self.lr_control.lr
        self.meter.observe(size, seconds, math.nan if loss is None else loss)
        if loss is not None:  # a script that passes no loss has only the metric rule
            self.health.loss(loss, self.step_count)
