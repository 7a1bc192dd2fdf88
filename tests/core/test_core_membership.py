"""peerd.core.membership: the view a daemon builds from Hello replies."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peerd.core.membership import JobEntry, Membership, PeerRecord, liveness

FAST = settings(max_examples=60, deadline=None)


def job(name="mnist", fp="fp1", addr="10.0.0.1:7000", round_=0, state="running") -> JobEntry:
    return JobEntry(name=name, spec_fingerprint=fp, worker_address=addr, round=round_, state=state)


def peer(pid, *jobs, last_seen=0.0, address=None) -> PeerRecord:
    return PeerRecord(peer_id=pid, address=address or f"{pid}:9000", jobs=tuple(jobs), last_seen=last_seen)


# ----------------------------------------------------------------- JobEntry


@pytest.mark.parametrize(
    "entry, serving",
    [
        (job(), True),
        (job(addr=""), False),
        (job(state="starting"), False),
        (job(state="stopped"), False),
        (job(state="failed"), False),
        (job(state="Running"), False),
    ],
)
def test_job_entry_serving(entry, serving):
    assert entry.serving is serving


# ------------------------------------------------------ observe/forget/get


def test_observe_new_then_update():
    m = Membership(me="me", timeout_s=10.0)
    assert m.observe(peer("a", last_seen=1.0)) is True
    assert m.observe(peer("a", last_seen=2.0)) is False
    assert m.get("a").last_seen == 2.0
    assert [r.peer_id for r in m.peers()] == ["a"]


def test_observe_replaces_whole_record():
    m = Membership(me="me", timeout_s=10.0)
    m.observe(peer("a", job("x")))
    m.observe(peer("a", job("y"), address="new:1"))
    rec = m.get("a")
    assert rec.address == "new:1"
    assert [e.name for e in rec.jobs] == ["y"]


def test_observing_itself_is_ignored():
    m = Membership(me="me", timeout_s=10.0)
    assert m.observe(peer("me", job())) is False
    assert m.observe(peer("me", job())) is False
    assert m.peers() == []
    assert m.get("me") is None
    assert m.job_view("mnist", "fp1") == []
    assert m.jobs() == {}


def test_forget():
    m = Membership(me="me", timeout_s=10.0)
    m.observe(peer("a"))
    assert m.forget("a") is True
    assert m.forget("a") is False
    assert m.forget("never") is False
    assert m.get("a") is None
    assert m.peers() == []
    # A forgotten peer is new again when heard from.
    assert m.observe(peer("a")) is True


def test_get_unknown_is_none():
    assert Membership(me="me", timeout_s=1.0).get("x") is None


def test_peers_sorted_by_id():
    m = Membership(me="me", timeout_s=10.0)
    for pid in ["c", "a", "b", "aa"]:
        m.observe(peer(pid))
    assert [r.peer_id for r in m.peers()] == ["a", "aa", "b", "c"]


def test_separate_instances_do_not_share_state():
    a = Membership(me="me", timeout_s=1.0)
    b = Membership(me="me", timeout_s=1.0)
    a.observe(peer("x"))
    assert b.peers() == []


# ------------------------------------------------------------------- expire


def test_expire_boundaries():
    m = Membership(me="me", timeout_s=10.0)
    m.observe(peer("old", last_seen=0.0))
    m.observe(peer("edge", last_seen=5.0))
    m.observe(peer("fresh", last_seen=14.0))
    # now - last_seen == timeout is kept; strictly more is dropped.
    assert m.expire(now=15.0) == ["old"]
    assert [r.peer_id for r in m.peers()] == ["edge", "fresh"]
    assert m.expire(now=15.0) == []
    assert sorted(m.expire(now=100.0)) == ["edge", "fresh"]
    assert m.peers() == []


def test_expire_refreshed_peer_survives():
    m = Membership(me="me", timeout_s=10.0)
    m.observe(peer("a", last_seen=0.0))
    m.observe(peer("a", last_seen=20.0))
    assert m.expire(now=25.0) == []
    assert m.get("a") is not None


def test_expire_removes_from_job_view_and_jobs():
    m = Membership(me="me", timeout_s=5.0)
    m.observe(peer("a", job(), last_seen=0.0))
    m.observe(peer("b", job(addr="b:7000"), last_seen=10.0))
    assert m.expire(now=10.0) == ["a"]
    assert m.job_view("mnist", "fp1") == [("b", "b:7000")]
    assert m.jobs() == {("mnist", "fp1"): ["b"]}


@given(
    st.dictionaries(
        st.text(alphabet="abcdefgh", min_size=1, max_size=4),
        st.floats(min_value=0.0, max_value=1000.0),
        max_size=20,
    ),
    st.floats(min_value=0.1, max_value=100.0),
    st.floats(min_value=0.0, max_value=1200.0),
)
@FAST
def test_expire_property(seen, timeout, now):
    m = Membership(me="me", timeout_s=timeout)
    for pid, t in seen.items():
        m.observe(peer(pid, last_seen=t))
    dead = m.expire(now)
    assert sorted(dead) == sorted(p for p, t in seen.items() if now - t > timeout)
    assert len(dead) == len(set(dead))
    assert {r.peer_id for r in m.peers()} == {p for p, t in seen.items() if now - t <= timeout}
    # Idempotent at the same time.
    assert m.expire(now) == []


# ----------------------------------------------------------------- job_view


def test_job_view_filters():
    m = Membership(me="me", timeout_s=10.0)
    m.observe(peer("ok", job(addr="ok:1")))
    m.observe(peer("other-fp", job(fp="fp2", addr="o:1")))
    m.observe(peer("other-job", job(name="cifar", addr="c:1")))
    m.observe(peer("no-addr", job(addr="")))
    m.observe(peer("starting", job(state="starting", addr="s:1")))
    m.observe(peer("stopped", job(state="stopped", addr="t:1")))
    m.observe(peer("no-jobs"))
    m.observe(peer("ok2", job(name="cifar", addr="x:1"), job(addr="ok2:1")))
    m.observe(peer("me", job(addr="me:1")))  # ignored: it is us
    assert m.job_view("mnist", "fp1") == [("ok", "ok:1"), ("ok2", "ok2:1")]
    assert m.job_view("mnist", "fp2") == [("other-fp", "o:1")]
    assert m.job_view("cifar", "fp1") == [("ok2", "x:1"), ("other-job", "c:1")]
    assert m.job_view("nope", "fp1") == []


def test_job_view_uses_worker_address_not_daemon_address():
    m = Membership(me="me", timeout_s=10.0)
    m.observe(peer("a", job(addr="10.0.0.2:7001"), address="10.0.0.2:9000"))
    assert m.job_view("mnist", "fp1") == [("a", "10.0.0.2:7001")]


def test_job_view_follows_updates():
    m = Membership(me="me", timeout_s=10.0)
    m.observe(peer("a", job(state="starting", addr="a:1")))
    assert m.job_view("mnist", "fp1") == []
    m.observe(peer("a", job(state="running", addr="a:1")))
    assert m.job_view("mnist", "fp1") == [("a", "a:1")]
    m.observe(peer("a", job(state="stopped", addr="a:1")))
    assert m.job_view("mnist", "fp1") == []


names = st.sampled_from(["mnist", "cifar"])
fps = st.sampled_from(["fp1", "fp2"])
states = st.sampled_from(["starting", "running", "restarting", "stopped", "failed"])
addrs = st.sampled_from(["", "h:1", "h:2"])
entries = st.builds(JobEntry, name=names, spec_fingerprint=fps, worker_address=addrs, round=st.integers(0, 5), state=states)
records = st.builds(
    PeerRecord,
    peer_id=st.sampled_from(["me", "a", "b", "c", "d", "e"]),
    address=st.just("x:9000"),
    jobs=st.lists(entries, max_size=3).map(tuple),
    last_seen=st.just(0.0),
)


@given(st.lists(records, max_size=12), names, fps)
@FAST
def test_job_view_property(recs, name, fp):
    m = Membership(me="me", timeout_s=10.0)
    latest = {}
    for r in recs:
        m.observe(r)
        if r.peer_id != "me":
            latest[r.peer_id] = r
    view = m.job_view(name, fp)
    expected = []
    for pid in sorted(latest):  # the first serving entry of each member id (here: the peer's own)
        serving = [e for e in latest[pid].jobs
                   if e.name == name and e.spec_fingerprint == fp and e.worker_address and e.state == "running"]
        if serving:
            expected.append((pid, serving[0].worker_address))
    assert view == expected
    assert all(pid != "me" for pid, _ in view)
    assert all(addr for _, addr in view)
    assert [p for p, _ in view] == sorted(p for p, _ in view)


# --------------------------------------------------------------------- jobs


def test_jobs_aggregation():
    m = Membership(me="me", timeout_s=10.0)
    m.observe(peer("b", job(), job(name="cifar", state="starting", addr="")))
    m.observe(peer("a", job()))
    m.observe(peer("c", job(fp="fp2")))
    m.observe(peer("d", job(state="stopped")))
    m.observe(peer("e", job(state="failed"), job(name="cifar")))
    m.observe(peer("me", job()))
    assert m.jobs() == {
        ("mnist", "fp1"): ["a", "b"],
        ("mnist", "fp2"): ["c"],
        ("cifar", "fp1"): ["b", "e"],
    }


def test_jobs_empty():
    m = Membership(me="me", timeout_s=10.0)
    assert m.jobs() == {}
    m.observe(peer("a"))
    m.observe(peer("b", job(state="stopped")))
    assert m.jobs() == {}


@given(st.lists(records, max_size=12))
@FAST
def test_jobs_property(recs):
    m = Membership(me="me", timeout_s=10.0)
    latest = {}
    for r in recs:
        m.observe(r)
        if r.peer_id != "me":
            latest[r.peer_id] = r
    expected: dict = {}
    for pid in sorted(latest):
        for e in latest[pid].jobs:
            if e.state in ("starting", "running", "restarting"):
                ids = expected.setdefault((e.name, e.spec_fingerprint), [])
                if pid not in ids:  # a peer is listed once per job
                    ids.append(pid)
    assert m.jobs() == expected
    for ids in m.jobs().values():
        assert ids == sorted(ids)
        assert "me" not in ids
    # Every peer in a job view is also listed by jobs().
    for (name, fp), ids in m.jobs().items():
        assert {p for p, _ in m.job_view(name, fp)} <= set(ids)


def test_job_speeds_of_the_members_with_the_same_spec():
    m = Membership("me", 10.0)
    fast = JobEntry("mnist", "fp1", "a:1", 0, "running", speed=400.0, local_batch=47, share=0.37)
    m.observe(peer("a", fast))
    m.observe(peer("b", JobEntry("mnist", "fp1", "", 0, "starting")))  # no measurement yet: NaN
    m.observe(peer("c", JobEntry("mnist", "fp2", "c:1", 0, "running", speed=9.0)))  # another spec
    m.observe(peer("d", JobEntry("mnist", "fp1", "d:1", 0, "finished", speed=9.0)))  # no longer in it
    speeds = m.job_speeds("mnist", "fp1")
    assert set(speeds) == {"a", "b"} and speeds["a"] == 400.0 and speeds["b"] != speeds["b"]


def test_a_daemon_with_several_workers_lists_each_as_a_member():
    m = Membership("me", 10.0)
    m.observe(PeerRecord("a", "a:9000", "rack-1", jobs=(
        JobEntry("mnist", "fp1", "a:1", 0, "running", speed=10.0, member="a.0"),
        JobEntry("mnist", "fp1", "", 0, "starting", member="a.1"),
        JobEntry("mnist", "fp1", "a:3", 0, "stopped", member="a.0"),  # a repeated member: the first counts
    )))
    m.observe(peer("b", job(addr="b:1")))
    assert m.job_view("mnist", "fp1") == [("a.0", "a:1"), ("b", "b:1")]
    assert [(w.daemon, w.locality) for w in m.job_workers("mnist", "fp1")] == [("a", "rack-1"), ("b", "")]
    assert m.job_members("mnist", "fp1") == ["a.0", "a.1", "b"]
    assert set(m.job_speeds("mnist", "fp1")) == {"a.0", "a.1", "b"}
    assert m.jobs() == {("mnist", "fp1"): ["a", "b"]}  # daemons, for peerctl jobs and join by name


def test_a_peer_not_heard_from_past_the_bound_is_suspected():
    peers = [PeerRecord("a", "a:1", last_seen=10.0), PeerRecord("b", "b:1", last_seen=6.0)]
    assert liveness(peers, now=12.0, suspect_after_s=4.0) == {"a": "alive", "b": "suspected"}
    assert liveness(peers, now=10.0, suspect_after_s=4.0) == {"a": "alive", "b": "alive"}  # at the bound: alive


def test_job_finished_lists_only_members_that_reached_the_end_of_that_spec():
    m = Membership("me", 10.0)
    m.observe(peer("a", job(state="finished", addr="")))
    m.observe(peer("b", job(state="failed", addr=""), job(name="other", state="finished")))
    m.observe(peer("c", job(state="stopped", addr=""), job(fp="fp2", state="finished")))
    m.observe(peer("d", job()))
    assert m.job_finished("mnist", "fp1") == ["a"]
    assert m.job_members("mnist", "fp1") == ["d"]
