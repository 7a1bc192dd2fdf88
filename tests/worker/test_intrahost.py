"""The intra-host tier: a daemon's workers averaging their group stage over
torch.distributed (gloo here; NCCL on GPUs), with the daemon's rendezvous,
generations, and the fall back to the bulk lane.

Tiers: the pure decisions (peerd.core.intrahost); groups of worker threads in one
event loop over real gloo (each thread its own process group, one FileStore),
compared with hierarchical_round; then separate processes with kill -9 of one
and the group re-formed under a new generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import queue
import signal
import time

import pytest
import torch

from peerd.core.groups import plan_hierarchical
from peerd.core.intrahost import (
    AGREE,
    FALLBACK,
    FORM,
    NOT_COVERING,
    USE,
    Decision,
    GroupState,
    MAX_REBUILDS,
    STORE_IDLE_S,
    IntraHostSlot,
    backend_for,
    covers,
    round_key,
    stale_stores,
    start_round,
    wanted,
)
from peerd.core.segments import split_even
from peerd.control.rendezvous import Rendezvous, advance
from peerd.worker.round.hierarchy import hierarchical_round
from peerd.worker.intrahost.group import IntraHostGroup
from peerd.worker.intrahost.round import intrahost_round
from peerd.worker.round.overlap import round_exchange
from peerd.worker.round.context import RoundBuffers, RoundContext, RoundInputs
from peerd.worker.wire.stores import Identity, SegmentServer, SnapshotStore, StageStore
from peerd.worker.wire.transport import MemoryTransport

NUMEL = 4_099
SEGMENTS = 6


# --- the pure decisions ----------------------------------------------------------------


def test_a_group_forms_for_each_new_generation_and_a_failed_one_is_not_retried():
    state = GroupState()
    assert state.decide(None, 5).action == FALLBACK  # nothing from the daemon yet
    assert state.decide(1, 5) == Decision(FORM, "generation 1", "0")
    state.forming_started(1, "0")
    assert "forming" in state.decide(1, 5).reason
    state.forming_done(1, "0", True, start=7)
    assert "used from round 7" in state.decide(1, 6).reason  # every member knows it is up by then
    assert state.decide(1, 7).action == AGREE
    state.broke()  # a collective failed (a sibling died)
    assert "failed" in state.decide(1, 8).reason
    assert state.decide(2, 8).action == FORM  # the daemon restarted it: generation 2
    state.forming_started(2, "0")
    state.forming_done(1, "0", True)  # a late answer for an old generation changes nothing
    assert state.formed is None
    state.forming_done(2, "0", False)
    assert state.decide(2, 9).action == FALLBACK and state.decide(3, 9).action == FORM


def test_the_agreement_goes_on_falls_back_or_re_forms_alike_on_every_member():
    state = GroupState(formed=(3, "0"), start=0)
    key = round_key(9, ["a", "b"], ["a", "b"], [None, None])
    assert state.agreement([(9, key), (9, key)]).action == USE
    assert "not the daemon's workers" in state.agreement([(9, key), (9, NOT_COVERING)]).reason
    assert "differ" in state.agreement([(9, key), (9, key + 4)]).reason
    # One member stepped over a round: the same new tag on every member, from the same keys.
    assert state.agreement([(9, key), (12, 5)]) == Decision(FORM, "members in rounds 9..12: out of step", "0.12")
    assert start_round([4, 9, 8]) == 11


def test_slots_members_and_plan_keys():
    slot = IntraHostSlot("/run/x", 1, 3)
    assert slot.argv() == ["--intrahost", "/run/x", "--intrahost-rank", "1", "--intrahost-size", "3"]
    assert slot.members("peer-a.1") == ["peer-a.0", "peer-a.1", "peer-a.2"]
    with pytest.raises(ValueError):
        slot.members("peer-a.2")
    with pytest.raises(ValueError):
        IntraHostSlot("/run/x", 3, 3)
    assert covers(("a.1", "a.0"), ["a.0", "a.1"]) and not covers(("a.0",), ["a.0", "a.1"])
    assert not covers(("a",), ["a"])  # one worker: no group to form
    assert backend_for("cuda") == "nccl" and backend_for("cpu") == "gloo"
    assert wanted(("cuda:0", "cuda:1"), "hierarchical") and wanted(("cpu", "cpu"), "hierarchical")
    assert not wanted(("cuda:0",), "hierarchical") and not wanted(("cpu", "cpu"), "crossover")
    assert not wanted(("cpu", "cuda:0"), "hierarchical") and not wanted(("auto", "auto"), "hierarchical")
    key = round_key(3, ["a", "b"], ["a", "b"], [None, "c"])
    assert key != round_key(4, ["a", "b"], ["a", "b"], [None, "c"])
    assert key != round_key(3, ["a", "b"], ["a", "b"], ["d", "c"])
    assert 0 < key < 2**62 and key != NOT_COVERING
    idle = {"store-1": STORE_IDLE_S, "store-3": 1e6, "store-x": 1e6, "generation": 1e6, "store-2": 1e6,
            "store-0": STORE_IDLE_S - 1}  # store-0: written lately, so maybe still in use
    assert stale_stores(idle, 3) == ["store-1", "store-2"]


def test_the_daemon_bumps_the_generation_and_removes_old_stores_nobody_uses(tmp_path):
    r = Rendezvous(tmp_path / "job", 2)
    assert r.generation == 0
    for name in ("store-1", "store-2"):
        (r.directory / name).write_text("")
    long_ago = time.time() - STORE_IDLE_S
    os.utime(r.directory / "store-1", (long_ago, long_ago))
    assert r.bump() == 1 and r.bump() == 2 and r.bump() == 3
    # store-2 was written lately: a member may still be forming generation 2 there.
    assert sorted(os.listdir(r.directory)) == ["generation", "generation.lock", "store-2"]
    assert Rendezvous(tmp_path / "job", 2).bump() == 4  # a restarted daemon goes on from the file
    assert r.slot(1) == IntraHostSlot(str(r.directory), 1, 2)


def test_a_store_still_in_use_outlives_the_next_generation(tmp_path):
    # Two members checking in to generation 1 when the daemon writes generation 2
    # (a sibling restarts): each keeps checking in until its next round shows it the
    # new generation. Had the bump removed the file, the next write would create it
    # anew, and a FileStore reads on from where it was in the old one (stale counts,
    # then a loop forever holding the GIL once the new file outgrows that place).
    r = Rendezvous(tmp_path / "job", 3)
    assert r.bump() == 1
    path = str(r.directory / "store-1")
    a, b = (torch.distributed.PrefixStore("0/", torch.distributed.FileStore(path, 3)) for _ in range(2))
    assert a.add("arrived", 1) == 1 and b.add("arrived", 1) == 2
    assert r.bump() == 2
    assert a.add("arrived", 0) == 2 and b.add("arrived", 0) == 2
    assert a.add("checked", 5) == 5 and b.add("checked", 0) == 5  # each sees the other's writes


# --- groups of worker threads over real gloo --------------------------------------------


class Member:
    def __init__(self, peer_id: str, vector: torch.Tensor) -> None:
        self.id = peer_id
        self.identity = Identity("job", "fp", peer_id)
        self.vector = vector.clone()
        self.store = SnapshotStore(NUMEL)
        self.stages = StageStore()
        self.server = SegmentServer(self.identity, self.store, SEGMENTS, 500, self.stages)
        self.layout = split_even(NUMEL, SEGMENTS)
        self.recv = torch.empty(NUMEL)

    def context(self, group, transport=None) -> RoundContext:
        """One host's group alone: nothing crosses hosts (no partner to reach)."""
        return RoundContext(self.id, self.layout, transport or MemoryTransport(self.identity, {}), self.stages,
                            intrahost=group)

    def inputs(self, plan) -> RoundInputs:
        return RoundInputs(plan, {}, RoundBuffers(self.vector, self.recv, 5.0))


def members(view: dict[str, tuple]) -> dict[str, Member]:
    gen = torch.Generator().manual_seed(2)
    return {p: Member(p, torch.randn(NUMEL, generator=gen)) for p in sorted(view)}


# Two hosts with two workers each; group size 2: a daemon's workers are a group.
VIEW = {f"{d}.{k}": ("", f"host-{d}", d) for d in ("ha", "hb") for k in range(2)}


async def form(tmp_path, daemon: str, size: int = 2, timeout_s: float = 10.0) -> dict[str, IntraHostGroup]:
    """The daemon's rendezvous and one IntraHostGroup per worker, formed while the
    workers are in round 0: used from round 2."""
    rendezvous = Rendezvous(tmp_path / daemon, size)
    rendezvous.bump()
    groups = {f"{daemon}.{k}": IntraHostGroup(rendezvous.slot(k), torch.device("cpu"), f"{daemon}.{k}",
                                              timeout_s=timeout_s, form_timeout_s=timeout_s) for k in range(size)}
    assert all(g.poll(0).action == FALLBACK for g in groups.values())  # forming starts in the background
    await formed(groups)
    assert all(g.state.start == 2 and g.poll(2).action == AGREE for g in groups.values())
    return groups


async def formed(groups) -> None:
    await asyncio.wait_for(asyncio.gather(*(g._forming for g in groups.values())), 60)
    assert all(g.state.formed is not None for g in groups.values())


async def run_round(peers, view, round_, groups=None, hand_over=False, size=2):
    """Every member's round: on its intra-host group when it has one (falling back
    to hierarchical_round when that says None), else hierarchical_round."""
    servers = {f"mem-{p}": m.server for p, m in peers.items()}
    addresses = {p: f"mem-{p}" for p in view}
    used = {}

    async def one(m: Member):
        into = await m.store.hand_over(round_, m.vector) if hand_over else None
        if into is None:
            await m.store.publish(round_, m.vector)
        plan = plan_hierarchical("job", round_, view, m.id, SEGMENTS, size)
        transport = MemoryTransport(m.identity, servers)
        ctx = RoundContext(m.id, m.layout, transport, m.stages, intrahost=(groups or {}).get(m.id))
        inputs = RoundInputs(plan, addresses, RoundBuffers(m.vector, m.recv, 60.0, into))
        result = await intrahost_round(ctx, inputs)
        used[m.id] = result is not None
        if result is None:
            result = await hierarchical_round(ctx, inputs)
        if into is not None:
            m.vector = into
        return result

    results = await asyncio.gather(*(one(m) for m in peers.values()))
    return dict(zip(peers, results)), used


async def close(groups):
    for g in groups.values():
        await g.aclose()


@pytest.mark.parametrize("hand_over", [False, True])
async def test_the_group_stage_on_gloo_gives_what_the_bulk_lane_gives(tmp_path, hand_over):
    """Two hosts × two workers: the inner stage as all-reduce and broadcast, the
    cross-host stage over the transport; every member ends where
    hierarchical_round (all over the transport) puts it."""
    plain, tiered = members(VIEW), members(VIEW)
    groups = {**await form(tmp_path, "ha"), **await form(tmp_path, "hb")}
    try:
        for round_ in (10, 11):
            await run_round(plain, VIEW, round_)
            results, used = await run_round(tiered, VIEW, round_, groups, hand_over)
            assert all(used.values())
            assert all(r.misses == 0 for r in results.values())
            for p in VIEW:
                torch.testing.assert_close(tiered[p].vector, plain[p].vector, rtol=1e-6, atol=1e-6)
        # Siblings agree exactly: the owner's mix reached them over the group.
        assert torch.equal(tiered["ha.0"].vector, tiered["ha.1"].vector)
        assert all(g.rounds == 2 for g in groups.values())
    finally:
        await close(groups)


async def test_an_overlapped_round_runs_its_group_stage_on_the_group_too(tmp_path):
    """[gossip] overlap: the exchange that runs in the background (on the published
    snapshot, into `out`) takes the intra-host tier like a round run now."""
    plain, tiered = members(VIEW), members(VIEW)
    groups = {**await form(tmp_path, "ha"), **await form(tmp_path, "hb")}

    async def overlapped(peers, round_, with_groups):
        servers = {f"mem-{p}": m.server for p, m in peers.items()}
        addresses = {p: f"mem-{p}" for p in VIEW}

        async def one(m: Member):
            await m.store.publish(round_, m.vector)
            plan = plan_hierarchical("job", round_, VIEW, m.id, SEGMENTS, 2)
            ctx = RoundContext(m.id, m.layout, MemoryTransport(m.identity, servers), m.stages,
                               intrahost=groups[m.id] if with_groups else None)
            out = torch.empty(NUMEL)
            result = await round_exchange(ctx, plan, addresses)(RoundBuffers(m.vector, m.recv, 5.0, out))
            assert result.misses == 0
            return out

        outs = await asyncio.gather(*(one(m) for m in peers.values()))
        for m, out in zip(peers.values(), outs):
            m.vector = out

    try:
        for round_ in (10, 11):
            await overlapped(plain, round_, False)
            await overlapped(tiered, round_, True)
            for p in VIEW:
                torch.testing.assert_close(tiered[p].vector, plain[p].vector, rtol=1e-6, atol=1e-6)
        assert all(g.rounds == 2 for g in groups.values())
    finally:
        await close(groups)


async def test_one_host_on_its_group_and_one_without_interoperate(tmp_path):
    """Host hb has no intra-host group (an older daemon, or its group failed): its
    workers run hierarchical_round and read ha's stages as always."""
    plain, tiered = members(VIEW), members(VIEW)
    groups = await form(tmp_path, "ha")
    try:
        await run_round(plain, VIEW, 10)
        results, used = await run_round(tiered, VIEW, 10, groups)
        assert used == {"ha.0": True, "ha.1": True, "hb.0": False, "hb.1": False}
        assert all(r.misses == 0 for r in results.values())
        for p in VIEW:
            torch.testing.assert_close(tiered[p].vector, plain[p].vector, rtol=1e-6, atol=1e-6)
    finally:
        await close(groups)


async def test_a_single_group_is_one_all_reduce_to_the_exact_mean(tmp_path):
    view = {f"h.{k}": ("", "host", "h") for k in range(3)}
    peers = members(view)
    mean = torch.stack([m.vector for m in peers.values()]).mean(0)
    groups = await form(tmp_path, "h", size=3)
    try:
        results, used = await run_round(peers, view, 10, groups, hand_over=True, size=3)
        assert all(used.values()) and all(r.misses == 0 and not r.errors for r in results.values())
        for m in peers.values():
            torch.testing.assert_close(m.vector, mean)
    finally:
        await close(groups)


async def test_views_that_differ_fall_back_together_and_stay_in_step(tmp_path):
    """h.2 is missing from its siblings' views for a round: their round's group is
    not the daemon's workers, so all three fall back (h.2 too, though its own view
    is whole), nothing of the group breaks, and the next round uses it again."""
    full = {f"h.{k}": ("", "host", "h") for k in range(3)}
    partial = {p: full[p] for p in ("h.0", "h.1")}
    groups = await form(tmp_path, "h", size=3)
    peers = members(full)
    try:
        async def one(p, view, round_):
            m = peers[p]
            plan = plan_hierarchical("job", round_, view, p, SEGMENTS, 3)
            before = m.vector.clone()
            got = await intrahost_round(m.context(groups[p]), m.inputs(plan))
            if got is None:
                assert torch.equal(m.vector, before)  # nothing written: the caller's fallback starts clean
            return got is not None

        views = {"h.0": partial, "h.1": partial, "h.2": full}
        assert await asyncio.gather(*(one(p, views[p], 10) for p in full)) == [False] * 3
        assert all(g.state.formed is not None for g in groups.values())
        assert await asyncio.gather(*(one(p, full, 11) for p in full)) == [True] * 3
    finally:
        await close(groups)


async def test_a_member_that_stepped_over_a_round_makes_the_group_re_form_in_step(tmp_path):
    view = {f"h.{k}": ("", "host", "h") for k in range(2)}
    groups = await form(tmp_path, "h")
    peers = members(view)
    try:
        async def one(p, round_):
            m = peers[p]
            plan = plan_hierarchical("job", round_, view, p, SEGMENTS, 2)
            return await intrahost_round(m.context(groups[p]), m.inputs(plan)) is not None

        # h.1 caught up to a partner's round: 14 where h.0 is in 10.
        assert await asyncio.gather(one("h.0", 10), one("h.1", 14)) == [False, False]
        assert {g.state.forming for g in groups.values()} == {(1, "0.14")}
        await formed(groups)
        assert {g.state.start for g in groups.values()} == {16}  # h.1 was in 14
        assert await asyncio.gather(one("h.0", 16), one("h.1", 16)) == [True, True]
    finally:
        await close(groups)


# --- separate processes: kill -9 of one, the group re-formed -----------------------------


def _member(directory: str, rank: int, size: int, commands, replies, timeout_s: float = 5.0,
            form_timeout_s: float = 30.0) -> None:
    """A worker of the test's "daemon": a round per command, its result replied."""
    torch.set_num_threads(1)
    me = f"h.{rank}"
    view = {f"h.{k}": ("", "host", "h") for k in range(size)}

    async def main() -> None:
        group = IntraHostGroup(IntraHostSlot(directory, rank, size), torch.device("cpu"), me,
                               timeout_s=timeout_s, form_timeout_s=form_timeout_s)
        m = Member(me, torch.full((NUMEL,), float(rank)))
        transport = MemoryTransport(m.identity, {})
        while True:
            command = await asyncio.to_thread(commands.get)
            if command is None:
                break
            kind, round_, *pause = command
            if kind == "ready":  # poll (no collective) until the group of the current generation is up
                group.poll(round_)
                replies.put((rank, "ready", group.state.formed is not None, group.generation))
                continue
            if kind == "leave":  # done here, the process still up (the job's end, a drain): out of the group
                await group.aclose()
                replies.put((rank, "left"))
                continue
            if pause:  # a member that stalls (a long GC pause, swapping) before its round
                await asyncio.sleep(pause[0])
            m.vector.fill_(float(rank))
            plan = plan_hierarchical("job", round_, view, me, SEGMENTS, size)
            result = await intrahost_round(m.context(group, transport), m.inputs(plan))
            replies.put((rank, "round", result is not None, float(m.vector.mean())))
        await group.aclose()

    asyncio.run(main())


class Members:
    """The test's stand-in for a daemon: it starts the processes and bumps the generation."""

    def __init__(self, directory, size: int, timeout_s: float = 5.0, form_timeout_s: float = 30.0) -> None:
        self.timeouts = (timeout_s, form_timeout_s)  # the members' collective and forming timeouts (gloo's too)
        self.ctx = multiprocessing.get_context("spawn")
        self.rendezvous = Rendezvous(directory, size)
        self.size = size
        # One reply queue per member: a member killed while its queue's feeder
        # thread held the write lock of a shared queue would block the others' replies.
        self.replies: dict[int, multiprocessing.Queue] = {}
        self.procs: dict[int, multiprocessing.Process] = {}
        self.commands: dict[int, multiprocessing.Queue] = {}

    def start(self, rank: int) -> None:
        self.rendezvous.bump()  # as the daemon does before it (re)starts a worker
        self.commands[rank], self.replies[rank] = self.ctx.Queue(), self.ctx.Queue()
        self.procs[rank] = self.ctx.Process(target=_member, daemon=True, args=(
            str(self.rendezvous.directory), rank, self.size, self.commands[rank], self.replies[rank],
            *self.timeouts))
        self.procs[rank].start()

    def ask(self, command, ranks) -> dict[int, tuple]:
        return self.ask_each({r: command for r in ranks})

    def ask_each(self, commands: dict[int, tuple]) -> dict[int, tuple]:
        for r, command in commands.items():
            self.commands[r].put(command)
        got = {}
        deadline = time.monotonic() + 120
        for r in commands:  # every member's answer is awaited, so a failure names exactly the silent ones
            try:
                rank, _, *rest = self.replies[r].get(timeout=max(0.0, deadline - time.monotonic()))
                got[rank] = tuple(rest)
            except queue.Empty:
                pass
        if len(got) < len(commands):
            alive = {r: self.procs[r].is_alive() for r in commands if r not in got}
            pytest.fail(f"no answer to {commands} from {alive} (member: alive) within 120 s; answers: {got}")
        return got

    def wait_formed(self, ranks, round_: int) -> int:
        """Poll every member as in `round_` until each has the current generation's group up."""
        for _ in range(600):
            got = self.ask(("ready", round_), ranks)
            generations = {g for _, g in got.values()}
            if all(ok for ok, _ in got.values()) and generations == {self.rendezvous.generation}:
                return generations.pop()
            asyncio.run(asyncio.sleep(0.1))
        pytest.fail("the group never formed")

    def close(self) -> None:
        for r, p in self.procs.items():
            if p.is_alive():
                self.commands[r].put(None)
        for p in self.procs.values():
            p.join(20)
            if p.is_alive():
                p.kill()
                p.join(5)
        for q in (*self.commands.values(), *self.replies.values()):
            q.close()
            q.cancel_join_thread()


RANKS = [0, 1, 2]


@contextlib.contextmanager
def formed_group(directory, **timeouts):
    """Three members, formed and averaged once (round 10: the mean of 0, 1 and 2);
    yields them and the generation they formed. Every process is gone after."""
    m = Members(directory, 3, **timeouts)
    try:
        for r in RANKS:
            m.start(r)
        first = m.wait_formed(RANKS, 8)  # formed while in round 8: used from round 10
        assert m.ask(("round", 10), RANKS) == {r: (True, 1.0) for r in RANKS}
        yield m, first
    finally:
        m.close()
    assert all(not p.is_alive() for p in m.procs.values())


def test_kill_9_of_a_member_falls_back_then_the_new_generation_re_forms(tmp_path):
    with formed_group(tmp_path / "job") as (m, first):
        os.kill(m.procs[2].pid, signal.SIGKILL)
        m.procs[2].join(10)
        # The survivors' collective fails (reset or timeout): both fall back, values untouched.
        assert m.ask(("round", 11), [0, 1]) == {0: (False, 0.0), 1: (False, 1.0)}
        # ... and stay on the bulk lane, without waiting for the dead one again.
        assert m.ask(("round", 12), [0, 1]) == {0: (False, 0.0), 1: (False, 1.0)}

        m.start(2)  # the daemon restarts it under a new generation
        second = m.wait_formed(RANKS, 12)
        assert second > first
        assert m.ask(("round", 14), RANKS) == {r: (True, 1.0) for r in RANKS}


def test_a_member_that_leaves_the_group_alive_lets_the_others_fall_back_at_once(tmp_path):
    # Timeouts the test would never see the end of (ask_each gives up after 120 s):
    # the others must fall back because the member left, not time out.
    with formed_group(tmp_path / "job", timeout_s=3600.0, form_timeout_s=3600.0) as (m, _):
        assert m.ask(("leave", 0), [2]) == {2: ()}  # its process stays up, as in the end consensus
        assert m.ask(("round", 11), [0, 1]) == {0: (False, 0.0), 1: (False, 1.0)}
        assert m.procs[2].is_alive()


def test_a_member_stalled_past_the_timeout_is_taken_back_without_a_restart(tmp_path):
    with formed_group(tmp_path / "job") as (m, first):
        # Member 2 comes to round 11 after the collective timeout (5 s): every member
        # falls back for the round, each keeping its own values; nobody crashes.
        got = m.ask_each({0: ("round", 11), 1: ("round", 11), 2: ("round", 11, 8.0)})
        assert got == {0: (False, 0.0), 1: (False, 1.0), 2: (False, 2.0)}
        # The members moved the generation on themselves (no daemon restarted anyone)
        # and form again, all three.
        assert m.wait_formed(RANKS, 12) == first + 1 == m.rendezvous.generation
        assert m.ask(("round", 14), RANKS) == {r: (True, 1.0) for r in RANKS}


def test_a_member_silent_in_its_group_costs_the_others_one_collective_timeout(tmp_path):
    # Forming may wait an hour here; a collective only 2 s. A member alive but silent
    # (it never comes to the round's collective) costs the others that collective's
    # timeout, not the forming's, and the group re-forms with it afterwards.
    with formed_group(tmp_path / "job", timeout_s=2.0, form_timeout_s=3600.0) as (m, _):
        assert m.ask(("round", 11), [0, 1]) == {0: (False, 0.0), 1: (False, 1.0)}  # 2 is alive, and silent
        assert m.ask(("round", 11), [2]) == {2: (False, 2.0)}
        m.wait_formed(RANKS, 12)  # the first to notice moved the generation on
        assert m.ask(("round", 14), RANKS) == {r: (True, 1.0) for r in RANKS}


def test_a_broken_group_moves_the_generation_on_a_bounded_number_of_times():
    state = GroupState()
    assert state.rebuild() is None  # nothing broke
    for generation in range(1, MAX_REBUILDS + 2):
        state.forming_started(generation, "0")
        state.forming_done(generation, "0", True, start=2)
        state.broke()
        expected = generation if generation <= MAX_REBUILDS else None
        assert state.rebuild() == expected


def test_only_the_first_member_of_a_broken_group_moves_the_generation(tmp_path):
    r = Rendezvous(tmp_path / "job", 3)
    assert r.bump() == 1
    assert advance(r.directory, past=1) == 2  # the first member to notice
    assert advance(r.directory, past=1) == 2  # the second finds it moved
    assert r.bump() == 3  # a restart always moves it


def test_the_worker_takes_its_slot_from_the_command_line_the_daemon_writes(tmp_path):
    import argparse

    from peerd.worker.intrahost.group import add_arguments, from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    slot = Rendezvous(tmp_path / "job", 2).slot(1)
    group = from_args(parser.parse_args(slot.argv()), torch.device("cpu"), "peer-a.1")
    assert group is not None and group.slot == slot and group.members == ["peer-a.0", "peer-a.1"]
    assert group.backend == "gloo" and group.poll(0).action == FALLBACK  # no generation written yet
    assert from_args(parser.parse_args([]), torch.device("cpu"), "peer-a") is None  # one worker: today's path
    assert from_args(parser.parse_args(slot.argv()), torch.device("cpu"), "peer-a.0") is None  # wrong rank: logged


async def test_a_poisoned_stage_1_from_the_partner_host_is_refused_by_the_group_owner(tmp_path):
    """The transport leaves stage 1 to the round (ROUND_CHECKED_STAGES): the
    cross-host mix on the group checks it, and keeps the group mean."""
    from hierarchy_helpers import PoisonedStages

    tiered = members(VIEW)
    for p in ("hb.0", "hb.1"):
        tiered[p].stages = tiered[p].server.stages = PoisonedStages(1)
    groups = await form(tmp_path, "ha")
    try:
        results, used = await run_round(tiered, VIEW, 10, groups)
        assert used["ha.0"] and used["ha.1"]
        for p in ("ha.0", "ha.1"):
            assert torch.isfinite(tiered[p].vector).all()
            assert any("non-finite" in e for e in results[p].errors.values()), results[p].errors
    finally:
        await close(groups)
