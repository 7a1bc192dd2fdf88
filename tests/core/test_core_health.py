"""peerd.core.health: when a worker's training has collapsed (docs/algorithms.md,
"When training collapses"), and that healthy, noisy training never counts."""

from __future__ import annotations

import math
import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peerd.core.health import (AT_CHANCE, BLOWUP, LOSS_RISE, NEVER_LEARNED, NONFINITE, Collapse, Health, Limits,
                               describe)


def feed(health: Health, losses, start: int = 1) -> Collapse | None:
    """Each loss as one step from `start` on; the first collapse made."""
    for step, value in enumerate(losses, start):
        made = health.loss(value, step)
        if made is not None:
            return made
    return None


def decaying(steps: int, rng: random.Random, start: float = 2.3, floor: float = 0.05, tau: float = 150.0,
             noise: float = 0.4, spikes: float = 0.01) -> list[float]:
    """A healthy training loss: an exponential decay to a floor, each step's value
    scattered (log-normal, `noise` its sigma once trained; an initial model's loss is
    steady from batch to batch, σ ≤ 0.1) and now and then a hard batch 20×."""
    out = []
    for t in range(steps):
        trained = 1 - math.exp(-t / tau)
        mean = floor + (start - floor) * (1 - trained)
        sigma = min(noise, 0.1) + (noise - min(noise, 0.1)) * trained
        value = mean * math.exp(rng.gauss(0.0, sigma) - sigma * sigma / 2)
        out.append(value * 20 if rng.random() < spikes and t > 0 else value)
    return out


# --- non-finite loss ---------------------------------------------------------------------------------


def test_three_non_finite_losses_in_a_row_are_a_collapse_at_once():
    h = Health()
    assert feed(h, [2.3] * 30 + [math.nan, math.inf]) is None
    made = h.loss(-math.inf, 33)
    assert made == h.collapse and made.rule == NONFINITE and made.step == 33
    assert made.detail == "loss -inf for 3 steps in a row"


def test_a_lone_non_finite_loss_is_a_skipped_step_not_a_collapse():
    h = Health()
    assert feed(h, [2.3, math.nan, math.nan, 2.2, math.nan, 2.1] * 20) is None and h.collapse is None


def test_a_loss_never_finite_is_said_so():
    made = feed(Health(), [math.nan] * 3)
    assert made.rule == NONFINITE and made.step == 3 and made.detail.endswith("(never finite)")


# --- loss rise ---------------------------------------------------------------------------------------


def test_a_loss_back_at_its_start_for_sustain_steps_is_a_collapse():
    rng = random.Random(1)
    healthy = decaying(600, rng, floor=0.2, noise=0.2, spikes=0.0)
    h = Health()
    assert feed(h, healthy) is None
    made = feed(h, [2.3] * 200, start=601)
    lim = Limits()
    # The window's median crosses when most of it is high, then `sustain` steps in a row.
    assert made.rule == LOSS_RISE
    assert 600 + lim.sustain <= made.step <= 600 + lim.window // 2 + lim.sustain
    assert made.detail.startswith("loss 2.3 (best 0.") and made.detail.endswith(f"for {lim.sustain} steps")


def test_a_rise_that_ends_before_sustain_steps_is_no_collapse():
    h = Health()
    lim = Limits()
    rng = random.Random(2)
    curve = decaying(600, rng, floor=0.2, noise=0.2, spikes=0.0)
    burst = [2.3] * (lim.sustain - 5)  # the median stays up half a window longer than the burst
    assert feed(h, curve + burst + decaying(600, rng, start=0.2, floor=0.2, noise=0.2, spikes=0.0)) is None


def test_a_tiny_loss_that_wobbles_gave_nothing_back():
    """0.002 after a best of 0.0006 is over 3×, but nowhere near the 2.3 it started from."""
    h = Health()
    curve = [2.3 * math.exp(-t / 30) + 0.0006 for t in range(400)] + [0.002] * 500
    assert feed(h, curve) is None


def test_a_rise_under_the_factor_is_no_collapse():
    h = Health()
    assert feed(h, [2.3 * math.exp(-t / 30) + 0.5 for t in range(400)] + [1.4] * 500) is None  # 2.8× the best


def test_the_rise_rule_is_off_for_a_loss_at_or_below_zero():
    h = Health()
    assert feed(h, [-1.0 - t / 100 for t in range(300)] + [5.0] * 300) is None


# --- loss blow-up ------------------------------------------------------------------------------------


def test_a_loss_that_explodes_at_its_first_updates_is_a_collapse():
    """The first step's loss is the initial model's; from the second on, 1e21 falling to 1e14
    (an absurd LR): no window is better than another, but all are far above the start."""
    h = Health()
    made = feed(h, [2.3] + [1e21 / 1.2 ** t for t in range(200)])
    lim = Limits()
    assert made.rule == BLOWUP and made.step == lim.window  # the first full window
    assert made.detail.endswith(f"(first step 2.3) over the last {lim.window} steps")


def test_a_blow_up_is_half_a_window_far_above_the_start():
    lim = Limits()
    for k in range(0, lim.window, 4):  # k of every window's steps at 100: a blow-up once they are half
        curve = [2.3] + [100.0 if i % lim.window < k else 1.0 for i in range(200)]
        made = feed(Health(), curve)
        assert (made is not None) == (k > lim.window // 2), k


def test_no_blow_up_without_the_jobs_first_step():
    """A newcomer's or a restart's first loss may be a lucky batch: it is no reference."""
    h = Health()
    assert feed(h, [0.001] + [0.5] * 300, start=500) is None


# --- metric at chance --------------------------------------------------------------------------------


def test_accuracy_back_at_chance_twice_in_a_row_is_a_collapse():
    h = Health("accuracy", higher_better=True, chance=0.1)
    for step, value in enumerate([0.3, 0.85, 0.098], 1):
        assert h.metric(value, 40 * step) is None
    made = h.metric(0.097, 160)
    assert made.rule == AT_CHANCE and made.step == 160
    assert made.detail == "accuracy 0.097 at chance 0.1 after 0.85"


def test_one_evaluation_at_chance_then_back_up_is_no_collapse():
    h = Health("accuracy", higher_better=True, chance=0.1)
    assert all(h.metric(v, 1) is None for v in (0.85, 0.1, 0.8, 0.11, 0.9))


def test_a_metric_never_clearly_above_chance_arms_nothing():
    h = Health("accuracy", higher_better=True, chance=0.1)
    assert all(h.metric(v, 1) is None for v in (0.12, 0.14, 0.09, 0.09, 0.08))


def test_a_loss_metric_is_watched_the_other_way_and_nan_counts_as_chance():
    h = Health("val_loss", higher_better=False, chance=4.564)
    assert all(h.metric(v, 1) is None for v in (3.0, 1.7, 4.4))
    made = h.metric(math.nan, 2)
    assert made.rule == AT_CHANCE and made.detail == "val_loss nan at chance 4.564 after 1.7"


def test_no_chance_no_metric_rule():
    h = Health("accuracy")
    assert all(h.metric(v, 1) is None for v in (0.9, 0.0, 0.0, 0.0))


@pytest.mark.parametrize("chance", [0.0, math.nan, math.inf])
def test_a_chance_that_gives_no_scale_is_refused(chance):
    with pytest.raises(ValueError, match="chance"):
        Health("accuracy", chance=chance)


# --- never learned (at the end) ------------------------------------------------------------------------


def dead(steps: int, seed: int = 3) -> list[float]:
    """A model whose units died at its first updates: the initial loss to the end, ±1 %."""
    rng = random.Random(seed)
    return [2.3 * (1 + rng.uniform(-0.01, 0.01)) for _ in range(steps)]


def test_a_job_that_ends_at_chance_with_its_first_loss_never_learned():
    h = Health("accuracy", higher_better=True, chance=0.1)
    assert feed(h, dead(125)) is None
    assert h.metric(0.11, 40) is None and h.metric(0.089, 125) is None
    made = h.end(125)
    assert made.rule == NEVER_LEARNED and made.step == 125
    assert re.fullmatch(r"accuracy never beyond 0\.11 at chance 0\.1; loss never below 2\.\d+ \(first step 2\.\d+\)",
                        made.detail), made.detail


@pytest.mark.parametrize("what", ["learned", "too short", "clear once", "no chance", "no first step",
                                  "not evaluated"])
def test_a_job_that_learned_or_cannot_say_is_no_never_learned(what):
    h = Health("accuracy", higher_better=True, chance=None if what == "no chance" else 0.1)
    losses = dead(2 * Limits().window - 1 if what == "too short" else 2 * Limits().window + 20)
    if what == "learned":  # the loss fell by a tenth and more, even if the accuracy did not move
        losses = [2.3] + [2.0] * 150
    feed(h, losses, start=2 if what == "no first step" else 1)
    if what != "not evaluated":
        h.metric(0.16 if what == "clear once" else 0.1, 100)
        h.metric(0.1, 120)
    assert h.end(120) is None and h.collapse is None


# --- sticky, and said once ------------------------------------------------------------------------------


def test_a_collapse_is_sticky_and_made_once():
    h = Health("accuracy", chance=0.1)
    first = feed(h, [math.nan] * 3)
    assert feed(h, [0.1] * 100) is None and h.metric(0.9, 9) is None and h.metric(0.1, 10) is None
    assert h.collapse is first


def test_describe_names_the_round_the_rule_and_the_values():
    c = Collapse(LOSS_RISE, 212, "loss 2.3 (best 0.21) for 50 steps")
    assert describe(c, 212) == "training collapsed at round 212 (loss rise): loss 2.3 (best 0.21) for 50 steps"


# --- healthy training never counts ------------------------------------------------------------------------


@given(seed=st.integers(0, 2**32 - 1), start=st.floats(0.5, 10.0), floor_share=st.floats(1e-4, 0.8),
       tau=st.floats(10.0, 2000.0), noise=st.floats(0.0, 1.0), spikes=st.floats(0.0, 0.05))
@settings(max_examples=100, deadline=None)
def test_healthy_noisy_decaying_losses_never_collapse(seed, start, floor_share, tau, noise, spikes):
    """Decays fast or slow to a floor near 0 or near the start, each step scattered by
    up to a factor e (log-normal σ ≤ 1) and up to 5 % of the steps hard batches at 20×.
    (Of 1,500 such curves drawn at random, none collapsed; of 600 with σ in 1..1.5, three
    that had learned little did: a window of 50 steps is then too short.)"""
    h = Health()
    assert feed(h, decaying(3000, random.Random(seed), start, start * floor_share, tau, noise, spikes)) is None


@given(seed=st.integers(0, 2**32 - 1), top=st.floats(0.3, 0.99), tau=st.floats(1.0, 50.0),
       noise=st.floats(0.0, 0.05), classes=st.integers(2, 100))
@settings(max_examples=60, deadline=None)
def test_a_healthy_accuracy_never_collapses(seed, top, tau, noise, classes):
    """Rising from chance to `top` with evaluation noise, as evaluations every few rounds see it."""
    chance = 1.0 / classes
    rng = random.Random(seed)
    h = Health("accuracy", higher_better=True, chance=chance)
    for k in range(100):
        mean = chance + (max(top, chance) - chance) * (1 - math.exp(-k / tau))
        assert h.metric(min(1.0, max(0.0, mean + rng.gauss(0.0, noise))), k) is None


@given(seed=st.integers(0, 2**32 - 1), floor=st.floats(0.01, 0.25), level=st.floats(1.0, 5.0))
@settings(max_examples=40, deadline=None)
def test_a_loss_that_learned_and_went_back_up_always_collapses(seed, floor, level):
    """After learning to `floor`, the loss sits at the level it started from (a model
    whose units died), scattered: seen within the window and `sustain` steps."""
    rng = random.Random(seed)
    h = Health()
    assert feed(h, decaying(800, rng, start=level, floor=floor, tau=60, noise=0.3, spikes=0.0)) is None
    lim = Limits()
    made = feed(h, decaying(lim.window + lim.sustain + 10, rng, start=level, floor=level, noise=0.3, spikes=0.0),
                start=801)
    assert made is not None and made.rule == LOSS_RISE
