"""The training side as the engine sees it: peerd's own Trainer, or a script's
ScriptSource (peerd.worker.train.scriptsource)."""

from __future__ import annotations

from typing import Protocol

import torch

from peerd.core.health import Health
from peerd.core.meter import StepMeter
from peerd.worker.train.lrcontrol import LrControl
from peerd.worker.state.trainstate import TrainState


class Source(Protocol):
    """Its counters and its state."""

    state: TrainState
    step_count: int
    samples: int
    progress: float  # epochs done, fractional
    epoch: int
    loss_ema: float
    speed_ema: float  # samples/s of compute, no network wait (DBS)
    meter: StepMeter  # the same speed, and the step's fixed and per-sample costs when timed apart (DBS)
    health: Health  # the collapse watch, fed each step's loss (peerd.core.health)
    local_batch: int
    share: float
    compute_s: float
    lr: float
    lr_control: LrControl  # the LR law in force and its factor now
    global_batch: int
    skipped_steps: int
    ended_elsewhere: bool  # the job's end reached another member first: done here at once (the engine sets it)

    def adopt_state(self, vector: torch.Tensor, extra: bytes, step: int, progress: float) -> None: ...
