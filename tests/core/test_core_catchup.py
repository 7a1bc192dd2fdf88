"""Stepping up to a partner's round (peerd.core.catchup)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from peerd.core.catchup import (
    STEP_UP_LOG_ROUNDS,
    TAKE_AGAIN_EVERY_S,
    TAKE_AGAIN_ROUNDS,
    TAKE_AGAIN_TIMES,
    StepUp,
    step_up,
    take_again,
)

FAST = settings(max_examples=200, deadline=None)


def test_a_worker_behind_a_partner_continues_from_the_round_before_the_partners():
    assert step_up(4, 9) == StepUp(8, logged=False)


def test_a_partner_one_round_ahead_leaves_the_round_as_it_is():
    assert step_up(4, 5) == StepUp(4, logged=False)


def test_nobody_ahead_means_no_step_up():
    assert step_up(4, 4) is None
    assert step_up(4, -1) is None  # no partner said where it is


def test_only_a_step_over_many_rounds_is_logged():
    assert not step_up(0, STEP_UP_LOG_ROUNDS).logged
    assert step_up(0, STEP_UP_LOG_ROUNDS + 1).logged


@FAST
@given(st.integers(0, 10_000), st.integers(-1, 10_000))
def test_it_never_goes_back_and_its_next_round_is_the_partners(own, ahead):
    up = step_up(own, ahead)
    if up is None:
        assert ahead <= own
    else:
        assert own <= up.round and up.round + 1 == ahead
        assert step_up(up.round, ahead) in (None, StepUp(up.round, False))  # stepping up again changes nothing


def test_a_newcomer_far_behind_before_any_exchange_takes_the_state_again():
    assert take_again(5, 5 + TAKE_AGAIN_ROUNDS + 1, exchanged=False, times=0, since_s=TAKE_AGAIN_EVERY_S) == 0.0


def test_a_worker_that_exchanged_keeps_its_model_and_steps_up():
    # the partition rule: rounds ahead say nothing about being right
    assert take_again(5, 500, exchanged=True, times=0, since_s=60.0) is None


def test_a_few_rounds_behind_is_the_transfers_own_lag_and_only_steps_up():
    assert take_again(5, 5 + TAKE_AGAIN_ROUNDS, exchanged=False, times=0, since_s=60.0) is None


def test_taking_it_again_waits_for_the_donors_to_hear_of_it_and_stops_after_a_few_times():
    assert take_again(5, 500, exchanged=False, times=0, since_s=0.1) == TAKE_AGAIN_EVERY_S - 0.1
    assert take_again(5, 500, exchanged=False, times=TAKE_AGAIN_TIMES, since_s=60.0) is None


@FAST
@given(st.integers(0, 10_000), st.integers(-1, 10_000), st.booleans(), st.integers(0, 10), st.floats(0, 100))
def test_taking_again_only_ever_replaces_a_step_up_over_many_rounds_and_waits_at_most_the_spacing(
        own, ahead, exchanged, times, since_s):
    wait_s = take_again(own, ahead, exchanged, times, since_s)
    if wait_s is not None:
        up = step_up(own, ahead)
        assert up is not None and up.logged and not exchanged
        assert 0.0 <= wait_s <= TAKE_AGAIN_EVERY_S
