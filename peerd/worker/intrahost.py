"""The intra-host tier: a daemon's workers of one job average their group stage
over torch.distributed (NCCL between GPUs, gloo on the CPU) instead of the bulk
lane (DESIGN §1.3; the decisions are in peerd.core.intrahost).

Rendezvous comes from the daemon: a FileStore in the rendezvous directory under
the job's directory on this host (`store-<generation>`), with the generation the
daemon writes there whenever it (re)starts one of the job's workers. No server to
start, no port to open: gloo listens on 127.0.0.1 only, and a FileStore is a file.

`intrahost_round` is hierarchical_round with its inner stage as collectives:

    agree       all_gather of (round, digest of the plan): all members go on
                together, or all fall back to hierarchical_round in this round
    stage 1     all_reduce(SUM) / g into the new state: every member holds the
                group mean of every segment (with one group, the whole round)
    stage 2     the owner of each segment fetches the partner group's stage 1 over
                the transport (gRPC / bulk lane, as today) and mixes
    all-gather  each mixed segment is broadcast from its owner

Owners publish stages 1 and 2 of their segments in the StageStore as
hierarchical_round does, so partner groups on other hosts, and a sibling that
fell back, read them as always. Returns None when the group cannot be used (not
formed yet, not this round's group, a disagreement, a failed collective): the
caller then runs hierarchical_round for the round.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import TypeVar

import torch
import torch.distributed as dist

from peerd.core.groups import GroupPlan
from peerd.core.intrahost import (
    AGREE,
    FORM,
    GENERATION_FILE,
    NOT_COVERING,
    USE,
    Decision,
    GroupState,
    IntraHostSlot,
    backend_for,
    covers,
    parse_generation,
    round_key,
    start_round,
    store_name,
)
from peerd.core.robust import PullClipper
from peerd.core.segments import Span
from peerd.errors import InvalidMessage, PeerdError, PeerUnavailable
from peerd.worker.codec import finite_by_sum
from peerd.worker.gossip import RoundResult, clip_pull, record_failure, relative_gap
from peerd.worker.snapshots import StageStore
from peerd.worker.transport import Transport

log = logging.getLogger("peerd.worker.intrahost")

COLLECTIVE_TIMEOUT_S = 30.0  # a member that does not take part in a collective by then has failed
FORM_TIMEOUT_S = 120.0  # every member must come to form the group by then (they start at different times)

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
        self._said = ""  # the last fallback reason logged (logged once per change)
        self._round = 0  # the round this worker is in, as the last poll saw it

    @property
    def directory(self) -> Path:
        return Path(self.slot.directory)

    def current_generation(self) -> int | None:
        try:
            return parse_generation((self.directory / GENERATION_FILE).read_text())
        except OSError:
            return None

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
        self.state.forming_started(generation, tag)
        self._forming = asyncio.create_task(self._form(generation, tag), name=f"intrahost-form-{generation}-{tag}")

    async def _form(self, generation: int, tag: str) -> None:
        started = time.monotonic()
        try:
            pg, start = await asyncio.to_thread(self._connect, generation, tag)
        except (RuntimeError, ValueError, OSError) as exc:  # DistBackendError, DistStoreError: timeouts, resets
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

    def _connect(self, generation: int, tag: str):
        """Blocking: form the group; its first collective proves it and gathers the
        members' rounds, which give the round it is used from."""
        files = dist.FileStore(str(self.directory / store_name(generation)), self.slot.size)
        files.set_timeout(self.form_timeout)
        store = dist.PrefixStore(f"{tag}/", files)
        rank, size = self.slot.rank, self.slot.size
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
        """A blocking collective in a thread (the event loop keeps serving partners);
        a failure breaks the group until the daemon writes a new generation."""
        try:
            return await asyncio.to_thread(fn, *args)
        except (RuntimeError, ValueError) as exc:
            generation = self.generation
            self.state.broke()
            self._drop()
            log.warning("intra-host group of generation %s failed: %s; the bulk lane carries the group stage "
                        "until the daemon re-forms it", generation, _short(exc))
            raise IntraHostError(f"intra-host collective failed: {_short(exc)}") from None

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


async def intrahost_round(
    group: IntraHostGroup,
    plan: GroupPlan,
    me: str,
    addresses: dict[str, str],
    vector: torch.Tensor,
    recv: torch.Tensor,
    layout: list[Span],
    transport: Transport,
    stages: StageStore,
    deadline_s: float,
    clipper: PullClipper | None = None,
    wire_dtype: torch.dtype = torch.float32,
    out: torch.Tensor | None = None,
) -> RoundResult | None:
    """hierarchical_round with the inner stage on the intra-host group (same
    arguments, same result); None: the group is not usable for this round, and
    `vector` (and `out`) are as they were, so the caller runs hierarchical_round."""
    del wire_dtype  # members get the owner's mix as exact fp32 over the group; only stage 1 crosses hosts
    started = time.monotonic()
    key = round_key(plan.round, plan.group, plan.owners, plan.sources) if covers(plan.group, group.members) \
        else NOT_COVERING
    if not await group.enter(plan.round, key):
        return None
    work = recv if out is None else out  # the new state; `vector` stays as it was until the round succeeds
    try:
        await group.run(group.mean_into_, vector, work)
    except IntraHostError:
        return None
    owned = plan.owned_by(me)
    others = [m for m in plan.group if m != me]
    partners = {plan.sources[s] for s in owned if plan.sources[s] is not None}
    result = RoundResult(plan.round, frozenset({*others, *partners}))
    result.reached.update(others)
    if len(plan.groups) > 1:
        await _cross_hosts(group, plan, me, addresses, vector, work, layout, transport, stages, deadline_s,
                           clipper, result, started)
    group.rounds += 1
    gaps = [relative_gap(vector[s.start : s.stop], work[s.start : s.stop]) for s in layout]
    result.disagreement = sum(gaps) / len(gaps)
    if out is None:
        vector.copy_(work)
    result.seconds = time.monotonic() - started
    return result


async def _cross_hosts(group: IntraHostGroup, plan: GroupPlan, me: str, addresses: dict[str, str],
                       vector: torch.Tensor, work: torch.Tensor, layout: list[Span], transport: Transport,
                       stages: StageStore, deadline_s: float, clipper: PullClipper | None, result: RoundResult,
                       started: float) -> None:
    """Stages 2 and 3: owners mix with the partner groups over the transport, then
    each mixed segment goes to the group by broadcast from its owner."""
    owned = plan.owned_by(me)
    await stages.begin(plan.round, owned)
    for s in owned:  # stage 1, for the partner groups' owners
        await stages.put(plan.round, 1, s, work[layout[s].start : layout[s].stop].clone())

    async def mix(s: int) -> None:
        span, source = layout[s], plan.sources[s]
        mean = work[span.start : span.stop]
        theirs = torch.empty(span.size)
        address = addresses.get(source)
        try:
            if address is None:
                raise PeerUnavailable(f"{source} has no address in this view")
            budget = max(0.0, started + deadline_s * 2 / 3 - time.monotonic())
            await asyncio.wait_for(transport.fetch_segment(address, plan.round, s, theirs, budget, 1), budget)
        except (PeerdError, TimeoutError) as exc:
            record_failure(result, source, plan.round, exc)
        else:
            result.reached.add(source)
            result.clipped += clip_pull(mean, theirs, clipper) < 1.0
            if finite_by_sum(theirs):  # the transport leaves stage 1 to the round (ROUND_CHECKED_STAGES)
                mean.mul_(1 - plan.weight).add_(theirs, alpha=plan.weight)
            else:
                record_failure(result, source, plan.round, InvalidMessage(
                    f"{source} sent non-finite values in stage 1 of segment {s}", "non_finite"))
        await stages.put(plan.round, 2, s, mean.clone())  # for a sibling that fell back

    await asyncio.gather(*(mix(s) for s in owned if plan.sources[s] is not None))
    mixed = [s for s in range(len(layout)) if plan.sources[s] is not None]
    for k, s in enumerate(mixed):  # the same order on every member
        span = layout[s]
        try:
            await group.run(group.broadcast_, work[span.start : span.stop], group.rank_of(plan.owners[s]))
        except IntraHostError:
            # A segment not (fully) received keeps this member's own value, as a miss does.
            for t in mixed[k:]:
                if plan.owners[t] != me:
                    work[layout[t].start : layout[t].stop].copy_(vector[layout[t].start : layout[t].stop])
                    result.misses += 1
            return


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
