"""The torch device a worker trains on ([worker] device / devices)."""

from __future__ import annotations

import torch

from peerd.errors import ConfigError


def resolve_device(name: str) -> torch.device:
    """The torch device for a worker: "auto" is the first GPU if there is one."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"worker.device = {name!r}, but torch sees no CUDA device here")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ConfigError(f"worker.device = {name!r}, but torch sees {torch.cuda.device_count()} CUDA device(s)")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"worker.device = {name!r}, but MPS is not available here")
    return device
