"""The workers a daemon runs for each job: their devices, ids and threads.

Pure: the number of local GPUs is an argument (peerd.daemon.devices counts them).
"""

from __future__ import annotations

SEPARATOR = "."  # peer ids hold only letters, digits and '-': "<peer_id>.<k>" is unambiguous


def worker_devices(configured: tuple[str, ...], gpus: int) -> tuple[str, ...]:
    """One device per worker. `()` ([worker] devices = "auto") is every local
    GPU, or one "auto" worker when none is seen (it takes cpu, or mps)."""
    if configured:
        return configured
    return tuple(f"cuda:{k}" for k in range(gpus)) or ("auto",)


def member_ids(peer_id: str, count: int) -> list[str]:
    """The job member id of each worker: the daemon's peer id for a single
    worker (as before several workers were possible), else "<peer_id>.<k>"."""
    if count == 1:
        return [peer_id]
    return [f"{peer_id}{SEPARATOR}{k}" for k in range(count)]


def split_threads(threads: int, workers: int) -> int:
    """Torch threads of each worker: the daemon's share for a job, split evenly, at least one."""
    return max(1, threads // workers)
