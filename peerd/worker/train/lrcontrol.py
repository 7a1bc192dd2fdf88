"""peerd's multiplier on the learning rate, applied around optimizer.step.

Whatever sets the base LR — peerd's own schedule, or a script's scheduler —
keeps seeing its own value: a pre-step hook multiplies every group's LR by the
scaling with the global batch (ramped when it changes, Dynamic mini-batch SGD)
and by this peer's DBS share, and a post-step hook puts the base back. So a
chainable scheduler (StepLR, ExponentialLR, which multiply the current LR) never
compounds peerd's factor, and a step the GradScaler skips changes nothing.
"""

from __future__ import annotations

import logging
import math

import torch

from peerd.core.lr import ScaleRamp
from peerd.settings.jobspec import OptimizerSpec

log = logging.getLogger("peerd.worker")


class LrControl:
    def __init__(self, spec: OptimizerSpec) -> None:
        self.reference_batch = spec.reference_batch
        self.ramp = ScaleRamp(spec.reference_batch, spec.ramp_steps, spec.scaling, spec.max_scale)
        self.multiplier = 1.0
        self.lr = math.nan  # the first group's effective LR at the last step
        self._saved: list[float] = []

    def update(self, global_batch: int, step: int, batch_scale: float = 1.0) -> float:
        """The multiplier for the step about to be taken (`step` counts the ones done)."""
        first = self.ramp.batch == 0
        if self.ramp.set_batch(global_batch, step):
            log.info("global batch now %d: LR scale ramps to %.3f (%s)", self.ramp.batch,
                     self.ramp.target(self.ramp.batch), self.law())
        elif first:  # what is in force, said once: a copied job file carries its reference along
            log.info("LR: %s; global batch %d: LR scale %.3f", self.law(), global_batch,
                     self.ramp.target(global_batch))
        self.multiplier = self.ramp.scale(step) * batch_scale
        return self.multiplier

    def law(self) -> str:
        """The scaling in force, in words ([optimizer] reference_batch, scaling, max_scale)."""
        ramp = self.ramp
        if ramp.reference_batch == 0:
            return "no scaling with the global batch ([optimizer] reference_batch = 0)"
        cap = "no cap" if math.isinf(ramp.max_scale) else f"cap {ramp.max_scale:g}"
        return f"{ramp.law} law against the reference batch {ramp.reference_batch}, {cap}"

    def install(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.register_step_pre_hook(self._pre)
        optimizer.register_step_post_hook(self._post)

    def _pre(self, optimizer: torch.optim.Optimizer, args, kwargs) -> None:
        self._saved = [group["lr"] for group in optimizer.param_groups]
        for group in optimizer.param_groups:
            group["lr"] = group["lr"] * self.multiplier
        self.lr = float(optimizer.param_groups[0]["lr"])

    def _post(self, optimizer: torch.optim.Optimizer, args, kwargs) -> None:
        for group, lr in zip(optimizer.param_groups, self._saved):
            group["lr"] = lr
