"""Counting this machine's GPUs without importing torch (the daemon never does)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")  # one directory per GPU the driver sees


def local_gpus(env: Mapping[str, str] | None = None, root: Path = NVIDIA_GPUS) -> int:
    """CUDA devices a worker will see: CUDA_VISIBLE_DEVICES when it is set
    (up to its first -1, as CUDA reads it), else the GPUs the driver lists."""
    env = os.environ if env is None else env
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        entries = [e.strip() for e in visible.split(",") if e.strip()]
        return len(entries[:entries.index("-1")] if "-1" in entries else entries)
    try:
        return sum(1 for entry in root.iterdir() if entry.is_dir())
    except OSError:
        return 0
