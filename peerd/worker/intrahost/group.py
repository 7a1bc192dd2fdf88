"""The intra-host tier: a daemon's workers of one job average their group stage
over torch.distributed (NCCL between GPUs, gloo on the CPU) instead of the bulk
lane (docs/algorithms.md §1.3; the decisions are in peerd.core.intrahost).

Rendezvous comes from the daemon: a FileStore in the rendezvous directory under
the job's directory on this host (`store-<generation>`), with the generation the
daemon writes there whenever it (re)starts one of the job's workers. No server to
start, no port to open: gloo listens on 127.0.0.1 only, and a FileStore is a file.

The round itself is peerd.worker.intrahost.round.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import TypeVar

import torch
import torch.distributed as dist

from peerd.core.intrahost import (
    AGREE,
    FORM,
    USE,
    Decision,
    GroupState,
    IntraHostSlot,
    backend_for,
    start_round,
    store_name,
)
from peerd.errors import PeerdError
from peerd.control.rendezvous import advance, current_generation

log = logging.getLogger("peerd.worker.intrahost.group")

COLLECTIVE_TIMEOUT_S = 30.0  # a member that does not take part in a collective by then has failed
FORM_TIMEOUT_S = 120.0  # every member must come to form the group by then (they start at different times)
CHECK_IN_POLL_S = 0.05  # how often a forming member looks whether all have arrived (or it was called off)

T = TypeVar("T")


class IntraHostError(PeerdError):
    """The intra-host group failed; the caller goes back to the bulk lane."""


class IntraHostGroup:
    """One worker's membership of its daemon's intra-host group for a job."""

    def __init__(self, slot: IntraHostSlot, device: torch.device, me: str,
                 timeout_s: float = COLLECTIVE_TIMEOUT_S, form_timeout_s: float = FORM_TIMEOUT_S) -> None:
        if not dist.is_available():
            raise IntraHostError("this torch has no torch.distributed")
        self.slot = slot
        self.device = device
        self.members = slot.members(me)
        self.backend = backend_for(device.type)
        self.timeout = timedelta(seconds=timeout_s)
        self.form_timeout = timedelta(seconds=form_timeout_s)
        self.state = GroupState()
        self.generation: int | None = None  # of the group in use
        self.rounds = 0  # rounds whose inner stage ran on the group
        self._pg = None
        self._forming: asyncio.Task | None = None
        self._call_off = threading.Event()  # set: the forming in progress is abandoned
        self._said = ""  # the last fallback reason logged (logged once per change)
        self._round = 0  # the round this worker is in, as the last poll saw it

    @property
    def directory(self) -> Path:
        return Path(self.slot.directory)

    def current_generation(self) -> int | None:
        return current_generation(self.directory)

    def poll(self, round_: int) -> Decision:
        """At the start of a round, before any collective: start forming a new
        generation's group in the background when there is one."""
        self._round = round_
        generation = self.current_generation()
        decision = self.state.decide(generation, round_)
        if decision.action == FORM:
            self._start_forming(generation, decision.tag)
            decision = self.state.decide(generation, round_)
        return decision

    async def enter(self, round_: int, key: int) -> bool:
        """True: this round's inner stage runs on the group (every member got True).
        `key`: round_key of this member's plan, or NOT_COVERING."""
        decision = self.poll(round_)
        if decision.action == AGREE:
            try:
                keys = await self.run(self.agree, round_, key)
            except IntraHostError:
                return False
            decision = self.state.agreement(keys)
            if decision.action == FORM:
                log.info("round %d: intra-host group re-forms: %s", round_, decision.reason)
                self._start_forming(self.state.formed[0], decision.tag)
        if decision.action == USE:
            if self._said:
                log.info("intra-host group in use: generation %d, %s, rank %d of %d", self.generation, self.backend,
                         self.slot.rank, self.slot.size)
                self._said = ""
            return True
        if decision.reason != self._said:
            log.info("intra-host group not used (%s): the bulk lane carries the group stage", decision.reason)
            self._said = decision.reason
        return False

    def _start_forming(self, generation: int, tag: str) -> None:
        self._drop()
        self._call_off.set()  # a forming still waiting for members gives up
        self._call_off = threading.Event()
        self.state.forming_started(generation, tag)
        self._forming = asyncio.create_task(self._form(generation, tag, self._call_off),
                                            name=f"intrahost-form-{generation}-{tag}")

    async def _form(self, generation: int, tag: str, call_off: threading.Event) -> None:
        started = time.monotonic()
        try:
            pg, start = await asyncio.to_thread(self._connect, generation, tag, call_off)
        except Exception as exc:  # noqa: BLE001 - DistStoreError, timeouts, resets, called off: any is a fallback
            if not call_off.is_set():
                log.warning("intra-host group of generation %d did not form: %s", generation, _short(exc))
            self.state.forming_done(generation, tag, False)
            return
        if self.state.forming != (generation, tag):
            _abort(pg)  # a newer one came meanwhile
            return
        self._pg, self.generation = pg, generation
        self.state.forming_done(generation, tag, True, start)
        log.info("intra-host group formed in %.1fs: generation %d, %s, rank %d of %d (%s); in use from round %d",
                 time.monotonic() - started, generation, self.backend, self.slot.rank, self.slot.size,
                 ", ".join(self.members), start)

    def _connect(self, generation: int, tag: str, call_off: threading.Event):
        """Blocking: form the group; its first collective proves it and gathers the
        members' rounds, which give the round it is used from.

        The members check in on the store first and wait for each other in short
        polls, so a forming that is called off (a newer generation, the worker
        closing) ends within CHECK_IN_POLL_S rather than after FORM_TIMEOUT_S; the
        process group is made once all are there (still within FORM_TIMEOUT_S: on
        a loaded machine a member may take seconds from its check-in to the group)."""
        files = dist.FileStore(str(self.directory / store_name(generation)), self.slot.size)
        files.set_timeout(self.form_timeout)
        store = dist.PrefixStore(f"{tag}/", files)
        rank, size = self.slot.rank, self.slot.size
        store.add("arrived", 1)
        deadline = time.monotonic() + self.form_timeout.total_seconds()
        while store.add("arrived", 0) < size:
            if call_off.wait(CHECK_IN_POLL_S):
                raise IntraHostError("called off")
            if time.monotonic() > deadline:
                raise IntraHostError(f"only {store.add('arrived', 0)} of {size} members came in "
                                     f"{self.form_timeout.total_seconds():.0f}s")
        if self.backend == "gloo":
            options = dist.ProcessGroupGloo._Options()
            options._timeout = self.form_timeout
            options._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]  # loopback only
            pg = dist.ProcessGroupGloo(store, rank, size, options)
        else:
            if not dist.is_nccl_available():
                raise RuntimeError("this torch has no NCCL")
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = self.form_timeout
            with torch.cuda.device(self.device):
                pg = dist.ProcessGroupNCCL(store, rank, size, options)
        with _on(self.device):
            mine = torch.tensor([self._round], dtype=torch.int64, device=self.device)
            every = [torch.empty(1, dtype=torch.int64, device=self.device) for _ in range(size)]
            pg.allgather([every], [mine]).wait(self.form_timeout)  # NCCL makes its communicator here
            return pg, start_round([int(t) for t in every])

    async def run(self, fn: Callable[..., T], *args) -> T:
        """A blocking collective in a thread (the event loop keeps serving partners).
        Any failure (a reset, a timeout, anything torch.distributed raises) breaks
        the group: the round falls back to the bulk lane, and the generation is
        moved on so that the members re-form (peerd.core.intrahost.GroupState.rebuild)."""
        try:
            return await asyncio.to_thread(fn, *args)
        except asyncio.CancelledError:
            # An overlapped round given up mid-collective: the others wait for this
            # member's next collectives in vain, so the group is over for all.
            self._break("the round was given up mid-collective")
            raise
        except Exception as exc:  # noqa: BLE001 - a broken collective is never a reason to crash the worker
            self._break(_short(exc))
            raise IntraHostError(f"intra-host collective failed: {_short(exc)}") from None

    def _break(self, why: str) -> None:
        generation = self.generation
        self.state.broke()
        self._drop()
        past = self.state.rebuild()
        if past is not None:
            try:
                advance(self.directory, past)
            except OSError as error:
                log.warning("intra-host rendezvous %s not writable: %s", self.directory, error)
        log.warning("intra-host group of generation %s failed: %s; the bulk lane carries the group stage "
                    "until it re-forms", generation, why)

    # Blocking collectives: call them through run().

    def agree(self, round_: int, key: int) -> list[tuple[int, int]]:
        pg = self._group()
        with _on(self.device):
            mine = torch.tensor([round_, key], dtype=torch.int64, device=self.device)
            every = [torch.empty(2, dtype=torch.int64, device=self.device) for _ in range(self.slot.size)]
            pg.allgather([every], [mine]).wait(self.timeout)
            return [(int(t[0]), int(t[1])) for t in every]

    def all_reduce_mean_(self, tensor: torch.Tensor) -> None:
        pg = self._group()
        with _on(self.device), _staged(tensor, self.device) as buffer:
            pg.allreduce([buffer]).wait(self.timeout)
            buffer.div_(self.slot.size)

    def mean_into_(self, source: torch.Tensor, target: torch.Tensor) -> None:
        """target ← the group mean of every member's `source`, which stays as it
        was: a copy, then an in-place all-reduce. (An out-of-place reduce-scatter +
        all-gather saves the copy but doubled gloo's CPU time here: gloo's
        reduce_scatter is not a ring; docs/benchmarks.md.)"""
        target.copy_(source)
        self.all_reduce_mean_(target)

    def broadcast_(self, tensor: torch.Tensor, root: int) -> None:
        pg = self._group()
        options = dist.BroadcastOptions()
        options.rootRank, options.rootTensor = root, 0
        with _on(self.device), _staged(tensor, self.device) as buffer:
            pg.broadcast([buffer], options).wait(self.timeout)

    def _group(self):
        if self._pg is None:
            raise RuntimeError("no intra-host group")
        return self._pg

    def rank_of(self, member: str) -> int:
        return self.members.index(member)

    def _drop(self) -> None:
        pg, self._pg, self.generation = self._pg, None, None
        if pg is not None:
            _abort(pg)

    async def aclose(self) -> None:
        self._call_off.set()
        if self._forming is not None and not self._forming.done():
            self._forming.cancel()
            await asyncio.gather(self._forming, return_exceptions=True)
        self._drop()


class _staged:
    """The tensor itself when it lives on the group's device; else a copy there,
    written back on exit (a CPU work buffer on an NCCL group)."""

    def __init__(self, tensor: torch.Tensor, device: torch.device) -> None:
        self.tensor = tensor
        self.device = device
        self.copy = tensor.device != device or not tensor.is_contiguous()

    def __enter__(self) -> torch.Tensor:
        self.buffer = self.tensor.to(self.device, copy=True).contiguous() if self.copy else self.tensor
        return self.buffer

    def __exit__(self, exc_type, *rest) -> None:
        if self.copy and exc_type is None:
            self.tensor.copy_(self.buffer)


def _on(device: torch.device):
    """Collectives run in worker threads: make the worker's GPU current there."""
    if device.type == "cuda":
        return torch.cuda.device(device)
    import contextlib

    return contextlib.nullcontext()


def _abort(pg) -> None:
    """Release a group's communicator (NCCL); gloo closes its sockets when dropped."""
    abort = getattr(pg, "abort", None)
    if callable(abort):
        try:
            abort()
        except RuntimeError:
            pass


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The worker's command-line arguments for its intra-host slot (peerd.core.intrahost.IntraHostSlot.argv)."""
    parser.add_argument("--intrahost", default="", metavar="DIR",
                        help="rendezvous directory of this daemon's workers of the job (set by the daemon)")
    parser.add_argument("--intrahost-rank", type=int, default=0, help="this worker's rank in the intra-host group")
    parser.add_argument("--intrahost-size", type=int, default=1, help="the daemon's workers of the job")


def from_args(args: argparse.Namespace, device: torch.device, me: str) -> IntraHostGroup | None:
    """The group the daemon asked for, or None (one worker, or no --intrahost)."""
    if not args.intrahost or args.intrahost_size < 2:
        return None
    try:
        return IntraHostGroup(IntraHostSlot(args.intrahost, args.intrahost_rank, args.intrahost_size), device, me)
    except (IntraHostError, ValueError) as exc:
        log.warning("no intra-host group: %s; the bulk lane carries the group stage", exc)
        return None
