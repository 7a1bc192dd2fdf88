"""The intra-host tier's rendezvous directory (peerd.worker.intrahost.group), one per job
under the job's directory: the daemon writes a new *generation* before any of the
job's workers (re)starts, and a worker whose group broke while every member lived
(a stall past the collective timeout) moves it on too, so the group re-forms
without a restart. Without torch: the daemon imports it."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from peerd.core.intrahost import GENERATION_FILE, IntraHostSlot, parse_generation, stale_stores

DIRECTORY = "intrahost"
LOCK_FILE = "generation.lock"


def current_generation(directory: Path) -> int | None:
    """The generation in the directory; None while none was written."""
    try:
        return parse_generation((directory / GENERATION_FILE).read_text())
    except OSError:
        return None


def advance(directory: Path, past: int | None = None) -> int:
    """Write the next generation and return it. With `past`: only if the current
    one is still `past` (the members of a broken group all ask; the first moves it
    on, the others find it moved). Monotonic across daemon restarts (read back from
    the file); old stores are removed once no member can be using them
    (peerd.core.intrahost.stale_stores)."""
    with open(directory / LOCK_FILE, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the daemon and its workers write here
        current = current_generation(directory) or 0
        if past is not None and current != past:
            return current
        generation = current + 1
        tmp = directory / (GENERATION_FILE + ".tmp")
        tmp.write_text(f"{generation}\n")
        os.replace(tmp, directory / GENERATION_FILE)
        for name in stale_stores(_idle_seconds(directory), generation):
            (directory / name).unlink(missing_ok=True)
        return generation


def _idle_seconds(directory: Path) -> dict[str, float]:
    """Seconds since each file in the directory was last written."""
    now, idle = time.time(), {}
    for entry in os.scandir(directory):
        try:
            idle[entry.name] = now - entry.stat().st_mtime
        except FileNotFoundError:
            continue
    return idle


class Rendezvous:
    """The daemon's handle on one job's rendezvous directory."""

    def __init__(self, job_dir: Path, size: int) -> None:
        self.directory = job_dir / DIRECTORY
        self.size = size
        self.directory.mkdir(parents=True, exist_ok=True)

    def slot(self, rank: int) -> IntraHostSlot:
        return IntraHostSlot(str(self.directory), rank, self.size)

    @property
    def generation(self) -> int:
        return current_generation(self.directory) or 0

    def bump(self) -> int:
        """A worker is about to (re)start: a new generation, so every worker of the
        job forms a fresh group at its next round."""
        return advance(self.directory)
