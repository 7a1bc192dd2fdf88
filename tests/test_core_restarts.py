"""The restart policy (peerd.core.restarts): pure, no loop, time as an argument."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from peerd.core.codes import ExitCode, WorkerState
from peerd.core.restarts import Backoff, RestartHistory, after_exit

BACKOFF = Backoff(1.0, 30.0)
crash_codes = st.integers(-64, 255).filter(lambda c: c not in (ExitCode.FINISHED, ExitCode.CONFIG))
backoffs = st.tuples(st.floats(0.01, 100), st.floats(1, 64)).map(lambda t: Backoff(t[0], t[0] * t[1]))
times = st.floats(0, 1e9)


def crashes(n: int, backoff: Backoff = BACKOFF, now: float = 0.0) -> list:
    history, actions = RestartHistory(), []
    for _ in range(n):
        action = after_exit(-9, False, history, backoff, now)
        actions.append(action)
        history, now = action.history, action.restart_at
    return actions


def test_a_crash_is_restarted_with_doubling_delays_up_to_the_maximum():
    assert [a.delay_s for a in crashes(7)] == [1, 2, 4, 8, 16, 30, 30]
    assert [a.history.restarts for a in crashes(3)] == [1, 2, 3]


@pytest.mark.parametrize("code, state", [(ExitCode.FINISHED, WorkerState.FINISHED),
                                         (ExitCode.CONFIG, WorkerState.FAILED)])
def test_a_finished_or_unloadable_worker_is_not_restarted(code, state):
    action = after_exit(code, False, RestartHistory(), BACKOFF, 5.0)
    assert (action.state, action.restarts, action.restart_at) == (state, False, None)


@given(st.integers(-64, 255), st.integers(0, 100), times)
def test_a_worker_asked_to_stop_stays_stopped_whatever_its_code(code, restarts, now):
    action = after_exit(code, True, RestartHistory(restarts, 4.0), BACKOFF, now)
    assert action.state == WorkerState.STOPPED and not action.restarts
    assert action.history == RestartHistory(restarts, 4.0)


@given(crash_codes, st.integers(1, 40), backoffs, times)
def test_every_crash_restarts_after_a_delay_within_the_bounds(code, n, backoff, now):
    history = RestartHistory()
    for _ in range(n):
        action = after_exit(code, False, history, backoff, now)
        assert action.restarts and action.state == WorkerState.RESTARTING
        assert backoff.first_s <= action.delay_s <= backoff.max_s
        assert action.restart_at == now + action.delay_s
        assert action.history.restarts == history.restarts + 1
        assert action.delay_s >= history.last_delay_s  # never shorter than the one before
        history, now = action.history, action.restart_at


@given(backoffs, st.integers(1, 40))
def test_delays_double_until_they_reach_the_maximum(backoff, n):
    delays = [a.delay_s for a in crashes(n, backoff)]
    assert delays[0] == backoff.first_s
    for before, after in zip(delays, delays[1:]):
        assert after == min(2 * before, backoff.max_s)


@given(crash_codes, times, times)
def test_the_decision_does_not_depend_on_the_clock_except_when(code, t1, t2):
    a, b = after_exit(code, False, RestartHistory(2, 4.0), BACKOFF, t1), after_exit(code, False, RestartHistory(2, 4.0), BACKOFF, t2)
    assert (a.state, a.delay_s, a.history) == (b.state, b.delay_s, b.history)
    assert a.restart_at - t1 == pytest.approx(b.restart_at - t2)


@pytest.mark.parametrize("first, most", [(0, 1), (-1, 1), (2, 1)])
def test_a_backoff_needs_a_positive_first_delay_no_longer_than_the_maximum(first, most):
    with pytest.raises(ValueError):
        Backoff(first, most)
