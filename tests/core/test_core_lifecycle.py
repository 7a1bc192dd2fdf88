"""A worker's stages and the one way it ends (peerd.core.lifecycle)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from peerd.core.lifecycle import Outcome, Stage, outcome_of


def test_a_worker_that_trained_every_epoch_finishes():
    assert outcome_of(trained_out=True, left=False, asked_to_leave=False) == Outcome.FINISHED


def test_a_worker_that_left_at_a_round_has_left_or_was_stopped_whatever_its_epochs():
    assert outcome_of(trained_out=True, left=True, asked_to_leave=True) == Outcome.LEFT
    assert outcome_of(trained_out=True, left=True, asked_to_leave=False) == Outcome.STOPPED


def test_a_worker_stopped_before_its_epochs_were_done_was_stopped_unless_the_operator_asked():
    assert outcome_of(trained_out=False, left=False, asked_to_leave=False) == Outcome.STOPPED
    assert outcome_of(trained_out=False, left=False, asked_to_leave=True) == Outcome.LEFT


def test_the_outcomes_are_the_words_the_worker_reports():
    assert [str(o) for o in Outcome] == ["finished", "left", "stopped"]


def test_each_outcome_goes_forward_from_training_to_closed():
    for path in ((Stage.TRAINING, Stage.CONCLUDING, Stage.FINISHED, Stage.CLOSED),  # finished
                 (Stage.TRAINING, Stage.LEFT, Stage.CLOSED),  # left at a round
                 (Stage.JOINING, Stage.CLOSED), (Stage.TRAINING, Stage.CLOSED)):  # stopped
        assert all(a.may_enter(b) for a, b in zip(path, path[1:]))


def test_a_worker_that_left_can_only_close():
    assert Stage.LEFT.may_enter(Stage.CLOSED)
    assert not Stage.LEFT.may_enter(Stage.CONCLUDING) and not Stage.LEFT.may_enter(Stage.FINISHED)


@given(st.sampled_from(list(Stage)), st.sampled_from(list(Stage)))
def test_no_stage_is_entered_twice_nor_after_a_later_one(a, b):
    if a.may_enter(b):
        assert not b.may_enter(a) and a != b
    assert not Stage.CLOSED.may_enter(b)
