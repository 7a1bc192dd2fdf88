"""What a worker reports of its steps: the training loss and its speed, smoothed,
and, when the worker times its step's fixed part apart, the step's affine cost.

One meter for peerd's own loop and a script's (peerd.peer), so both report alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

DECAY = 0.9
MIN_PER_SAMPLE_S = 1e-9  # the batch-dependent part is never taken as free
# A batch this many times off the recent mean for REGIME_STEPS steps in a row (the
# steps' batches about alike) is a new batch, not an epoch's short tail: the
# averages start over from those steps. A step's cost is not affine in its batch
# (a forward and backward read every weight whatever the batch), so the average of
# steps at 32 samples said too little of a step at 4: a peer DBS moved from 32 to
# 4 samples was planned 25–33 % too fast for ~20 steps and held every round back
# (bench/bandwidth.py).
REGIME = 1.5
REGIME_STEPS = 2


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
    _shifted: list = field(default_factory=list)  # the last steps far off the mean batch: (samples, seconds, fixed_s)

    def observe(self, samples: int, seconds: float, loss: float = math.nan, fixed_s: float = math.nan) -> None:
        """One step. The speed is a ratio of two EMAs (samples, seconds), not an EMA
        of per-step ratios: a step that happened to be slow weighs by its time, so
        noise moves it less. `fixed_s`: the part of `seconds` no batch changes
        (optimizer update and the like), when the caller timed it (NaN: not this step)."""
        if math.isfinite(loss):
            self.loss = loss if math.isnan(self.loss) else DECAY * self.loss + (1 - DECAY) * loss
        seconds = max(seconds, 1e-9)
        if self._new_regime(samples, seconds, fixed_s):
            earlier, self._shifted = self._shifted[:-1], []
            self._samples = self._seconds = self._steps = self._fixed = self._fixed_steps = 0.0
            for step in earlier:
                self._add(*step)
        self._add(samples, seconds, fixed_s)

    def _new_regime(self, samples: int, seconds: float, fixed_s: float) -> bool:
        """Track the steps in a row whose batch is far off the mean (and about
        alike); True when there are REGIME_STEPS of them."""
        mean = self._samples / self._steps if self._steps > 0 else 0.0
        if mean > 0 and _far(samples, mean) and not (self._shifted and _far(samples, self._shifted[0][0])):
            self._shifted.append((samples, seconds, fixed_s))
        else:
            self._shifted.clear()
        return len(self._shifted) >= REGIME_STEPS

    def _add(self, samples: int, seconds: float, fixed_s: float) -> None:
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


def _far(a: float, b: float) -> bool:
    """a and b more than REGIME times apart."""
    return a > REGIME * b or b > REGIME * a
