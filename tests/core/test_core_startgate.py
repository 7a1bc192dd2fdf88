"""The start gate: a fresh worker waits for [job] min_peers members, joins a
running job, and gives up after the start timeout."""

from hypothesis import given, strategies as st

from peerd.core.startgate import Start, StartGate


def test_a_worker_alone_waits_for_the_members_the_job_wants():
    gate = StartGate(3, 60.0)
    assert gate.action("a", ["a", "b"], [], 1.0) == Start.WAIT
    assert gate.describe("a", ["a", "b"]) == "2 of 3 members ready"


def test_the_job_begins_when_enough_members_are_ready():
    assert StartGate(3, 60.0).action("a", ["b", "c"], [], 1.0) == Start.BEGIN


def test_a_member_that_trained_means_the_job_runs_so_a_newcomer_joins_it():
    assert StartGate(3, 60.0).action("a", ["a", "b"], ["b"], 1.0) == Start.JOIN
    assert StartGate(1, 60.0).action("a", ["a", "b"], ["b"], 0.0) == Start.JOIN


def test_its_own_progress_is_not_a_running_job():
    assert StartGate(2, 60.0).action("a", ["a"], ["a"], 1.0) == Start.WAIT


def test_after_the_timeout_with_too_few_members_it_gives_up():
    assert StartGate(3, 60.0).action("a", ["a", "b"], [], 60.0) == Start.GIVE_UP


def test_one_member_begins_at_once():
    assert StartGate(1, 60.0).action("a", [], [], 0.0) == Start.BEGIN


@given(st.integers(1, 8), st.sets(st.sampled_from("abcdefgh")), st.floats(0, 100))
def test_it_never_begins_with_fewer_members_than_asked(n, members, waited):
    action = StartGate(n, 50.0).action("a", members, [], waited)
    assert (action == Start.BEGIN) == (len(members | {"a"}) >= n)
