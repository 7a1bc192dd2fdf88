"""What a worker reports of its steps: the training loss and its speed, smoothed,
and, when the worker times its step's fixed part apart, the step's affine cost.

One meter for peerd's own loop and a script's (peerd.peer), so both report alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DECAY = 0.9
MIN_PER_SAMPLE_S = 1e-9  # the batch-dependent part is never taken as free


@dataclass
class StepMeter:
    loss: float = math.nan  # EMA of the finite step losses
    speed: float = math.nan  # samples/s of compute, no network wait
    fixed_s: float = math.nan  # seconds of a step that do not depend on its batch (DBS); NaN: not timed
    per_sample_s: float = math.nan  # seconds per sample of the rest of the step; NaN: not timed
    _samples: float = 0.0
    _seconds: float = 0.0
    _steps: float = 0.0  # EMA of 1: undoes the EMAs' start from 0
    _fixed: float = 0.0  # EMA of the fixed seconds, over the steps that timed them
    _fixed_steps: float = 0.0

    def observe(self, samples: int, seconds: float, loss: float = math.nan, fixed_s: float = math.nan) -> None:
        """One step. The speed is a ratio of two EMAs (samples, seconds), not an EMA
        of per-step ratios: a step that happened to be slow weighs by its time, so
        noise moves it less. `fixed_s`: the part of `seconds` no batch changes
        (optimizer update and the like), when the caller timed it (NaN: not this step)."""
        if math.isfinite(loss):
            self.loss = loss if math.isnan(self.loss) else DECAY * self.loss + (1 - DECAY) * loss
        seconds = max(seconds, 1e-9)
        self._samples = DECAY * self._samples + (1 - DECAY) * samples
        self._seconds = DECAY * self._seconds + (1 - DECAY) * seconds
        self._steps = DECAY * self._steps + (1 - DECAY)
        self.speed = self._samples / self._seconds
        if math.isfinite(fixed_s) and fixed_s >= 0:
            self._fixed = DECAY * self._fixed + (1 - DECAY) * min(fixed_s, seconds)
            self._fixed_steps = DECAY * self._fixed_steps + (1 - DECAY)
        if self._fixed_steps > 0:
            self._affine()

    def _affine(self) -> None:
        """a = mean fixed seconds; c = (mean step seconds − a) / mean samples. Both
        from means over the same recent steps, so a + c·b̄ is the measured mean
        step: the model agrees with `speed` at the batch the worker runs, and
        the split only says how much of that time a smaller batch would save."""
        self.fixed_s = self._fixed / self._fixed_steps
        step_s, samples = self._seconds / self._steps, self._samples / self._steps
        self.fixed_s = min(self.fixed_s, step_s)
        self.per_sample_s = max(step_s - self.fixed_s, MIN_PER_SAMPLE_S * samples) / max(samples, 1e-9)
