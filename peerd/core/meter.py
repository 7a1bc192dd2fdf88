"""What a worker reports of its steps: the training loss and its speed, smoothed.

One meter for peerd's own loop and a script's (peerd.peer), so both report alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DECAY = 0.9


@dataclass
class StepMeter:
    loss: float = math.nan  # EMA of the finite step losses
    speed: float = math.nan  # samples/s of compute, no network wait
    _samples: float = 0.0
    _seconds: float = 0.0

    def observe(self, samples: int, seconds: float, loss: float = math.nan) -> None:
        """One step. The speed is a ratio of two EMAs (samples, seconds), not an EMA
        of per-step ratios: a step that happened to be slow weighs by its time, so
        noise moves it less."""
        if math.isfinite(loss):
            self.loss = loss if math.isnan(self.loss) else DECAY * self.loss + (1 - DECAY) * loss
        self._samples = DECAY * self._samples + (1 - DECAY) * samples
        self._seconds = DECAY * self._seconds + (1 - DECAY) * max(seconds, 1e-9)
        self.speed = self._samples / self._seconds
