"""A worker's stages and the one way it ends (peerd.core.lifecycle): the
transition table, walked over every path of events."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from peerd.core.lifecycle import TABLE, Event, Model, Outcome, Stage, outcome_of, step


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


def test_every_event_has_an_outcome_in_every_stage():
    for stage in Stage:
        for event in Event:
            move = step(stage, event)
            assert move is None or (move.to != stage and stage.may_enter(move.to)), (stage, event, move)
    # Every stage is reachable from JOINING, and every one but CLOSED can close.
    reached, frontier = {Stage.JOINING}, [Stage.JOINING]
    while frontier:
        stage = frontier.pop()
        for event in Event:
            if (move := step(stage, event)) is not None and move.to not in reached:
                reached.add(move.to)
                frontier.append(move.to)
    assert reached == set(Stage)
    assert all(step(s, Event.CLOSE) is not None for s in Stage if s != Stage.CLOSED)


def test_only_an_agreed_end_or_the_jobs_taken_model_finishes_with_a_model():
    into_finished = {event: move.model for (stage, event), move in TABLE.items() if move.to == Stage.FINISHED}
    with_model = {event for event, model in into_finished.items() if model != Model.NONE}
    assert with_model == {Event.AGREED, Event.TAKEN}
    assert all(move.model is None for move in TABLE.values() if move.to != Stage.FINISHED)
    # A worker that comes back after the end cannot train: TAKING leads only to FINISHED or CLOSED.
    assert {move.to for (stage, _), move in TABLE.items() if stage == Stage.TAKING} == {Stage.FINISHED,
                                                                                        Stage.CLOSED}


@given(st.lists(st.sampled_from(list(Event)), max_size=12))
def test_any_sequence_of_events_moves_forward_and_finishes_only_as_the_table_says(events):
    stage, models, seen = Stage.JOINING, [], [Stage.JOINING]
    for event in events:
        move = step(stage, event)
        if move is None:
            continue
        assert list(Stage).index(move.to) > list(Stage).index(stage) or move.to == Stage.CLOSED
        if move.to == Stage.FINISHED:
            models.append((stage, event, move.model))
        stage = move.to
        seen.append(stage)
    assert len(seen) == len(set(seen))  # each stage entered once
    assert len(models) <= 1
    for before, event, model in models:
        # Trained and agreed, or back after the end and took the job's: never a lone model otherwise.
        assert (before, event, model) in {
            (Stage.CONCLUDING, Event.AGREED, Model.CONSENSUS), (Stage.CONCLUDING, Event.TAKEN, Model.JOBS),
            (Stage.CONCLUDING, Event.NO_STEP, Model.NONE), (Stage.TAKING, Event.TAKEN, Model.JOBS),
            (Stage.TAKING, Event.NONE_TAKEN, Model.NONE)}
        if before == Stage.TAKING:
            assert Stage.TRAINING not in seen  # nothing trained alone after the job's end
