"""The daemon's side of the intra-host tier (peerd.worker.intrahost): a rendezvous
directory per job under the job's directory, a slot per worker, and a new
generation written before any of the job's workers (re)starts. Without torch."""

from __future__ import annotations

import os
from pathlib import Path

from peerd.core.intrahost import GENERATION_FILE, IntraHostSlot, parse_generation, stale_stores

DIRECTORY = "intrahost"


class Rendezvous:
    def __init__(self, job_dir: Path, size: int) -> None:
        self.directory = job_dir / DIRECTORY
        self.size = size
        self.directory.mkdir(parents=True, exist_ok=True)

    def slot(self, rank: int) -> IntraHostSlot:
        return IntraHostSlot(str(self.directory), rank, self.size)

    @property
    def generation(self) -> int:
        try:
            return parse_generation((self.directory / GENERATION_FILE).read_text()) or 0
        except OSError:
            return 0

    def bump(self) -> int:
        """A worker is about to (re)start: a new generation, so every worker of the
        job forms a fresh group at its next round. Monotonic across daemon restarts
        (read back from the file); old stores are removed."""
        generation = self.generation + 1
        tmp = self.directory / (GENERATION_FILE + ".tmp")
        tmp.write_text(f"{generation}\n")
        os.replace(tmp, self.directory / GENERATION_FILE)
        for name in stale_stores(os.listdir(self.directory), generation):
            (self.directory / name).unlink(missing_ok=True)
        return generation
