"""peerd.core.rng (SeededStream, derive_seed) and peerd.core.deadline."""

from __future__ import annotations

import math
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peerd.core.deadline import DeadlineEstimator
from peerd.core.rng import SeededStream, derive_seed

REPO = Path(__file__).resolve().parents[2]
FAST = settings(max_examples=100, deadline=None)

# blake2b keys are at most 64 bytes; derive_seed makes 32.
seeds = st.binary(min_size=1, max_size=64)


# --------------------------------------------------------------------- rng


def test_derive_seed_is_32_bytes_and_deterministic():
    a = derive_seed("job", 3, 1)
    assert isinstance(a, bytes) and len(a) == 32
    assert derive_seed("job", 3, 1) == a


def test_derive_seed_golden():
    # Every peer, on every Python version and platform, must derive the same
    # seed: this pins the encoding. Changing it breaks mixed-version jobs.
    assert derive_seed("job", 0, 0).hex() == (
        "845c260a6f7555876c5f81108c8bdfb3e41360e241a14f47bf43a2d6f09cdeae"
    )


@given(st.lists(st.text(max_size=8), min_size=1, max_size=4), st.lists(st.text(max_size=8), min_size=1, max_size=4))
@FAST
def test_derive_seed_separates_parts(a, b):
    # Parts are JSON-encoded, so distinct part lists always give distinct seeds.
    assert (derive_seed(*a) == derive_seed(*b)) == (a == b)


def test_derive_seed_distinguishes_round_and_segment():
    seen = {derive_seed("job", r, s) for r in range(20) for s in range(20)}
    assert len(seen) == 400
    assert derive_seed("job", 1, 11) != derive_seed("job", 11, 1)
    assert derive_seed("job-a", 0, 0) != derive_seed("job-b", 0, 0)


def test_stream_golden():
    s = SeededStream(derive_seed("golden"))
    assert [s.below(10) for _ in range(10)] == [2, 1, 2, 5, 8, 6, 0, 3, 2, 5]


@given(seeds, st.integers(min_value=1, max_value=1 << 64))
@FAST
def test_below_in_range(seed, n):
    s = SeededStream(seed)
    for _ in range(5):
        x = s.below(n)
        assert isinstance(x, int)
        assert 0 <= x < n


@given(seeds)
@settings(max_examples=20, deadline=None)
def test_below_one_is_zero(seed):
    s = SeededStream(seed)
    assert all(s.below(1) == 0 for _ in range(20))


@pytest.mark.parametrize("n", [0, -1, -(1 << 70)])
def test_below_rejects_non_positive(n):
    with pytest.raises(ValueError):
        SeededStream(b"seed").below(n)


def test_below_near_rejection_threshold():
    # n just above 2**63: about half the raw draws are rejected, so this
    # exercises the rejection loop.
    n = (1 << 63) + 1
    s = SeededStream(b"reject")
    draws = [s.below(n) for _ in range(200)]
    assert all(0 <= x < n for x in draws)
    assert len(set(draws)) == 200


def test_below_wider_than_64_bits_terminates():
    code = (
        "from peerd.core.rng import SeededStream\n"
        "try:\n"
        "    x = SeededStream(b's').below((1 << 64) + 1)\n"
        "    assert 0 <= x < (1 << 64) + 1\n"
        "except ValueError:\n"
        "    pass\n"
    )
    try:
        proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, timeout=1, capture_output=True)
    except subprocess.TimeoutExpired:
        pytest.fail("below((1 << 64) + 1) did not return within 1 s")
    assert proc.returncode == 0, proc.stderr


@given(seeds, seeds)
@FAST
def test_stream_deterministic_per_seed(a, b):
    xs = SeededStream(a)
    ys = SeededStream(a)
    assert [xs.below(1000) for _ in range(10)] == [ys.below(1000) for _ in range(10)]
    if a != b:
        zs = SeededStream(b)
        ws = SeededStream(a)
        # 20 draws of 2**32 values agreeing by chance is negligible.
        assert [ws.below(1 << 32) for _ in range(20)] != [zs.below(1 << 32) for _ in range(20)]


def test_below_roughly_uniform():
    s = SeededStream(b"uniform")
    counts = Counter(s.below(6) for _ in range(6000))
    assert set(counts) == set(range(6))
    # Expected 1000 each, sd ~ 29: a deterministic, generous bound.
    assert all(850 < c < 1150 for c in counts.values()), counts


@given(seeds, st.lists(st.integers(), max_size=50))
@FAST
def test_shuffle_is_permutation_and_deterministic(seed, items):
    a = list(items)
    b = list(items)
    SeededStream(seed).shuffle(a)
    SeededStream(seed).shuffle(b)
    assert a == b
    assert sorted(a) == sorted(items)


def test_shuffle_trivial_lists():
    for items in ([], [7]):
        got = list(items)
        SeededStream(b"x").shuffle(got)
        assert got == items


def test_shuffle_roughly_uniform():
    # All 6 orders of 3 items appear with roughly equal frequency.
    counts = Counter()
    for k in range(1200):
        items = [0, 1, 2]
        SeededStream(derive_seed("shuffle", k)).shuffle(items)
        counts[tuple(items)] += 1
    assert len(counts) == 6
    assert all(130 < c < 270 for c in counts.values()), counts


# ---------------------------------------------------------------- deadline


def test_deadline_ceiling_before_any_observation():
    d = DeadlineEstimator(floor_s=1.0, ceiling_s=30.0)
    assert d.deadline() == 30.0


@pytest.mark.parametrize(
    "floor, ceiling",
    [(0.0, 1.0), (-1.0, 1.0), (2.0, 1.0), (-2.0, -1.0), (0.0, 0.0), (math.nan, 1.0), (1.0, math.nan)],
)
def test_deadline_rejects_bad_bounds(floor, ceiling):
    with pytest.raises(ValueError):
        DeadlineEstimator(floor_s=floor, ceiling_s=ceiling)


def test_deadline_floor_equal_ceiling_is_allowed():
    d = DeadlineEstimator(floor_s=5.0, ceiling_s=5.0)
    assert d.deadline() == 5.0
    d.observe(0.01)
    assert d.deadline() == 5.0
    d.observe(100.0)
    assert d.deadline() == 5.0


bounds = st.tuples(
    st.floats(min_value=1e-3, max_value=100.0), st.floats(min_value=1e-3, max_value=100.0)
).map(sorted)
observations = st.lists(st.floats(min_value=0.0, max_value=1e4), max_size=40)


@given(bounds, observations, st.floats(min_value=0.5, max_value=10.0), st.floats(min_value=0.01, max_value=1.0))
@settings(max_examples=100, deadline=None)
def test_deadline_stays_within_bounds(fc, obs, factor, alpha):
    floor, ceiling = fc
    d = DeadlineEstimator(floor_s=floor, ceiling_s=ceiling, factor=factor, alpha=alpha)
    assert floor <= d.deadline() <= ceiling
    for x in obs:
        d.observe(x)
        assert floor <= d.deadline() <= ceiling


def test_deadline_tracks_factor_times_first_observation():
    d = DeadlineEstimator(floor_s=0.5, ceiling_s=60.0, factor=4.0)
    d.observe(2.0)
    assert d.deadline() == pytest.approx(8.0)


def test_deadline_clamped_to_floor_and_ceiling():
    d = DeadlineEstimator(floor_s=1.0, ceiling_s=10.0, factor=4.0)
    d.observe(0.01)
    assert d.deadline() == 1.0
    d.observe(50.0)
    assert d.deadline() == 10.0


@given(st.floats(min_value=0.01, max_value=1.0), st.floats(min_value=1.0, max_value=5.0))
@FAST
def test_deadline_rises_at_once_on_slow_observation(fast, slow_mult):
    d = DeadlineEstimator(floor_s=0.01, ceiling_s=1e6, factor=4.0, alpha=0.2)
    for _ in range(10):
        d.observe(fast)
    slow = fast * slow_mult * 3
    d.observe(slow)
    # No smoothing on the way up: the deadline jumps to factor * slow.
    assert d.deadline() == pytest.approx(4.0 * slow)


def test_deadline_decays_gradually():
    d = DeadlineEstimator(floor_s=0.01, ceiling_s=1e6, factor=4.0, alpha=0.2)
    d.observe(10.0)
    assert d.deadline() == pytest.approx(40.0)
    d.observe(1.0)
    # ema = 10 + 0.2 * (1 - 10) = 8.2: one fast exchange does not erase a slow one.
    assert d.deadline() == pytest.approx(4.0 * 8.2)
    previous = d.deadline()
    for _ in range(60):
        d.observe(1.0)
        now = d.deadline()
        assert now <= previous
        assert now >= 4.0 * 1.0 - 1e-9
        previous = now
    # ... but it does converge to the new speed.
    assert d.deadline() == pytest.approx(4.0, rel=1e-3)


@given(st.lists(st.floats(min_value=0.0, max_value=100.0), min_size=1, max_size=30))
@FAST
def test_deadline_never_below_factor_times_last_observation(obs):
    # After observing x, the estimate is at least x (it jumps up to x or is
    # already above it and decays towards it), so the deadline is at least
    # clamp(factor * x).
    d = DeadlineEstimator(floor_s=1e-3, ceiling_s=1e9, factor=3.0, alpha=0.3)
    for x in obs:
        d.observe(x)
        assert d.deadline() >= min(1e9, max(1e-3, 3.0 * x)) * (1 - 1e-12)


@given(st.lists(st.floats(min_value=0.0, max_value=100.0), min_size=1, max_size=30))
@FAST
def test_deadline_at_most_factor_times_max_observation(obs):
    d = DeadlineEstimator(floor_s=1e-3, ceiling_s=1e9, factor=3.0, alpha=0.3)
    for x in obs:
        d.observe(x)
    assert d.deadline() <= max(1e-3, 3.0 * max(obs)) * (1 + 1e-12)


@pytest.mark.parametrize("seed", [bytes(65), bytes(100)])
def test_stream_rejects_seeds_blake2b_cannot_key(seed):
    with pytest.raises(ValueError):
        SeededStream(seed)


def test_deadline_ignores_non_finite_observations():
    d = DeadlineEstimator(floor_s=0.5, ceiling_s=10.0)
    d.observe(0.5)
    for bad in (float("nan"), float("inf"), -1.0):
        d.observe(bad)
    assert d.deadline() == pytest.approx(2.0)


def test_deadline_counts_its_measurements():
    from peerd.core.deadline import DeadlineEstimator

    d = DeadlineEstimator(0.5, 10.0)
    assert d.measured == 0 and d.deadline() == 10.0
    d.observe(float("nan"))
    assert d.measured == 0
    d.observe(0.3)
    assert d.measured == 1 and d.deadline() == pytest.approx(1.2)
