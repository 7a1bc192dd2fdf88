"""A worker's checkpoints as its engine keeps them: the directory, the last one
written or resumed from, and when the next is due (peerd.core.checkpoints)."""

from __future__ import annotations

import asyncio
import logging
import time

import torch

from peerd.core.checkpoints import LastCheckpoint, checkpoint_due
from peerd.settings.jobspec import CheckpointSpec
from peerd.worker.state.checkpoint import Checkpoint, CheckpointDir
from peerd.worker.state.pull import StateMeta

log = logging.getLogger("peerd.worker")


class Checkpointer:
    def __init__(self, directory: CheckpointDir, every: CheckpointSpec) -> None:
        self.directory = directory
        self.every = every
        self.last = LastCheckpoint(0, time.monotonic(), 0)

    @property
    def round(self) -> int:
        """The round of the last checkpoint written or resumed from."""
        return self.last.round

    @property
    def written(self) -> int:
        """Checkpoints this process wrote."""
        return self.last.written

    def due(self, round_: int) -> bool:
        return checkpoint_due(self.every.every_rounds, self.every.every_s, self.last, round_, time.monotonic())

    async def load_newest(self) -> Checkpoint | None:
        return await asyncio.to_thread(self.directory.load_newest)

    def resumed(self, round_: int) -> None:
        """The worker continues from its checkpoint of `round_`: the next is due from there."""
        self.last = LastCheckpoint(round_, time.monotonic(), self.last.written)

    async def write(self, meta: StateMeta, vector: torch.Tensor, why: str) -> None:
        """`vector`: a copy on the CPU (the model may live on a GPU). Written in a
        thread, so the event loop serves partners meanwhile; the training side
        waits for it, as Engine.end_round awaits the write."""
        path = await asyncio.to_thread(self.directory.save, meta, vector)
        self.last = LastCheckpoint(meta.round, time.monotonic(), self.last.written + 1)
        log.info("checkpoint of round %d written (%s): %s", meta.round, why, path.name)
