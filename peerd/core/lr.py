"""Learning rate for a changing global batch (Dynamic mini-batch SGD; DESIGN §1.6).

The job's schedule gives the LR at the reference global batch B_ref. With an
effective global batch B the linear scaling rule asks for scale B / B_ref. When
B changes by k = B'/B the scale is not jumped (the paper's baseline, which
hurts accuracy) but ramped linearly from its current value to the new target
over T·max(k, 1/k) steps; a change during a ramp starts a new ramp from where
the scale is. Momentum is kept by the caller (nothing here touches it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def cosine(progress: float) -> float:
    """Cosine decay from 1 to 0 as progress goes from 0 to 1."""
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, max(0.0, progress))))


@dataclass
class ScaleRamp:
    """The LR multiplier over steps, ramped when the global batch changes."""

    reference_batch: int  # B_ref; 0 turns scaling off (the multiplier stays 1)
    ramp_steps: int = 8  # T
    _start_step: int = 0
    _start_scale: float = 1.0
    _target_scale: float = 1.0
    _length: int = 0
    _batch: int = 0

    def __post_init__(self) -> None:
        if self.reference_batch < 0 or self.ramp_steps < 0:
            raise ValueError("reference_batch and ramp_steps must be ≥ 0")

    @property
    def batch(self) -> int:
        """The global batch last set, 0 before the first."""
        return self._batch

    def set_batch(self, batch: int, step: int) -> bool:
        """The effective global batch is `batch` from `step` on; True if a ramp starts."""
        if batch <= 0:
            raise ValueError(f"global batch must be positive, got {batch}")
        if self.reference_batch == 0 or batch == self._batch:
            self._batch = batch
            return False
        target = batch / self.reference_batch
        if self._batch == 0:  # the first batch: start at its scale, nothing to smooth
            self._batch, self._start_scale, self._target_scale, self._length = batch, target, target, 0
            return False
        k = batch / self._batch
        self._start_scale = self.scale(step)
        self._start_step, self._target_scale = step, target
        self._length = math.ceil(self.ramp_steps * max(k, 1.0 / k))
        self._batch = batch
        return True

    def scale(self, step: int) -> float:
        if self._length == 0 or step >= self._start_step + self._length:
            return self._target_scale
        done = max(0, step - self._start_step) / self._length
        return self._start_scale + done * (self._target_scale - self._start_scale)
