"""A script's training as the engine sees it (`ScriptSource`): the step,
sample and position counters that peer.step() and peer.loader() keep for a
script under `peerd.attach`; peerd's own loop has its Trainer instead. Also
`total_steps`, the length a script's per-batch schedule must have."""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader

from peerd.core.health import Health
from peerd.core.meter import StepMeter
from peerd.errors import ConfigError
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


def loss_value(loss) -> float | None:
    """peer.step(loss=...) as a float: a number, or a one-element tensor taken
    without its graph."""
    if loss is None:
        return None
    if isinstance(loss, torch.Tensor):
        if loss.numel() != 1:
            raise ConfigError(f"peer.step(loss=...): a number or a one-element tensor, got a tensor of shape "
                              f"{tuple(loss.shape)}")
        return float(loss.detach())
    try:
        return float(loss)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"peer.step(loss=...): a number or a one-element tensor, got {loss!r}") from exc


class ScriptLoader(DataLoader):
    """peer.loader()'s DataLoader: counts the batches the script takes from it
    (not those its workers read ahead), so that an optimizer step knows how many
    of them it accumulates (ScriptSource.accumulation_at_step)."""

    source: ScriptSource | None = None

    def __iter__(self) -> Iterator:
        for batch in super().__iter__():
            if self.source is not None:
                if self.source.ended_elsewhere:  # batches read ahead are not trained on past the job's end
                    return
                self.source.received += 1
            yield batch


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
        self.samples_per_epoch = 0  # the loader's data set
        # The batch the script's loader plans each of its batches for, and how
        # many of them one optimizer step takes (gradient accumulation): the
        # global batch (the LR law, DBS) counts their product, the samples of an
        # optimizer step; a short step, the job's last, changes neither.
        self.planned_batch = spec.local_batch
        self.accumulation = 1
        self.received = self.counted = 0  # the loader's batches the script took, and peer.step() counted
        self._accumulation_seen = False  # at this process's first optimizer step
        self.step_count = self.samples = self.skipped_steps = 0
        self.ended_elsewhere = False  # Source.ended_elsewhere
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
    def step_batch(self) -> int:
        """The samples of one optimizer step as the loader plans them."""
        return self.planned_batch * self.accumulation

    @property
    def steps_per_epoch(self) -> float:
        """A single process's optimizer steps per epoch of the loader's data set (0: no loader yet)."""
        return self.samples_per_epoch / self.step_batch

    @property
    def total_steps(self) -> int:
        """total_steps() of the loader's data set and a step's batch: a "step" schedule's end."""
        if not self.samples_per_epoch:
            return 0
        return total_steps(self.spec.epochs, self.samples_per_epoch, self.step_batch)

    @property
    def loss_ema(self) -> float:
        return self.meter.loss

    @property
    def speed_ema(self) -> float:
        return self.meter.speed

    @property
    def done(self) -> bool:
        # `is not None`: a sampler's len() is the batches still to come, 0 once the last is read ahead.
        read = self.cursor is not None and self.cursor.done and not (self.sampler is not None and self.sampler.handed)
        return self.progress >= self.spec.epochs or read or self.ended_elsewhere

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

    def accumulation_at_step(self) -> bool:
        """At an optimizer step (the LR's pre-step hook): the first one of this
        process shows how many of the loader's batches a step accumulates, those
        the script took since the last peer.step(). True when that changed the
        accumulation (the step's LR factor with it)."""
        pending = self.received - self.counted
        if self._accumulation_seen or pending < 1:
            return False
        self._accumulation_seen = True
        changed, self.accumulation = pending != self.accumulation, pending
        return changed

    def record(self, batch_size: int | None, loss: float | None, seconds: float) -> bool:
        """One step of the script: its samples (`batch_size`, else the loader's
        batches of one step: `accumulation` of them), loss and compute time.
        True when the step showed another accumulation than the one assumed
        (a first step that no optimizer hook saw: one the GradScaler skipped)."""
        taken = consumed = 0
        while self.sampler is not None and self.sampler.handed and (
                consumed < self.accumulation if batch_size is None else taken < batch_size):
            micro = self.sampler.handed.popleft()
            taken, consumed = taken + len(micro.indices), consumed + 1
            self.progress, self.share, self._epoch = micro.progress, micro.share, micro.epoch
        self.counted += consumed
        changed = False
        if batch_size is not None and consumed > 1 and taken == batch_size and not self._accumulation_seen:
            self._accumulation_seen = True
            changed, self.accumulation = consumed != self.accumulation, consumed
        size = batch_size if batch_size is not None else taken
        self.step_count += 1
        self.samples += size
        self.local_batch = size
        self.compute_s += seconds
        self.lr = self.lr_control.lr
        self.meter.observe(size, seconds, math.nan if loss is None else loss)
        if loss is not None:  # a script that passes no loss has only the metric rule
            self.health.loss(loss, self.step_count)
        return changed
