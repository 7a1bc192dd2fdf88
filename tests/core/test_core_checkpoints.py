"""When a worker writes its next checkpoint (peerd.core.checkpoints)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from peerd.core.checkpoints import LastCheckpoint, checkpoint_due

FAST = settings(max_examples=200, deadline=None)


def test_a_process_writes_one_at_its_first_round():
    assert checkpoint_due(100, 0, LastCheckpoint(round=0, at=0.0, written=0), 1, 1.0)
    assert checkpoint_due(0, 60.0, LastCheckpoint(round=40, at=0.0, written=0), 41, 1.0)  # resumed at round 40


def test_then_one_every_so_many_rounds():
    last = LastCheckpoint(round=10, at=0.0, written=1)
    assert not checkpoint_due(5, 0, last, 14, 1e6)
    assert checkpoint_due(5, 0, last, 15, 0.0)


def test_or_one_every_so_many_seconds():
    last = LastCheckpoint(round=10, at=100.0, written=1)
    assert not checkpoint_due(0, 60.0, last, 1000, 159.9)
    assert checkpoint_due(0, 60.0, last, 11, 160.0)


def test_both_at_zero_means_never_not_even_at_the_first_round():
    assert not checkpoint_due(0, 0, LastCheckpoint(0, 0.0, 0), 1, 1e9)


rounds, seconds = st.integers(0, 50), st.floats(0, 600)


@FAST
@given(rounds, seconds, st.integers(0, 1000), st.floats(0, 1e4), st.integers(0, 3), st.integers(0, 1000),
       st.floats(0, 1e4))
def test_a_checkpoint_once_due_stays_due_as_rounds_and_time_go_on(every_rounds, every_s, last_round, at, written,
                                                                  later_rounds, later_s):
    last = LastCheckpoint(last_round, at, written)
    if checkpoint_due(every_rounds, every_s, last, last_round + 1, at + 1.0):
        assert checkpoint_due(every_rounds, every_s, last, last_round + 1 + later_rounds, at + 1.0 + later_s)


@FAST
@given(rounds, seconds, st.integers(0, 1000), st.floats(0, 1e4))
def test_none_is_due_in_the_round_and_at_the_time_one_was_written(every_rounds, every_s, round_, now):
    assert not checkpoint_due(every_rounds, every_s, LastCheckpoint(round_, now, 1), round_, now)
