"""Suspicion from missed exchanges: a pure core driven with explicit time."""

import pytest

from peerd.core.suspicion import Suspicion


def test_consecutive_misses_suspect_a_peer_for_the_backoff():
    s = Suspicion(threshold=2, backoff_s=5.0)
    assert not s.record("b", answered=False, now=0.0)
    assert s.keep(["a", "b"], now=0.0) == ["a", "b"]
    assert s.record("b", answered=False, now=1.0)
    assert s.keep(["a", "b"], now=1.0) == ["a"]
    assert s.keep(["a", "b"], now=5.9) == ["a"]
    # Backoff over: tried again; one more miss suspects it again at once.
    assert s.keep(["a", "b"], now=6.0) == ["a", "b"]
    assert s.record("b", answered=False, now=6.1)
    assert s.keep(["a", "b"], now=6.2) == ["a"]


def test_an_answer_clears_the_count():
    s = Suspicion(threshold=2, backoff_s=5.0)
    s.record("b", answered=False, now=0.0)
    s.record("b", answered=True, now=1.0)
    assert not s.record("b", answered=False, now=2.0)
    assert not s.suspected("b", now=2.0)


def test_bad_settings_raise():
    with pytest.raises(ValueError):
        Suspicion(threshold=0)
    with pytest.raises(ValueError):
        Suspicion(backoff_s=0)
