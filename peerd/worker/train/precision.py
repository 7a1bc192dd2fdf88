"""Precision in one place: autocast, the fp16 GradScaler, clipping, skipped steps.

bf16 runs under autocast with no scaler (its range is fp32's, as PCCL does it);
fp16 adds a GradScaler, which skips a step whose gradients overflowed. Either
way the caller still takes its gossip round after a skipped step (PyTorch issue
76282: a skipped step must not skip the averaging that follows).
"""

from __future__ import annotations

import contextlib

import torch

from peerd.errors import ConfigError

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class Precision:
    def __init__(self, kind: str, device: torch.device, clip_norm: float = 0.0) -> None:
        self.kind = kind
        self.dtype = DTYPES.get(kind)
        self.device_type = device.type
        self.clip_norm = clip_norm
        self.scaler: torch.amp.GradScaler | None = None
        if kind == "fp16":
            try:
                self.scaler = torch.amp.GradScaler(device.type)
            except (RuntimeError, ValueError) as exc:
                raise ConfigError(f"train.precision = 'fp16' needs a GradScaler, not available on "
                                  f"{device.type} here: {exc}") from None
        if self.dtype is not None and not torch.amp.is_autocast_available(device.type):
            raise ConfigError(f"train.precision = {kind!r}: torch has no autocast on {device.type}")

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def step(self, optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> bool:
        """Unscale, clip, step. False: the step was skipped (overflowing fp16
        gradients, or a non-finite gradient norm)."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)
        if self.clip_norm > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, self.clip_norm)
            if self.scaler is None and not torch.isfinite(norm):
                return False
        if self.scaler is None:
            optimizer.step()
            return True
        scale = self.scaler.get_scale()
        self.scaler.step(optimizer)
        self.scaler.update()
        return self.scaler.get_scale() >= scale  # the scaler backs off only after an overflow
