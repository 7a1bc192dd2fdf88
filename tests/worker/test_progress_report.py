"""The Progress a worker reports, from the training side's counters and the
engine's figures (peerd.worker.progress_report)."""

from __future__ import annotations

import math
import types

from peerd.core.checkpoints import LastCheckpoint
from peerd.core.meter import StepMeter
from peerd.settings.jobspec import OptimizerSpec, parse_job
from peerd.worker.train.lrcontrol import LrControl
from peerd.control.progress import empty_progress
from peerd.worker.round.shared import RoundResult
from peerd.worker.progress_report import EngineFigures, TimeSpent, progress_of
from peerd.worker.wire.traffic import ExchangeTimes, Traffic

from conftest import example_job

SPEC = parse_job(example_job(), "job.toml")


def source(**counters):
    lr = LrControl(OptimizerSpec(reference_batch=32, scaling="sqrt"))
    lr.update(64, 12)
    values = dict(state=None, step_count=12, samples=384, progress=0.5, epoch=0, loss_ema=1.25, speed_ema=300.0,
                  meter=StepMeter(), local_batch=32, share=math.nan, compute_s=4.0, lr=0.1, global_batch=64,
                  skipped_steps=1, lr_control=lr)
    return types.SimpleNamespace(**{**values, **counters})


def figures(phase: str = "training", **changes) -> EngineFigures:
    traffic = Traffic()
    traffic.sent, traffic.received = 1000, 2000
    values = dict(round=7, phase=phase, metrics={SPEC.metric: 0.9}, checkpoint=LastCheckpoint(5, 0.0, 2),
                  exported=("", 0), misses=3, exchange=ExchangeTimes(), intrahost="", rejected={"non_finite": 1},
                  traffic=traffic, time=TimeSpent())
    return EngineFigures(**{**values, **changes})


def test_it_shows_the_counters_the_figures_and_the_jobs_metric():
    p = progress_of(source(), figures(), SPEC, None, empty_progress())
    assert (p.step, p.round, p.samples, p.skipped_steps, p.segment_misses) == (12, 7, 384, 1, 3)
    assert (p.checkpoint_round, p.checkpoints_written, p.bytes_sent, p.bytes_received) == (5, 2, 1000, 2000)
    assert p.metric == 0.9 and p.metric_name == SPEC.metric and p.phase == "training"
    assert dict(p.rejected) == {"non_finite": 1} and p.training_s == 0.0  # training has not started
    assert math.isnan(p.exchange_s)


def test_a_round_just_done_gives_the_exchange_figures_and_without_one_the_last_are_kept():
    result = RoundResult(7, frozenset({"b", "c"}), reached={"b"}, disagreement=0.25, seconds=0.5)
    done = progress_of(source(), figures(), SPEC, result, empty_progress())
    assert (done.partners_reached, done.partners_planned, done.disagreement, done.exchange_s) == (1, 2, 0.25, 0.5)
    later = progress_of(source(step_count=13), figures(), SPEC, None, done)
    assert (later.step, later.partners_reached, later.partners_planned, later.exchange_s) == (13, 1, 2, 0.5)


def test_it_shows_the_lr_law_in_force_and_its_factor_now():
    p = progress_of(source(), figures(), SPEC, None, empty_progress())
    assert p.lr_law == "sqrt law against the reference batch 32, cap 2" and p.lr_scale == 2 ** 0.5
    lr = LrControl(OptimizerSpec(reference_batch=32, scaling="none"), lr_of="the script's")
    assert math.isnan(progress_of(source(lr_control=lr), figures(), SPEC, None, empty_progress()).lr_scale)
    lr.update(64, 0)
    p = progress_of(source(lr_control=lr), figures(), SPEC, None, empty_progress())
    assert p.lr_law == 'no scaling: the script\'s LR exactly ([optimizer] scaling = "none")' and p.lr_scale == 1.0


def test_a_finished_worker_says_so_whatever_its_phase():
    p = progress_of(source(), figures("consensus"), SPEC, None, empty_progress(), finished=True)
    assert p.finished and p.phase == "finished"


def test_the_time_spent_waiting_is_added_by_cause():
    spent = TimeSpent()
    spent.start()
    now = spent.add("round", spent.since - 2.0)
    assert now >= spent.since and spent.waited["round"] >= 2.0 and spent.training_s >= 0.0


def test_a_collapse_is_reported_with_its_reason_and_none_as_healthy():
    healthy = progress_of(source(), figures(), SPEC, None, empty_progress())
    assert not healthy.collapsed and healthy.collapse_reason == ""
    why = "training collapsed at round 50 (loss blow-up): loss 76.2 (first step 2.3) over the last 50 steps"
    p = progress_of(source(), figures(collapsed=why), SPEC, None, empty_progress(), finished=True)
    assert p.collapsed and p.collapse_reason == why and p.finished


def test_it_says_the_outer_step_in_force_and_nothing_without_one():
    assert progress_of(source(), figures(), SPEC, None, empty_progress()).outer == ""
    text = example_job(outer={"every": 8, "lr": 0.5}).replace("period_steps = 1\n", "")
    spec = parse_job(text, "job.toml")
    p = progress_of(source(), figures(), spec, None, empty_progress())
    assert p.outer == "outer SGD every 8 local steps: lr 0.5, Nesterov momentum 0.5"
