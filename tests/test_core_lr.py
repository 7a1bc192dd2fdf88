"""LR smoothing on a changing global batch (Dynamic mini-batch SGD)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peerd.core.lr import ScaleRamp, cosine


def test_first_batch_sets_the_scale_without_a_ramp():
    ramp = ScaleRamp(reference_batch=64)
    assert not ramp.set_batch(128, step=0)
    assert ramp.scale(0) == 2.0


def test_doubling_ramps_linearly_over_T_times_k_steps():
    ramp = ScaleRamp(reference_batch=64, ramp_steps=8)
    ramp.set_batch(64, step=0)
    assert ramp.set_batch(128, step=100)
    # k = 2: 16 steps from 1.0 to 2.0.
    assert ramp.scale(100) == 1.0
    assert ramp.scale(108) == pytest.approx(1.5)
    assert ramp.scale(116) == 2.0
    assert ramp.scale(10_000) == 2.0


def test_halving_ramps_down_over_T_over_k_steps():
    ramp = ScaleRamp(reference_batch=64, ramp_steps=8)
    ramp.set_batch(128, step=0)
    ramp.set_batch(64, step=10)
    assert ramp.scale(10) == 2.0
    assert ramp.scale(18) == pytest.approx(1.5)
    assert ramp.scale(26) == 1.0


def test_a_change_during_a_ramp_starts_from_the_current_value():
    ramp = ScaleRamp(reference_batch=32, ramp_steps=8)
    ramp.set_batch(32, step=0)
    ramp.set_batch(64, step=0)  # 1 → 2 over 16 steps
    midway = ramp.scale(8)
    assert midway == pytest.approx(1.5)
    ramp.set_batch(32, step=8)  # back to 1, from 1.5
    assert ramp.scale(8) == pytest.approx(1.5)
    assert ramp.scale(24) == 1.0


def test_same_batch_again_changes_nothing():
    ramp = ScaleRamp(reference_batch=32)
    ramp.set_batch(96, step=0)
    assert not ramp.set_batch(96, step=5)
    assert ramp.scale(5) == 3.0


def test_reference_zero_turns_scaling_off():
    ramp = ScaleRamp(reference_batch=0)
    ramp.set_batch(32, 0)
    ramp.set_batch(320, 1)
    assert ramp.scale(1) == ramp.scale(1000) == 1.0


@given(st.lists(st.tuples(st.integers(1, 4096), st.integers(0, 50)), min_size=1, max_size=20),
       st.integers(1, 512))
@settings(max_examples=150, deadline=None)
def test_scale_moves_monotonically_between_start_and_target(changes, reference):
    ramp = ScaleRamp(reference_batch=reference)
    step = 0
    for batch, gap in changes:
        before = ramp.scale(step)
        ramp.set_batch(batch, step)
        target = batch / reference
        values = [ramp.scale(s) for s in range(step, step + gap + 1)]
        lo, hi = min(before, target), max(before, target)
        if ramp.batch and len(changes) > 1:
            assert all(lo - 1e-9 <= v <= hi + 1e-9 for v in values)
        assert all((b - a) * (target - before) >= -1e-12 for a, b in zip(values, values[1:]))
        step += gap
    # Eventually the scale is exactly the linear-scaling target.
    assert ramp.scale(step + 10**9) == changes[-1][0] / reference


def test_cosine_goes_from_one_to_zero():
    assert cosine(0.0) == 1.0 and cosine(1.0) == pytest.approx(0.0, abs=1e-12)
    assert cosine(0.5) == pytest.approx(0.5)
    assert cosine(2.0) == cosine(1.0) and cosine(-1.0) == 1.0


def test_bad_settings_raise():
    with pytest.raises(ValueError):
        ScaleRamp(reference_batch=-1)
    with pytest.raises(ValueError):
        ScaleRamp(reference_batch=32).set_batch(0, 0)
