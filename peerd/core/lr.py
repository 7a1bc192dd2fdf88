"""Learning rate for a changing global batch (Dynamic mini-batch SGD; docs/algorithms.md §1.6).

The job's schedule gives the LR at the reference global batch B_ref. With an
effective global batch B = k·B_ref the LR is multiplied by `scale_for(k, law,
max_scale)`: k ("linear", the SGD rule of Goyal et al.), √k ("sqrt", the rule
for Adam-type optimizers) or 1 ("none"), clamped to [1/max_scale, max_scale].
The clamp is symmetric, so scale_for(1/k) == 1/scale_for(k) and the multiplier
depends on B alone: a join followed by the matching leave comes back to the LR
it started from.

When B changes the multiplier is not jumped (the paper's baseline, which hurts
accuracy) but ramped linearly from its current value to the new target over
T·max(r, 1/r) steps, r the ratio of the new multiplier to the current one (with
the uncapped linear law r = k, the third-party rule T·max(k, 1/k)); a change
during a ramp starts a new ramp from where the multiplier is. Momentum is kept
by the caller (nothing here touches it).

The defaults (sqrt law, cap 2, T = 8) come from the simulator sweep in
docs/simulation.md (Result 5): with them every join and leave of k = 2, 4, 8
ends within 1 point of the run without the change (3 seeds), while a multiplier
of 4 reached in T = 8 costs 1.5 points and the uncapped linear rule 8 at k = 8.
docs/algorithms.md ("Scaling the LR with the global batch") gives the reasons.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

LAWS = ("linear", "sqrt", "none")
DEFAULT_LAW = "sqrt"
DEFAULT_MAX_SCALE = 2.0
DEFAULT_RAMP_STEPS = 8


def cosine(progress: float) -> float:
    """Cosine decay from 1 to 0 as progress goes from 0 to 1."""
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, max(0.0, progress))))


def check_law(law: str, max_scale: float) -> None:
    """Raise ValueError unless `law` is one of LAWS and `max_scale` ≥ 1 (math.inf: no cap)."""
    if law not in LAWS:
        raise ValueError(f"unknown LR scaling law {law!r}; choose from {', '.join(LAWS)}")
    if not max_scale >= 1.0:  # also refuses NaN
        raise ValueError(f"max_scale must be ≥ 1 (inf for no cap), got {max_scale}")


def describe(reference_batch: int, law: str, max_scale: float, lr_of: str = "the job's") -> str:
    """The law in force, in words, as the worker's log, `peerctl status`, the
    live page and `peerd check-config JOB.toml` say it; `lr_of` names whose LR
    it multiplies ("the script's" for a script job)."""
    if reference_batch == 0 or law == "none":
        why = "reference_batch = 0" if reference_batch == 0 else 'scaling = "none"'
        return f"no scaling: {lr_of} LR exactly ([optimizer] {why})"
    cap = "no cap" if math.isinf(max_scale) else f"cap {max_scale:g}"
    return f"{law} law against the reference batch {reference_batch}, {cap}"


def scale_for(k: float, law: str = DEFAULT_LAW, max_scale: float = DEFAULT_MAX_SCALE) -> float:
    """The LR multiplier for a global batch k× the reference one, in [1/max_scale, max_scale]."""
    check_law(law, max_scale)
    if not k > 0:
        raise ValueError(f"the batch ratio k must be positive, got {k}")
    raw = k if law == "linear" else math.sqrt(k) if law == "sqrt" else 1.0
    return min(max_scale, max(1.0 / max_scale, raw))


def ramp_length(current: float, target: float, ramp_steps: int) -> int:
    """Steps to go from multiplier `current` to `target`: T·max(r, 1/r), 0 if they are equal."""
    if current == target:
        return 0
    # Both quotients, not one and its reciprocal: 1 / (1 / 443) is 443.00000000000006,
    # whose ceiling is a step too many. The margin absorbs the last bit of rounding.
    ratio = max(target / current, current / target)
    return math.ceil(ramp_steps * ratio - 1e-9)


@dataclass
class ScaleRamp:
    """The LR multiplier over steps, ramped when the global batch changes."""

    reference_batch: int  # B_ref; 0 turns scaling off (the multiplier stays 1)
    ramp_steps: int = DEFAULT_RAMP_STEPS  # T
    law: str = DEFAULT_LAW  # one of LAWS
    max_scale: float = DEFAULT_MAX_SCALE  # cap on the multiplier (and 1/cap its floor); math.inf: none
    _start_step: int = 0
    _start_scale: float = 1.0
    _target_scale: float = 1.0
    _length: int = 0
    _batch: int = 0

    def __post_init__(self) -> None:
        if self.reference_batch < 0 or self.ramp_steps < 0:
            raise ValueError("reference_batch and ramp_steps must be ≥ 0")
        check_law(self.law, self.max_scale)

    @property
    def batch(self) -> int:
        """The global batch last set, 0 before the first."""
        return self._batch

    def target(self, batch: int) -> float:
        """The multiplier a global batch of `batch` settles at."""
        if self.reference_batch == 0:
            return 1.0
        return scale_for(batch / self.reference_batch, self.law, self.max_scale)

    def set_batch(self, batch: int, step: int) -> bool:
        """The effective global batch is `batch` from `step` on; True if a ramp starts."""
        if batch <= 0:
            raise ValueError(f"global batch must be positive, got {batch}")
        if self.reference_batch == 0 or batch == self._batch:
            self._batch = batch
            return False
        target = self.target(batch)
        if self._batch == 0:  # the first batch: start at its scale, nothing to smooth (warm-up's job)
            self._batch, self._start_scale, self._target_scale, self._length = batch, target, target, 0
            return False
        self._start_scale = self.scale(step)
        self._start_step, self._target_scale = step, target
        self._length = ramp_length(self._start_scale, target, self.ramp_steps)
        self._batch = batch
        return self._length > 0

    def scale(self, step: int) -> float:
        if self._length == 0 or step >= self._start_step + self._length:
            return self._target_scale
        done = max(0, step - self._start_step) / self._length
        return self._start_scale + done * (self._target_scale - self._start_scale)
