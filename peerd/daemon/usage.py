"""Sampling what the machine's owner runs: the processes on its GPUs through
NVML (`nvidia-ml-py`'s pynvml, an optional import), or the processes' CPU time
from /proc. Thin: peerd.core.availability says what the samples mean."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from peerd.core.availability import Proc, Snapshot, Use, cpu_uses, gpu_uses

log = logging.getLogger("peerd")
PROC = Path("/proc")


def read_proc(root: Path = PROC) -> Snapshot:
    """Every process's parent, start time, CPU time, name and command line (which
    tells peerd's own processes)."""
    uptime = float((root / "uptime").read_text().split()[0])
    procs = {}
    for entry in os.scandir(root):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            stat = (root / entry.name / "stat").read_text()
            argv = _argv(root / entry.name)
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue  # it ended while we looked
        name, _, rest = stat[stat.index("(") + 1:].rpartition(")")
        fields = rest.split()  # from the state on: ppid is fields[1], utime [11], stime [12], starttime [19]
        procs[pid] = Proc(int(fields[1]), int(fields[19]), int(fields[11]) + int(fields[12]), name, argv)
    return Snapshot(uptime, procs)


def _argv(path: Path) -> tuple[str, ...]:
    return tuple(a.decode(errors="replace") for a in (path / "cmdline").read_bytes().split(b"\0") if a)


class CpuSampler:
    """Each check, the CPU each other process used since the last check."""

    what = "the CPU (/proc)"

    def __init__(self, own_pid: int | None = None, root: Path = PROC) -> None:
        self._own = os.getpid() if own_pid is None else own_pid
        self._root = root
        self._hz = os.sysconf("SC_CLK_TCK")
        self._last: Snapshot | None = None

    def sample(self) -> list[Use] | None:
        """The uses since the last call; None on the first (nothing to compare with)."""
        now = read_proc(self._root)
        last, self._last = self._last, now
        return None if last is None else cpu_uses(last, now, self._hz, [self._own])


class GpuSampler:
    """Each check, the compute processes on the GPUs NVML lists. `nvml`: the
    pynvml module, or a stand-in with the same calls."""

    def __init__(self, nvml: Any, own_pid: int | None = None, root: Path = PROC) -> None:
        self._nvml = nvml
        self._own = os.getpid() if own_pid is None else own_pid
        self._root = root
        nvml.nvmlInit()
        self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        self.what = f"{len(self._handles)} GPU(s) (NVML)"

    @property
    def gpus(self) -> int:
        return len(self._handles)

    def sample(self) -> list[Use]:
        held = [(p.pid, index, p.usedGpuMemory or 0) for index, handle in enumerate(self._handles)
                for p in self._nvml.nvmlDeviceGetComputeRunningProcesses(handle)]
        if not held:
            return []
        procs = read_proc(self._root).procs  # who they are, and whether they are peerd's
        return gpu_uses(held, {pid: p.name for pid, p in procs.items()},
                        {pid: p.ppid for pid, p in procs.items()}, {pid: p.argv for pid, p in procs.items()},
                        [self._own])

    def close(self) -> None:
        self._nvml.nvmlShutdown()


def open_sampler(gpus_seen: int, import_nvml=None) -> CpuSampler | GpuSampler:
    """The GPUs through NVML when there are any, else the CPU. `gpus_seen`: GPUs
    the driver lists (peerd.daemon.devices): without NVML for them, say why."""
    try:
        nvml = import_nvml() if import_nvml is not None else _import_pynvml()
        sampler = GpuSampler(nvml)
    except Exception as exc:  # ImportError, or NVMLError: no driver, no GPU
        if gpus_seen:
            log.warning("availability: %d GPU(s) here but NVML is not usable (%s): watching the CPU instead "
                        "(pip install nvidia-ml-py)", gpus_seen, exc)
        return CpuSampler()
    if sampler.gpus:
        return sampler
    sampler.close()
    return CpuSampler()


def _import_pynvml():
    import pynvml  # nvidia-ml-py: optional, only for [availability] mode = "when-free" on GPU machines

    return pynvml
