"""Spare worker processes, started ahead of the next join.

Most of a newcomer's join time is its process start: Python, torch, and the
torch._dynamo import torch's optimizers pull in on first use (about 4 s of the
7 s measured in bench/join.py on a busy 2-core host). The daemon keeps a
worker process per device waiting with all of that imported; a join (or a crashed
worker's restart) hands it its command line on stdin instead of spawning a new
process. A replacement is started only after `refill_delay_s`, so that its
imports do not compete with the worker it was taken for.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys

from peerd.daemon.process import RELAY_LINE_LIMIT
from peerd.control.lifeline import parent_env

log = logging.getLogger("peerd.standby")
STANDBY_FLAG = "--standby"
REFILL_DELAY_S = 20.0


class Standby:
    """Up to `size` waiting worker processes (one per worker a job has here, so
    that every worker of a join starts warm); launch() takes one."""

    def __init__(self, size: int = 1, refill_delay_s: float = REFILL_DELAY_S) -> None:
        if size < 1:
            raise ValueError("a standby holds at least one process")
        self._size = size
        self._refill_delay_s = refill_delay_s
        self._spares: list[asyncio.subprocess.Process] = []
        self._refill: asyncio.Task | None = None
        self._closed = False
        self.taken = 0  # how many workers started from a spare

    @property
    def spares(self) -> list[asyncio.subprocess.Process]:
        """The live spares, oldest first."""
        self._spares = [p for p in self._spares if p.returncode is None]
        return list(self._spares)

    async def start(self) -> None:
        """Start the spares now (the daemon calls this once at startup)."""
        await self._fill()

    async def _fill(self) -> None:
        while not self._closed and len(self.spares) < self._size:
            spare = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "peerd.worker", STANDBY_FLAG,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
                env=parent_env(), start_new_session=True, limit=RELAY_LINE_LIMIT,
            )
            self._spares.append(spare)
            log.info("standby worker pid %d started", spare.pid)

    async def launch(self, argv: list[str]) -> asyncio.subprocess.Process | None:
        """Hand `argv` (a worker command line: python -m peerd.worker ...) to a
        spare and return it, or None when there is no live spare."""
        live = self.spares
        self._schedule_refill()
        if not live:
            return None
        spare = live[0]  # the oldest: the most likely to have finished its imports
        self._spares.remove(spare)
        try:
            spare.stdin.write(json.dumps(argv[3:]).encode() + b"\n")
            await spare.stdin.drain()
            spare.stdin.close()
        except (ConnectionError, OSError):  # it died just now
            return None
        self.taken += 1
        return spare

    def _schedule_refill(self) -> None:
        if self._closed or (self._refill is not None and not self._refill.done()):
            return

        async def refill() -> None:
            await asyncio.sleep(self._refill_delay_s)
            try:
                await self._fill()
            except OSError as exc:
                log.warning("cannot start a standby worker: %s", exc)

        self._refill = asyncio.create_task(refill(), name="standby-refill")

    async def aclose(self) -> None:
        self._closed = True
        if self._refill is not None:
            self._refill.cancel()
            await asyncio.gather(self._refill, return_exceptions=True)
        spares, self._spares = self.spares, []
        for spare in spares:
            spare.kill()  # it holds nothing yet, and may still be importing
        await asyncio.gather(*(spare.wait() for spare in spares))
