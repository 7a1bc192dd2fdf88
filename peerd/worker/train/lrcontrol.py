"""peerd's multiplier on the learning rate, applied around optimizer.step.

Whatever sets the base LR — peerd's own schedule, or a script's scheduler —
keeps seeing its own value: a pre-step hook multiplies every group's LR by the
scaling with the global batch (ramped when it changes, Dynamic mini-batch SGD)
and by this peer's DBS share, and a post-step hook puts the base back. So a
chainable scheduler (StepLR, ExponentialLR, which multiply the current LR) never
compounds peerd's factor, and a step the GradScaler skips changes nothing.
The log says the law in force at the first step that uses it, and each change
of the global batch when it comes.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import torch

from peerd.core.lr import ScaleRamp, describe
from peerd.settings.jobspec import OptimizerSpec

log = logging.getLogger("peerd.worker")


class LrControl:
    def __init__(self, spec: OptimizerSpec, lr_of: str = "the job's") -> None:
        self.reference_batch = spec.reference_batch
        self.ramp = ScaleRamp(spec.reference_batch, spec.ramp_steps, spec.scaling, spec.max_scale)
        self.lr_of = lr_of  # whose LR the law multiplies, in its words ("the script's")
        self.multiplier = 1.0
        self.scale = math.nan  # the law's factor (ramped) without the DBS share; NaN before the first update
        self.lr = math.nan  # the first group's effective LR at the last step
        # Called first in the pre-step hook: a script's first optimizer step may
        # show its accumulation (peerd.peer) and change the multiplier.
        self.before_step: Callable[[], None] | None = None
        self._saved: list[float] = []
        self._applied: list[float] = []  # the LRs the pre-step hook set
        self._unsaid = False  # a first batch set, not yet said in the log (at the step that uses it)
        self._depth = 0  # step hooks entered and not left: 1 inside a step

    def update(self, global_batch: int, step: int, batch_scale: float = 1.0) -> float:
        """The multiplier for the step about to be taken (`step` counts the ones done)."""
        first = self.ramp.batch == 0
        if self.ramp.set_batch(global_batch, step):
            log.info("global batch now %d: LR scale ramps to %.3f (%s)", self.ramp.batch,
                     self.ramp.target(self.ramp.batch), self.law())
        elif first:  # what is in force, said at the next step: a copied job file carries its reference along
            self._unsaid = True
        self.scale = self.ramp.scale(step)
        self.multiplier = self.scale * batch_scale
        return self.multiplier

    def law(self) -> str:
        """The scaling in force, in words ([optimizer] reference_batch, scaling, max_scale)."""
        ramp = self.ramp
        return describe(ramp.reference_batch, ramp.law, ramp.max_scale, self.lr_of)

    def install(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.register_step_pre_hook(self._pre)
        optimizer.register_step_post_hook(self._post)

    def _pre(self, optimizer: torch.optim.Optimizer, args, kwargs) -> None:
        # A subclass's step() that calls its base's runs the hooks once per hooked
        # class (torch wraps each): the factor goes on once, comes off once. Inside
        # a step the groups hold the LRs set here; other LRs are a new step (one
        # that raised never took its factor off).
        if self._depth and [group["lr"] for group in optimizer.param_groups] == self._applied:
            self._depth += 1
            return
        self._depth = 1
        if self.before_step is not None:
            self.before_step()
        if self._unsaid:
            self._unsaid = False
            log.info("LR: %s; global batch %d: LR scale %.3f", self.law(), self.ramp.batch,
                     self.ramp.target(self.ramp.batch))
        self._saved = [group["lr"] for group in optimizer.param_groups]
        for group in optimizer.param_groups:
            group["lr"] = group["lr"] * self.multiplier
        self._applied = [group["lr"] for group in optimizer.param_groups]
        self.lr = float(optimizer.param_groups[0]["lr"])

    def _post(self, optimizer: torch.optim.Optimizer, args, kwargs) -> None:
        self._depth = max(0, self._depth - 1)
        if self._depth:
            return
        for group, lr in zip(optimizer.param_groups, self._saved):
            group["lr"] = lr
