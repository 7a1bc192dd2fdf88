"""Stepping up to a partner's round (peerd.core.catchup)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from peerd.core.catchup import STEP_UP_LOG_ROUNDS, StepUp, step_up

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
