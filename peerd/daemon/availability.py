"""The owner comes first (docs/operations.md, "Shared machines"): the daemon's
loop that samples the machine's use, asks peerd.core.availability what to do,
and has the jobs left (the graceful way, as a drain) or joined again; and the
owner's own pause, kept in state_dir/pause.json so that it outlives a restart."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Protocol

from peerd.core.availability import FOREVER, WHEN_FREE, Gate, Settings, Use, Verdict, busy_reason, decide
from peerd.daemon.usage import open_sampler

log = logging.getLogger("peerd")
PAUSE_FILE = "pause.json"


class Sampler(Protocol):
    """peerd.daemon.usage.CpuSampler or GpuSampler."""

    what: str

    def sample(self) -> list[Use] | None: ...


class Jobs(Protocol):
    """What the owner's coming and going does to this daemon's jobs (peerd.daemon.app.Daemon)."""

    async def hold_jobs(self, reason: str) -> int: ...

    async def release_jobs(self) -> int: ...


class Availability:
    """Whether this machine trains now, and the transitions between the two.

    Transitions run one at a time (a lock): a pause waits for the workers to
    have left, so `peerctl pause` returns with the device free."""

    def __init__(self, settings: Settings, state_dir: Path, jobs: Jobs, gpus_seen: int = 0,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 sampler: Sampler | None = None) -> None:
        """`sampler`: what watches the machine in mode "when-free"; None: the GPUs
        through NVML, else the CPU, opened when the loop runs."""
        self.settings, self._jobs, self._clock, self._wall = settings, jobs, clock, wall
        self._pause_file = state_dir / PAUSE_FILE
        self._paused_until = _read_pause(self._pause_file, wall())  # wall-clock seconds; inf: until resumed
        self._gpus_seen = gpus_seen
        self._sampler = sampler
        self._gate, self._busy = Gate(), None
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self.verdict = self._decide()  # before any job is resumed or joined
        self._left_for = self.verdict.reason  # what the jobs were last left for, for the log

    @property
    def training(self) -> bool:
        return self.verdict.train

    @property
    def not_training(self) -> str:
        return self.verdict.reason

    def _decide(self) -> Verdict:
        until = self._paused_until
        if until is not None:
            until_local = FOREVER if math.isinf(until) else datetime.fromtimestamp(until)
        else:
            until_local = None
        self._gate, verdict = decide(self.settings, self._gate, self._clock(), datetime.fromtimestamp(self._wall()),
                                     until_local, self._busy)
        return verdict

    async def run(self) -> None:
        """Every check_interval_s: sample, decide, carry it out."""
        s = self.settings
        if s.mode == WHEN_FREE and self._sampler is None:
            self._sampler = await asyncio.to_thread(open_sampler, self._gpus_seen)
        if s.mode == WHEN_FREE:
            log.info("availability: training only while the machine is free: watching %s, hold-off %gs",
                     self._sampler.what, s.hold_off_s)
        try:
            while True:
                try:
                    await self.check(sample=not self._wake.is_set())
                except Exception:  # one bad check (a /proc or NVML hiccup) must not stop the watch
                    log.exception("availability check failed")
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), s.check_interval_s)
                except TimeoutError:
                    pass
        finally:
            close = getattr(self._sampler, "close", None)
            if close is not None:
                close()

    async def check(self, sample: bool = True) -> Verdict:
        """One check. `sample` False (woken by a pause): the last sample stands, as
        a CPU sample over a few milliseconds would say little."""
        if sample and self.settings.mode == WHEN_FREE and self._sampler is not None:
            uses = await asyncio.to_thread(self._sampler.sample)
            self._busy = None if uses is None else busy_reason(uses, self.settings.cpu_share, self.settings.commands)
        async with self._lock:
            await self._apply(self._decide())
        return self.verdict

    async def _apply(self, verdict: Verdict) -> None:
        was, self.verdict = self.verdict, verdict
        if verdict.train == was.train:
            if verdict.reason != was.reason and not (verdict.owner_busy and was.owner_busy):
                log.info("not training: %s", verdict.reason)  # a countdown's every second is not news
            return
        started = time.monotonic()
        if verdict.train:
            count = await self._jobs.release_jobs()
            log.info("training again after %s: joining %d job(s) again", self._left_for, count)
        else:
            self._left_for = verdict.reason
            count = await self._jobs.hold_jobs(verdict.reason)
            log.info("not training: %s: %d job(s) left in %.1fs", verdict.reason, count, time.monotonic() - started)

    async def pause(self, for_s: float) -> str:
        """The owner's pause, for `for_s` seconds (0: until resume); returns once
        the workers have left."""
        self._paused_until = self._wall() + for_s if for_s > 0 else math.inf
        _write_pause(self._pause_file, self._paused_until)
        async with self._lock:
            await self._apply(self._decide())
        self._wake.set()  # the loop sees when it ends
        return self.verdict.reason

    async def resume(self) -> str:
        """End the owner's pause; returns what still keeps it from training, if anything."""
        self._paused_until = None
        self._pause_file.unlink(missing_ok=True)
        async with self._lock:
            await self._apply(self._decide())
        return self.verdict.reason


def _read_pause(path: Path, now: float) -> float | None:
    try:
        until = json.loads(path.read_text())["until"]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring %s: %s", path, exc)
        return None
    until = math.inf if until is None else float(until)
    return until if until > now else None


def _write_pause(path: Path, until: float) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"until": None if math.isinf(until) else until}) + "\n")
    tmp.replace(path)
