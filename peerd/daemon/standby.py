"""A spare worker process, started ahead of the next join.

Most of a newcomer's join time is its process start: Python, torch, and the
torch._dynamo import torch's optimizers pull in on first use (about 4 s of the
7 s measured in bench/join.py on a busy 2-core host). The daemon keeps one
worker process waiting with all of that imported; a join (or a crashed
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
from peerd.lifeline import parent_env

log = logging.getLogger("peerd.standby")
STANDBY_FLAG = "--standby"
REFILL_DELAY_S = 20.0


class Standby:
    """At most one waiting worker process; take() it or spawn a fresh one."""

    def __init__(self, refill_delay_s: float = REFILL_DELAY_S) -> None:
        self._refill_delay_s = refill_delay_s
        self._spare: asyncio.subprocess.Process | None = None
        self._refill: asyncio.Task | None = None
        self._closed = False
        self.taken = 0  # how many workers started from a spare

    async def start(self) -> None:
        """Start the spare now (the daemon calls this once at startup)."""
        await self._spawn()

    async def _spawn(self) -> None:
        if self._closed or (self._spare is not None and self._spare.returncode is None):
            return
        self._spare = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "peerd.worker", STANDBY_FLAG,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            env=parent_env(), start_new_session=True, limit=RELAY_LINE_LIMIT,
        )
        log.info("standby worker pid %d started", self._spare.pid)

    async def launch(self, argv: list[str]) -> asyncio.subprocess.Process | None:
        """Hand `argv` (a worker command line: python -m peerd.worker ...) to the
        spare and return it, or None when there is no live spare."""
        spare, self._spare = self._spare, None
        self._schedule_refill()
        if spare is None or spare.returncode is not None:
            return None
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
                await self._spawn()
            except OSError as exc:
                log.warning("cannot start a standby worker: %s", exc)

        self._refill = asyncio.create_task(refill(), name="standby-refill")

    async def aclose(self) -> None:
        self._closed = True
        if self._refill is not None:
            self._refill.cancel()
            await asyncio.gather(self._refill, return_exceptions=True)
        spare, self._spare = self._spare, None
        if spare is None or spare.returncode is not None:
            return
        spare.kill()  # it holds nothing yet, and may still be importing
        await spare.wait()
