"""LR for a changing global batch: the scaling law, its cap and the ramp (Dynamic mini-batch SGD)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peerd.core.lr import (
    DEFAULT_LAW, DEFAULT_MAX_SCALE, DEFAULT_RAMP_STEPS, LAWS, ScaleRamp, cosine, ramp_length, scale_for,
)

LINEAR = dict(law="linear", max_scale=math.inf)  # the rule before the capped laws: k, uncapped
ratios = st.floats(1e-4, 1e4, allow_nan=False)
caps = st.one_of(st.just(math.inf), st.floats(1.0, 1e3))
laws = st.sampled_from(LAWS)


# ------------------------------------------------------------------ the law and its cap

def test_each_law_at_k_4():
    assert scale_for(4, "linear", math.inf) == 4.0
    assert scale_for(4, "sqrt", math.inf) == 2.0
    assert scale_for(4, "none", math.inf) == 1.0
    assert scale_for(0.25, "linear", math.inf) == 0.25 and scale_for(0.25, "sqrt", math.inf) == 0.5


def test_the_cap_clamps_both_ways():
    assert scale_for(8, "linear", 4) == 4.0
    assert scale_for(1 / 8, "linear", 4) == 0.25
    assert scale_for(64, "sqrt", 4) == 4.0 and scale_for(9, "sqrt", 4) == 3.0


def test_defaults_are_the_swept_ones():
    assert (DEFAULT_LAW, DEFAULT_MAX_SCALE, DEFAULT_RAMP_STEPS) == ("sqrt", 2.0, 8)
    ramp = ScaleRamp(reference_batch=128)
    assert (ramp.law, ramp.max_scale, ramp.ramp_steps) == (DEFAULT_LAW, DEFAULT_MAX_SCALE, DEFAULT_RAMP_STEPS)


@pytest.mark.parametrize("bad", [dict(law="cubic"), dict(max_scale=0.5), dict(max_scale=float("nan"))])
def test_bad_law_or_cap_raise(bad):
    with pytest.raises(ValueError):
        scale_for(2.0, **{"law": "sqrt", "max_scale": 4.0, **bad})
    with pytest.raises(ValueError):
        ScaleRamp(64, **bad)


@pytest.mark.parametrize("k", [0.0, -1.0, float("nan")])
def test_a_non_positive_ratio_raises(k):
    with pytest.raises(ValueError):
        scale_for(k, "linear", 4.0)


@given(ratios, laws, caps)
def test_the_multiplier_never_leaves_the_cap(k, law, cap):
    m = scale_for(k, law, cap)
    assert 1 / cap <= m <= cap


@given(ratios, laws, caps)
def test_the_law_is_symmetric_in_log_space(k, law, cap):
    assert scale_for(k, law, cap) * scale_for(1 / k, law, cap) == pytest.approx(1.0)


@given(ratios, ratios, laws, caps)
def test_the_multiplier_grows_with_the_batch(a, b, law, cap):
    lo, hi = sorted((a, b))
    assert scale_for(lo, law, cap) <= scale_for(hi, law, cap)


# ------------------------------------------------------------------ the ramp

def test_first_batch_sets_the_scale_without_a_ramp():
    ramp = ScaleRamp(reference_batch=64, **LINEAR)
    assert not ramp.set_batch(128, step=0)
    assert ramp.scale(0) == 2.0


def test_doubling_ramps_linearly_over_T_times_k_steps():
    ramp = ScaleRamp(reference_batch=64, ramp_steps=8, **LINEAR)
    ramp.set_batch(64, step=0)
    assert ramp.set_batch(128, step=100)
    # k = 2: 16 steps from 1.0 to 2.0.
    assert ramp.scale(100) == 1.0
    assert ramp.scale(108) == pytest.approx(1.5)
    assert ramp.scale(116) == 2.0
    assert ramp.scale(10_000) == 2.0


def test_halving_ramps_down_over_T_over_k_steps():
    ramp = ScaleRamp(reference_batch=64, ramp_steps=8, **LINEAR)
    ramp.set_batch(128, step=0)
    ramp.set_batch(64, step=10)
    assert ramp.scale(10) == 2.0
    assert ramp.scale(18) == pytest.approx(1.5)
    assert ramp.scale(26) == 1.0


def test_sqrt_with_cap_ramps_over_the_multiplier_ratio():
    ramp = ScaleRamp(reference_batch=128, ramp_steps=8, law="sqrt", max_scale=2.0)
    ramp.set_batch(128, step=0)
    assert ramp.set_batch(128 * 16, step=10)  # √16 = 4, capped at 2: 2× the multiplier, 16 steps
    assert ramp.scale(18) == pytest.approx(1.5)
    assert ramp.scale(26) == 2.0


def test_a_change_the_cap_hides_starts_no_ramp():
    ramp = ScaleRamp(reference_batch=100, ramp_steps=8, law="linear", max_scale=2.0)
    ramp.set_batch(400, step=0)
    assert not ramp.set_batch(800, step=5)  # 4 and 8 both clamp to 2
    assert ramp.scale(5) == 2.0
    none = ScaleRamp(reference_batch=100, law="none")
    none.set_batch(100, 0)
    assert not none.set_batch(3200, 1) and none.scale(1) == 1.0


def test_a_change_during_a_ramp_starts_from_the_current_value():
    ramp = ScaleRamp(reference_batch=32, ramp_steps=8, **LINEAR)
    ramp.set_batch(32, step=0)
    ramp.set_batch(64, step=0)  # 1 → 2 over 16 steps
    midway = ramp.scale(8)
    assert midway == pytest.approx(1.5)
    ramp.set_batch(32, step=8)  # back to 1, from 1.5: T · 1.5 = 12 steps
    assert ramp.scale(8) == pytest.approx(1.5)
    assert ramp.scale(14) == pytest.approx(1.25)
    assert ramp.scale(20) == 1.0


def test_a_join_that_lands_in_two_steps_still_ramps_the_whole_way():
    # 4 → 28 → 32 peers of 32 samples (the simulator's 4 → 32 join lands over two
    # rounds). A ramp that the second, small change (k = 8/7) restarted with
    # T·8/7 ≈ 10 steps from ~1.1 to 8 would make the LR jump after all.
    ramp = ScaleRamp(reference_batch=128, ramp_steps=8, **LINEAR)
    ramp.set_batch(128, 0)
    ramp.set_batch(28 * 32, 16)
    ramp.set_batch(32 * 32, 17)
    assert ramp.scale(27) < 2.5  # 10 steps later, still early in the ramp
    assert ramp_length(ramp.scale(17), 8.0, 8) > 56


def test_same_batch_again_changes_nothing():
    ramp = ScaleRamp(reference_batch=32, **LINEAR)
    ramp.set_batch(96, step=0)
    assert not ramp.set_batch(96, step=5)
    assert ramp.scale(5) == 3.0


def test_reference_zero_turns_scaling_off():
    ramp = ScaleRamp(reference_batch=0)
    ramp.set_batch(32, 0)
    ramp.set_batch(320, 1)
    assert ramp.scale(1) == ramp.scale(1000) == 1.0


def test_ramp_length_is_T_times_the_multiplier_ratio():
    assert ramp_length(1.0, 1.0, 8) == 0
    assert ramp_length(1.0, 4.0, 8) == ramp_length(4.0, 1.0, 8) == 32
    assert ramp_length(2.0, 3.0, 8) == 12
    assert ramp_length(1.0, 4.0, 0) == 0


changes = st.lists(st.tuples(st.integers(1, 4096), st.integers(0, 50)), min_size=1, max_size=20)


@given(changes, st.integers(1, 512), laws, caps, st.integers(0, 64))
@settings(max_examples=150, deadline=None)
def test_scale_moves_monotonically_between_start_and_target(changes, reference, law, cap, t):
    ramp = ScaleRamp(reference_batch=reference, ramp_steps=t, law=law, max_scale=cap)
    step = 0
    for batch, gap in changes:
        before = ramp.scale(step)
        ramp.set_batch(batch, step)
        target = scale_for(batch / reference, law, cap)
        values = [ramp.scale(s) for s in range(step, step + gap + 1)]
        if step > 0 or batch != changes[0][0]:
            lo, hi = min(before, target), max(before, target)
            assert all(lo - 1e-9 <= v <= hi + 1e-9 for v in values)
        assert all((b - a) * (target - before) >= -1e-12 for a, b in zip(values, values[1:]))
        assert all(1 / cap - 1e-12 <= v <= cap + 1e-12 for v in values)
        step += gap
    # The ramp reaches its target, exactly, and stays there.
    final = scale_for(changes[-1][0] / reference, law, cap)
    assert ramp.scale(step + 10**9) == final


@given(st.integers(1, 512), st.integers(1, 64), st.integers(1, 32), laws, caps, st.integers(0, 64),
       st.integers(0, 400))
@settings(max_examples=150, deadline=None)
def test_a_join_then_the_matching_leave_returns_to_the_starting_lr(per_peer, peers, joiners, law, cap, t, gap):
    ramp = ScaleRamp(reference_batch=per_peer * peers, ramp_steps=t, law=law, max_scale=cap)
    ramp.set_batch(per_peer * peers, 0)
    start = ramp.scale(0)
    ramp.set_batch(per_peer * (peers + joiners), 10)
    ramp.set_batch(per_peer * peers, 10 + gap)  # they leave, mid-ramp or after it
    assert ramp.scale(10 + gap + 10**6) == start == 1.0


@given(st.integers(1, 4096), st.integers(1, 4096), st.integers(1, 512), laws, caps, st.integers(0, 64))
@settings(max_examples=150, deadline=None)
def test_the_ramp_reaches_its_target_within_T_times_the_ratio(a, b, reference, law, cap, t):
    ramp = ScaleRamp(reference_batch=reference, ramp_steps=t, law=law, max_scale=cap)
    ramp.set_batch(a, 0)
    old, new = ramp.scale(0), scale_for(b / reference, law, cap)
    ramp.set_batch(b, 100)
    length = ramp_length(old, new, t)  # ⌈T·max(r, 1/r)⌉, up to the last bit of rounding
    assert old == new or abs(length - t * max(new / old, old / new)) < 1 + 1e-6
    end = 100 + length
    assert ramp.scale(end) == new
    if end > 101:  # not there a step early, unless old and new are a rounding apart (a cap of 1 + ε)
        assert ramp.scale(end - 1) != new or math.isclose(old, new, rel_tol=1e-12)


def test_cosine_goes_from_one_to_zero():
    assert cosine(0.0) == 1.0 and cosine(1.0) == pytest.approx(0.0, abs=1e-12)
    assert cosine(0.5) == pytest.approx(0.5)
    assert cosine(2.0) == cosine(1.0) and cosine(-1.0) == 1.0


def test_bad_settings_raise():
    with pytest.raises(ValueError):
        ScaleRamp(reference_batch=-1)
    with pytest.raises(ValueError):
        ScaleRamp(reference_batch=32, ramp_steps=-1)
    with pytest.raises(ValueError):
        ScaleRamp(reference_batch=32).set_batch(0, 0)
