"""peerd.core.relay and the relay half of peerd.core.membership: whom a daemon
Hellos, which account of a peer wins, and a realm of 64 views run round by round."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from peerd.core.relay import (
    detection_bound, hello_targets, relaying, settle_s, spread_intervals, suspect_after, view_timeout,
)
from peerd.core.membership import JobEntry, Membership, PeerRecord

FAST = settings(max_examples=80, deadline=None)


def rec(pid="b", inc=1, sv=1, seen=0.0, jobs=()) -> PeerRecord:
    return PeerRecord(pid, f"{pid}:9000", jobs=tuple(jobs), last_seen=seen, incarnation=inc, state_version=sv)


def job(round_: int) -> JobEntry:
    return JobEntry("j", "fp", "w:1", round_, "running")


# ----------------------------------------------------------- whom to Hello


@FAST
@given(n=st.integers(0, 200), fanout=st.integers(1, 8), mesh=st.integers(1, 20), seed=st.integers(0, 2**32))
def test_targets_are_every_peer_in_a_full_mesh_else_fanout_distinct_ones(n, fanout, mesh, seed):
    peers = [f"p{i}" for i in range(n)]
    targets = hello_targets(peers, fanout, mesh, random.Random(seed))
    if n + 1 <= mesh or n <= fanout:
        assert targets == peers
    else:
        assert len(targets) == fanout == len(set(targets)) and set(targets) <= set(peers)


def test_every_peer_is_drawn_over_intervals():
    rng, peers = random.Random(7), [f"p{i}" for i in range(63)]
    drawn = set()
    for _ in range(100):
        drawn.update(hello_targets(peers, 3, 8, rng))
    assert drawn == set(peers)


def test_the_full_mesh_keeps_todays_timeouts_and_relay_adds_log2_n_intervals():
    assert not relaying(7, 8) and relaying(8, 8)
    assert view_timeout(8, 6.0, 1.0, 8) == 6.0
    assert suspect_after(8, 1.0, 2.0, 8) == 4.0  # two missed Hellos and one Hello's timeout, as before
    assert [spread_intervals(n) for n in (9, 16, 64, 1000)] == [4, 4, 6, 10]
    assert view_timeout(64, 6.0, 1.0, 8) == 12.0 and view_timeout(1000, 6.0, 1.0, 8) == 16.0
    assert detection_bound(64, 6.0, 1.0, 2.0, 8) == 15.0
    assert detection_bound(8, 6.0, 1.0, 2.0, 8) == 9.0
    assert settle_s(8, 6.0, 1.0, 8) == settle_s(64, 6.0, 1.0, 8) == 6.0 and settle_s(1000, 6.0, 1.0, 8) == 10.0


# ------------------------------------------------------ which account wins


def test_a_newer_incarnation_replaces_an_older_one_never_the_reverse():
    m = Membership("a", 10.0)
    assert m.hear(rec(inc=1, sv=5, seen=1.0), now=1.0) == "new"
    assert m.hear(rec(inc=2, sv=1, seen=0.5), now=1.0) == "taken"  # a restart, even with older news
    assert m.hear(rec(inc=1, sv=9, seen=2.0), now=2.0) == ""
    assert (m.get("b").incarnation, m.get("b").state_version, m.get("b").last_seen) == (2, 1, 0.5)


def test_within_an_incarnation_the_highest_version_gives_content_and_the_latest_news_the_time():
    m = Membership("a", 10.0)
    m.hear(rec(sv=2, seen=5.0, jobs=[job(2)]), now=5.0)
    assert m.hear(rec(sv=1, seen=7.0, jobs=[job(1)]), now=7.0) == ""  # older content, fresher news
    assert (m.get("b").jobs[0].round, m.get("b").last_seen) == (2, 7.0)
    assert m.hear(rec(sv=3, seen=6.0, jobs=[job(3)]), now=7.0) == "taken"  # newer content, older news
    assert (m.get("b").jobs[0].round, m.get("b").last_seen) == (3, 7.0)


def test_news_older_than_the_timeout_and_news_of_oneself_are_refused():
    m = Membership("a", 10.0)
    assert m.hear(rec(seen=0.0), now=10.5) == ""
    assert m.hear(rec(pid="a", seen=10.0), now=10.5) == ""
    assert m.peers() == []


def test_a_peer_that_left_is_not_brought_back_by_relayed_records_of_that_start():
    m = Membership("a", 10.0)
    m.observe(rec(inc=1, seen=4.0))
    assert m.forget("b", now=5.0)
    assert m.hear(rec(inc=1, seen=4.5), now=6.0) == ""  # news from before it left
    assert m.merge("b", 1, 1, 4.5, 6.0, lambda: rec(inc=1, seen=4.5)) == ""
    assert m.hear(rec(inc=2, seen=5.5), now=6.0) == "new"  # restarted: a new start is news
    m.forget("b", now=7.0)
    m.observe(rec(inc=2, seen=8.0))  # the peer itself answering always counts
    assert m.get("b").last_seen == 8.0


def test_freshen_moves_only_the_time_of_the_incarnation_held():
    m = Membership("a", 10.0)
    assert not m.freshen("b", 1, 3.0)  # unknown: the caller asks it back
    m.observe(rec(inc=1, seen=1.0))
    assert m.freshen("b", 1, 3.0) and m.get("b").last_seen == 3.0
    assert not m.freshen("b", 2, 4.0) and m.get("b").last_seen == 3.0
    assert m.freshen("b", 1, 2.0) and m.get("b").last_seen == 3.0  # never backwards


def test_merge_reads_the_content_only_when_it_is_newer():
    m = Membership("a", 10.0)
    made = []

    def make(r):
        made.append(r)
        return r

    m.merge("b", 1, 2, 1.0, 1.0, lambda: make(rec(sv=2, seen=1.0)))
    m.merge("b", 1, 2, 2.0, 2.0, lambda: make(rec(sv=2, seen=2.0)))
    m.merge("b", 1, 1, 3.0, 3.0, lambda: make(rec(sv=1, seen=3.0)))
    assert len(made) == 1 and m.get("b").last_seen == 3.0


@FAST
@given(st.lists(st.tuples(st.integers(1, 3), st.integers(0, 5), st.floats(0, 20)), min_size=1, max_size=30),
       st.randoms(use_true_random=False))
def test_merge_order_does_not_change_the_result(news, rng):
    """Relayed records arrive in any order: the view ends the same (the highest start, its
    highest version, its latest news)."""
    def run(order):
        m = Membership("a", 100.0)
        for inc, sv, seen in order:
            m.merge("b", inc, sv, seen, 20.0, lambda: rec(inc=inc, sv=sv, seen=seen))  # noqa: B023
        r = m.get("b")
        return r.incarnation, r.state_version, r.last_seen
    shuffled = list(news)
    rng.shuffle(shuffled)
    top = max(inc for inc, _, _ in news)
    want = (top, max(sv for inc, sv, _ in news if inc == top), max(s for inc, _, s in news if inc == top))
    assert run(news) == run(shuffled) == want


# ------------------------------------------------ a realm of 64, round by round


class Realm:
    """N views relaying as the daemons do (peerd.daemon.hello): each interval each
    live daemon Hellos `fanout` random peers; the callee freshens the caller, the
    caller takes the callee's own record first-hand and its records of the others
    with their news' times; then each view expires."""

    def __init__(self, n: int, seed: int, fanout: int = 3, timeout_s: float = 6.0) -> None:
        self.ids = [f"d{i}" for i in range(n)]
        self.live = set(self.ids)
        self.rng = random.Random(seed)
        self.fanout = fanout
        t = view_timeout(n, timeout_s, 1.0, 8)
        self.views = {d: Membership(d, t) for d in self.ids}
        self.expired: list[tuple[float, str, str]] = []

    def step(self, now: float) -> None:
        for d in sorted(self.live):
            others = [p for p in self.ids if p != d]
            for t in hello_targets(others, self.fanout, 8, self.rng):
                if t not in self.live:
                    continue
                self.views[t].freshen(d, 1, now)
                self.views[d].observe(rec(pid=t, seen=now))
                for r in self.views[t].peers():
                    self.views[d].merge(r.peer_id, r.incarnation, r.state_version, r.last_seen, now, lambda: r)  # noqa: B023
        for d in sorted(self.live):
            self.expired += [(now, d, p) for p in self.views[d].expire(now)]

    def complete(self) -> bool:
        return all({r.peer_id for r in self.views[d].peers()} == self.live - {d} for d in self.live)


def test_64_views_fill_within_log_n_intervals_keep_every_live_peer_and_drop_a_dead_one_within_the_bound():
    n, realm = 64, Realm(64, seed=3)
    filled = next(t for t in range(1, 30) if (realm.step(float(t)) or realm.complete()))
    assert filled <= spread_intervals(n)
    for t in range(filled + 1, 80):
        realm.step(float(t))
    assert realm.expired == [] and realm.complete()  # no live peer ever timed out
    realm.live.discard("d0")
    died = 80.0
    bound = detection_bound(n, 6.0, 1.0, 0.0, 8)
    for t in range(80, 80 + int(bound) + 10):
        realm.step(float(t))
    assert {d for _, d, p in realm.expired if p == "d0"} == realm.live  # every view dropped it ...
    assert max(at for at, _, p in realm.expired if p == "d0") <= died + bound  # ... within the bound
    assert all(p == "d0" for _, _, p in realm.expired) and realm.complete()  # once, and nobody else
