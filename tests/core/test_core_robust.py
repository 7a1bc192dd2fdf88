"""peerd.core.robust: clipping a partner's pull to k × the recent median."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peerd.core.robust import PullClipper


def test_nothing_is_clipped_while_warming_up_or_when_off():
    clipper = PullClipper(factor=3.0, warmup=4)
    assert [clipper.scale(p) for p in (1.0, 100.0, 1.0, 1.0)] == [1.0] * 4
    off = PullClipper(factor=0.0)
    assert all(off.scale(p) == 1.0 for p in (1.0, 1e9, 1.0))


def test_a_huge_pull_is_scaled_to_k_times_the_median():
    clipper = PullClipper(factor=3.0, warmup=4)
    for p in (1.0, 1.2, 0.8, 1.0, 1.1):
        assert clipper.scale(p) == 1.0
    assert clipper.limit() == pytest.approx(3.0)
    assert clipper.scale(300.0) == pytest.approx(3.0 / 300.0)


def test_a_poisoner_cannot_raise_the_limit():
    clipper = PullClipper(factor=2.0, window=16, warmup=4)
    for _ in range(8):
        clipper.scale(1.0)
    for _ in range(100):  # every pull huge: each counts as the median, which stays put
        assert clipper.scale(1e6) == pytest.approx(2.0 / 1e6)
    assert clipper.limit() == pytest.approx(2.0)


@given(st.lists(st.floats(min_value=0, max_value=1e6, allow_subnormal=False), min_size=1, max_size=200),
       st.floats(0.5, 10))
@settings(max_examples=100, deadline=None)
def test_scales_are_in_zero_one_and_clipped_pulls_respect_the_limit(pulls, k):
    clipper = PullClipper(factor=k, window=32, warmup=4)
    for p in pulls:
        limit = clipper.limit()
        s = clipper.scale(p)
        assert 0 <= s <= 1
        assert p * s <= limit * (1 + 1e-9) + 1e-300 or math.isinf(limit)


def test_bad_values():
    with pytest.raises(ValueError):
        PullClipper(factor=-1)
    with pytest.raises(ValueError):
        PullClipper(factor=float("nan"))
    with pytest.raises(ValueError):
        PullClipper(factor=2).scale(float("inf"))
