"""A script's training as the engine sees it (`ScriptSource`): the step,
sample and position counters that peer.step() and peer.loader() keep for a
script under `peerd.attach`; peerd's own loop has its Trainer instead."""

from __future__ import annotations

import math

import torch

from peerd.core.meter import StepMeter
from peerd.jobspec import JobSpec
from peerd.worker.data import DataCursor, PeerSampler
from peerd.worker.lrcontrol import LrControl
from peerd.worker.trainstate import TrainState


class ScriptSource:
    """A script's training as the engine sees it: counted by peer.step()."""

    def __init__(self, state: TrainState, spec: JobSpec, peer_id: str, lr: LrControl) -> None:
        self.state = state
        self.spec = spec
        self.peer_id = peer_id
        self.lr_control = lr
        self.cursor: DataCursor | None = None
        self.sampler: PeerSampler | None = None
        self.steps_per_epoch = 0.0  # a single process's steps per epoch at the script's batch size
        self._seek: float | None = None  # a donor's position, for the loader made later
        self.step_count = self.samples = self.skipped_steps = 0
        self.progress = 0.0
        self.share = self.lr = math.nan
        self.meter = StepMeter()
        self.local_batch = spec.local_batch
        self.compute_s = 0.0

    @property
    def epoch(self) -> int:
        return int(self.progress)

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
        self.step_count, self.progress, self._seek = step, progress, progress
        if self.cursor is not None:
            self.cursor.seek(progress)

    def new_cursor(self, samples: int) -> DataCursor:
        self.cursor = DataCursor(self.spec, self.peer_id, samples)
        if self._seek is not None:
            self.cursor.seek(self._seek)
        return self.cursor

    def record(self, batch_size: int | None, loss: float | None, seconds: float) -> None:
        """One step of the script: its samples (from the loader's record when not
        given), loss and compute time."""
        taken = 0
        while self.sampler is not None and self.sampler.handed and (batch_size is None or taken < batch_size):
            micro = self.sampler.handed.popleft()
            taken += len(micro.indices)
            self.progress, self.share = micro.progress, micro.share
            if micro.last and batch_size is None:
                break
        size = batch_size if batch_size is not None else taken
        self.step_count += 1
        self.samples += size
        self.local_batch = size
        self.compute_s += seconds
        self.lr = self.lr_control.lr
        self.meter.observe(size, seconds, math.nan if loss is None else loss)
