"""Where a (re)joining worker's state comes from: the running peers', its own
checkpoint, or the initial model (peerd.core.resume)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from peerd.core.resume import Attempt, Resume, Tried, donors, resume_action, trained

FAST = settings(max_examples=200, deadline=None)
DEADLINE = 30.0


def act(tried=Tried.NOTHING, serving=True, checkpoint=None, taken=None, now=0.0, ended=False) -> Resume:
    return resume_action(Attempt(tried, serving, checkpoint, taken, ended), now, DEADLINE)


def test_a_worker_beside_serving_peers_takes_their_state():
    assert act(serving=True) == Resume.PULL
    assert act(serving=True, checkpoint=(5, 50)) == Resume.PULL


def test_the_peers_state_taken_is_kept_unless_the_checkpoint_is_further_along():
    assert act(Tried.TOOK, taken=(7, 70)) == Resume.KEEP
    assert act(Tried.TOOK, checkpoint=(7, 70), taken=(7, 70)) == Resume.KEEP
    assert act(Tried.TOOK, checkpoint=(6, 90), taken=(7, 70)) == Resume.KEEP
    assert act(Tried.TOOK, checkpoint=(7, 71), taken=(7, 70)) == Resume.CHECKPOINT
    assert act(Tried.TOOK, checkpoint=(8, 0), taken=(7, 70)) == Resume.CHECKPOINT


def test_a_failed_pull_is_tried_again_after_a_heartbeat_until_the_deadline():
    assert act(Tried.FAILED, now=DEADLINE - 0.1) == Resume.WAIT
    assert act(Tried.WAITED, serving=True, now=DEADLINE - 0.1) == Resume.PULL


def test_at_the_deadline_a_worker_without_a_checkpoint_gives_up_rather_than_start_over_beside_the_peers():
    assert act(Tried.FAILED, now=DEADLINE) == Resume.GIVE_UP


def test_at_the_deadline_a_worker_with_a_checkpoint_resumes_from_it():
    assert act(Tried.FAILED, checkpoint=(3, 30), now=DEADLINE) == Resume.CHECKPOINT


def test_with_nobody_serving_a_worker_resumes_from_its_checkpoint_or_starts_fresh():
    assert act(serving=False, checkpoint=(3, 30)) == Resume.CHECKPOINT
    assert act(serving=False) == Resume.FRESH


def test_peers_that_stopped_serving_while_it_waited_leave_it_its_checkpoint_or_a_fresh_start():
    assert act(Tried.WAITED, serving=False, checkpoint=(3, 30)) == Resume.CHECKPOINT
    assert act(Tried.WAITED, serving=False) == Resume.FRESH


def test_once_members_finished_and_nobody_serves_a_worker_without_a_checkpoint_ends_instead_of_starting_over():
    # A newcomer that waited for the state of peers in their end consensus: they
    # finished and left meanwhile. Starting fresh would train the job alone.
    assert act(Tried.WAITED, serving=False, ended=True) == Resume.ENDED
    assert act(serving=False, ended=True) == Resume.ENDED
    assert act(Tried.WAITED, serving=False, checkpoint=(3, 30), ended=True) == Resume.CHECKPOINT
    assert act(Tried.WAITED, serving=True, ended=True) == Resume.PULL  # others still run it


def test_donors_are_the_serving_members_that_trained_else_every_serving_member():
    view = {"a": "A", "b": "B", "c": "C"}
    assert donors(view, "a", trained({"b": 3.0, "c": 0.0}, {})) == {"b": "B"}
    assert donors(view, "a", trained({}, {"c": 0.5})) == {"c": "C"}
    assert donors(view, "a", trained({"a": 9.0}, {})) == {"b": "B", "c": "C"}
    assert donors({"a": "A"}, "a", set()) == {}


positions = st.none() | st.tuples(st.integers(0, 20), st.integers(0, 200))
attempts = st.builds(Attempt, st.sampled_from(list(Tried)), st.booleans(), positions, positions, st.booleans())


@FAST
@given(attempts, st.floats(0, 2 * DEADLINE))
def test_a_worker_with_a_checkpoint_never_gives_up_nor_starts_fresh(attempt, now):
    if attempt.checkpoint is not None:
        assert resume_action(attempt, now, DEADLINE) not in (Resume.GIVE_UP, Resume.FRESH)


@FAST
@given(attempts, st.floats(0, 2 * DEADLINE))
def test_it_gives_up_only_after_a_failed_pull_at_the_deadline(attempt, now):
    if resume_action(attempt, now, DEADLINE) == Resume.GIVE_UP:
        assert attempt.tried == Tried.FAILED and now >= DEADLINE


@FAST
@given(attempts, st.floats(0, 2 * DEADLINE))
def test_it_starts_fresh_only_when_nobody_serves_and_never_right_after_a_failed_pull(attempt, now):
    if resume_action(attempt, now, DEADLINE) == Resume.FRESH:
        assert not attempt.serving and attempt.tried != Tried.FAILED and not attempt.ended


@FAST
@given(attempts, st.floats(0, 2 * DEADLINE))
def test_it_ends_without_training_only_when_the_job_ended_elsewhere_and_nothing_of_it_is_here(attempt, now):
    if resume_action(attempt, now, DEADLINE) == Resume.ENDED:
        assert attempt.ended and not attempt.serving and attempt.checkpoint is None


@FAST
@given(st.lists(st.tuples(st.booleans(), st.booleans(), st.integers(0, 20)), min_size=1, max_size=200), positions)
def test_carried_out_with_a_clock_that_moves_it_always_ends_and_ends_rightly(looks, checkpoint):
    """An executor as the engine's: each look at the view says whether peers
    serve, whether a pull would succeed and the round it would bring; a wait
    costs a heartbeat. It ends in KEEP, CHECKPOINT, GIVE_UP or FRESH, before
    the deadline is far behind."""
    now, tried, taken, seen = 0.0, Tried.NOTHING, None, 0
    serving, succeeds, round_ = looks[0]
    for _ in range(1000):
        action = resume_action(Attempt(tried, serving, checkpoint, taken), now, DEADLINE)
        if action == Resume.PULL:
            now += 0.1
            tried, taken = (Tried.TOOK, (round_, 0)) if succeeds else (Tried.FAILED, None)
        elif action == Resume.WAIT:
            now += 0.5
            seen += 1
            serving, succeeds, round_ = looks[min(seen, len(looks) - 1)]
            tried = Tried.WAITED
        else:
            break
    else:
        raise AssertionError("never ended")
    assert now < DEADLINE + 1
    if action == Resume.KEEP:
        assert checkpoint is None or checkpoint <= taken
    if action in (Resume.GIVE_UP, Resume.FRESH):
        assert checkpoint is None
    if action == Resume.FRESH:
        assert not serving
