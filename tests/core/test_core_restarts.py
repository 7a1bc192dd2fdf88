"""The restart policy (peerd.core.restarts): pure, no loop, time as an argument;
a worker that crashes too often within a window is not restarted again."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from peerd.core.codes import ExitCode, WorkerState
from peerd.core.restarts import NO_LIMIT, Backoff, CrashLimit, RestartHistory, after_exit

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


# --- the crash limit ------------------------------------------------------------------------

LIMIT = CrashLimit(5, 600.0)
limits = st.builds(CrashLimit, st.integers(1, 8), st.floats(1, 1e4))


def crash_at(times: list[float], limit: CrashLimit, code: int = 1) -> list:
    """The actions for crashes at `times`, oldest first, until one is not restarted."""
    history, actions = RestartHistory(), []
    for now in times:
        action = after_exit(code, False, history, BACKOFF, now, limit)
        actions.append(action)
        history = action.history
        if not action.restarts:
            break
    return actions


def test_the_fifth_crash_within_ten_minutes_is_not_restarted():
    actions = crash_at([0, 10, 30, 70, 150, 300], LIMIT)
    assert [a.state for a in actions] == ["restarting"] * 4 + ["failed"]
    last = actions[-1]
    assert last.gave_up and not last.restarts and last.restart_at is None
    assert last.history.restarts == 4 and last.history.crashes == (0, 10, 30, 70, 150)


def test_crashes_further_apart_than_the_window_never_add_up():
    actions = crash_at([i * 601.0 for i in range(50)], LIMIT)
    assert all(a.restarts for a in actions) and len(actions) == 50
    assert all(len(a.history.crashes) == 1 for a in actions)  # the older ones are forgotten


def test_a_crash_that_leaves_the_window_no_longer_counts():
    # Four crashes in the first minute; the fifth comes 10 s after the first left the window.
    actions = crash_at([0, 20, 40, 60, 610], LIMIT)
    assert all(a.restarts for a in actions)
    assert actions[-1].history.crashes == (20, 40, 60, 610)
    assert not crash_at([0, 20, 40, 60, 610, 615], LIMIT)[-1].restarts  # the sixth: 5 within 600 s


def test_a_limit_of_one_restarts_nothing_and_no_limit_restarts_everything():
    assert crash_at([5.0], CrashLimit(1, 60.0))[0].gave_up
    actions = crash_at([float(i) for i in range(100)], NO_LIMIT)
    assert all(a.restarts for a in actions) and actions[-1].history.crashes == ()


@given(limits, st.lists(st.floats(0, 1e4), min_size=1, max_size=40))
def test_it_gives_up_exactly_at_the_first_crash_that_fills_the_window(limit, gaps):
    times, now = [], 0.0
    for gap in gaps:
        now += gap
        times.append(now)
    actions = crash_at(times, limit)
    # The reference: the first crash with max_crashes crashes (itself included) at most window_s before it.
    expected = next((i for i, t in enumerate(times)
                     if sum(1 for u in times[:i + 1] if t - u <= limit.window_s) >= limit.max_crashes), None)
    if expected is None:
        assert len(actions) == len(times) and all(a.restarts for a in actions)
    else:
        assert len(actions) == expected + 1 and all(a.restarts for a in actions[:-1])
        assert actions[-1].state == WorkerState.FAILED and actions[-1].gave_up
        assert len(actions[-1].history.crashes) == limit.max_crashes
    for action in actions:  # it remembers no more than the window holds
        assert len(action.history.crashes) <= limit.max_crashes
        assert all(action.history.crashes[-1] - t <= limit.window_s for t in action.history.crashes)


@given(limits, st.lists(st.integers(0, 100), min_size=1, max_size=20), st.integers(-10**6, 10**6))  # exact sums
def test_the_decisions_do_not_depend_on_where_the_clock_starts(limit, gaps, shift):
    times = [sum(gaps[:i + 1]) for i in range(len(gaps))]
    a = crash_at(times, limit)
    b = crash_at([t + shift for t in times], limit)
    assert [(x.state, x.delay_s, x.gave_up) for x in a] == [(x.state, x.delay_s, x.gave_up) for x in b]


@given(st.sampled_from([ExitCode.FINISHED, ExitCode.CONFIG]), st.booleans(), times)
def test_an_exit_that_is_no_crash_is_not_counted(code, stop_requested, now):
    history = RestartHistory(4, 8.0, (now - 3, now - 2, now - 1, now))
    action = after_exit(code, stop_requested, history, BACKOFF, now + 1, CrashLimit(5, 600.0))
    assert not action.gave_up and action.history == history
    stopped = after_exit(-9, True, history, BACKOFF, now + 1, CrashLimit(5, 600.0))  # asked to stop
    assert stopped.state == WorkerState.STOPPED and stopped.history == history


@pytest.mark.parametrize("most, window", [(-1, 60.0), (3, 0.0), (3, -5.0)])
def test_a_limit_needs_a_count_of_zero_or_more_and_a_positive_window(most, window):
    with pytest.raises(ValueError):
        CrashLimit(most, window)
