"""DBS's step model in the worker: the meter's split of a step into a fixed part
and a per-sample part (peerd.core.meter), the fixed-overhead testing knob
(peerd.core.slowdown, peerd.worker.train.slowdown), and real Trainers planned by it.
No timing thresholds: the assertions follow from how the values are made."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from peerd.core.meter import StepMeter
from peerd.core.shares import plan_batches, published_costs
from peerd.core.slowdown import Slowdown
from peerd.settings.jobspec import parse_job

JOBCODE = str(Path(__file__).parents[1] / "jobcode")


@pytest.mark.parametrize("batches", [[32] * 40, [8, 64, 16, 48] * 10])
def test_the_meter_recovers_a_and_c_whether_or_not_the_batch_varies(batches):
    """t = 0.2 + 0.01·b on every step: the split gives a and c exactly, also when
    the batch never changes (a least-squares fit over (b, t) could not)."""
    m = StepMeter()
    for b in batches:
        m.observe(b, 0.2 + 0.01 * b, fixed_s=0.2)
    assert m.fixed_s == pytest.approx(0.2)
    assert m.per_sample_s == pytest.approx(0.01)
    # the model agrees with the whole-step speed at the mean batch
    mean_b = sum(batches[-20:]) / 20
    assert m.speed == pytest.approx(mean_b / (m.fixed_s + m.per_sample_s * mean_b), rel=0.2)


def step_s(b: int) -> float:
    """A step that is not affine in its batch: 0.1 s of optimizer update, 0.05 s
    of reading the weights in forward and backward whatever the batch, 0.002 s a sample."""
    return 0.1 + 0.05 + 0.002 * b


def test_after_dbs_moves_the_batch_the_meter_measures_the_new_batch_afresh():
    """40 steps at 32 samples, then 2 at 4: the model's time of a 4-sample step is
    the measured one, not the 32-sample steps' rate extrapolated (which said
    0.1 + 4·(0.114 − 0.1)/32 = 0.10 s, a third off the 0.158 s it takes)."""
    m = StepMeter()
    for _ in range(40):
        m.observe(32, step_s(32), fixed_s=0.1)
    assert m.fixed_s + 4 * m.per_sample_s < 0.75 * step_s(4)  # the old regime's prediction
    for _ in range(2):
        m.observe(4, step_s(4), fixed_s=0.1)
    assert m.fixed_s + 4 * m.per_sample_s == pytest.approx(step_s(4))
    assert m.speed == pytest.approx(4 / step_s(4))


def test_one_short_step_at_an_epochs_end_does_not_start_the_averages_over():
    m = StepMeter()
    for b in [32] * 40 + [5] + [32] * 3:
        m.observe(b, step_s(b), fixed_s=0.1)
    # the tail step weighs as one step of the EMA, not as the whole history
    assert m.speed == pytest.approx(32 / step_s(32), rel=0.05)


def test_a_meter_that_never_times_the_fixed_part_reports_no_model():
    m = StepMeter()
    for _ in range(5):
        m.observe(16, 0.1)  # a script's step: peer.step() sees only the whole step
    assert math.isnan(m.fixed_s) and math.isnan(m.per_sample_s) and m.speed == pytest.approx(160)
    speeds, fixed = published_costs({"s": m.speed}, {"s": m.fixed_s}, {"s": m.per_sample_s})
    assert speeds == {"s": m.speed} and fixed == {}  # planned in proportion to its speed


def test_a_fixed_part_longer_than_the_step_is_clamped():
    m = StepMeter()
    m.observe(10, 0.1, fixed_s=0.5)
    assert m.fixed_s == pytest.approx(0.1) and m.per_sample_s > 0


def test_the_overhead_knob_sleeps_a_fixed_time_after_every_step():
    assert Slowdown(overhead_s=0.3).sleep_s(1.0, 1.0) == 0.3
    assert Slowdown(2.0, "wall", 0.3).sleep_s(0.5, 0.1) == pytest.approx(0.8)
    with pytest.raises(ValueError):
        Slowdown(overhead_s=-1.0)


def test_the_shell_counts_the_factors_stretch_and_the_overhead_as_fixed():
    """A step of 0.5 s whose own fixed work took 0.1 s, at f = 3 (wall) with 0.2 s
    overhead: it lasts 0.5·3 + 0.2 s, of which 0.1·3 + 0.2 is fixed."""
    from peerd.worker.train.slowdown import SlowedSteps

    now = {"wall": 0.0}

    def sleep(s):
        now["wall"] += s

    steps = SlowedSteps(Slowdown(3.0, "wall", 0.2), cpu=lambda: 0.0, wall=lambda: now["wall"], sleep=sleep)
    steps.start()
    now["wall"] += 0.5
    assert steps.finish() == pytest.approx(1.7)
    assert steps.fixed_s(0.1) == pytest.approx(0.5)


def test_the_daemon_passes_the_overhead_to_its_workers(tmp_path):
    from peerd.settings.config import parse_config
    from peerd.daemon.jobs import WorkerLaunch
    from peerd.errors import ConfigError
    from peerd.worker.main import parse_args

    config = parse_config({"worker": {"step_overhead_s": 0.25}}, "test")
    launch = WorkerLaunch("unix:/x.sock", "p", "127.0.0.1", 1, tmp_path / "job.toml", "", tmp_path / "w.log",
                          step_overhead_s=config.step_overhead_s)
    assert parse_args(launch.argv()[3:]).step_overhead_s == 0.25
    assert parse_config({}, "test").step_overhead_s == 0.0
    with pytest.raises(ConfigError, match="step_overhead_s"):
        parse_config({"worker": {"step_overhead_s": -1}}, "test")


def _job(**job) -> str:
    values = {"epochs": 50, "global_batch": 60, "local_batch": 30, "min_local_batch": 2, **job}
    extra = "".join(f"{k} = {v}\n" for k, v in values.items())
    return ('[job]\nname = "dbs"\nmodel = "tiny_job:small_model"\ndata = "tiny_job:small_data"\n'
            f'{extra}[optimizer]\nlr = 0.1\nschedule = "constant"\nreference_batch = 60\n')


def test_real_trainers_with_a_fixed_overhead_get_the_affine_plans_batches():
    """Two real Trainers, b with a 0.05 s fixed sleep per step: b's measured fixed
    cost includes the sleep, the plan from both meters (as the peers publish them)
    gives b no more than the plan by speed alone (at B = members × the batch the
    speeds were measured at, 1/(1 + x) ≥ 1 − x says so), and each then trains
    exactly its planned batch."""
    from peerd.worker.train.trainer import Trainer

    members = ["a", "b"]
    job = parse_job(_job(), "test")
    trainers = {"a": Trainer(job, "a", JOBCODE), "b": Trainer(job, "b", JOBCODE, step_overhead_s=0.05)}
    for t in trainers.values():
        for _ in range(4):
            t.step(members)
    ma, mb = trainers["a"].meter, trainers["b"].meter
    assert 0 <= ma.fixed_s < 0.05 <= mb.fixed_s  # the sleep is all fixed; a's own is the optimizer's
    assert ma.per_sample_s > 0 and mb.per_sample_s > 0
    speeds, fixed = published_costs({p: t.meter.speed for p, t in trainers.items()},
                                    {p: t.meter.fixed_s for p, t in trainers.items()},
                                    {p: t.meter.per_sample_s for p, t in trainers.items()})
    affine = plan_batches(60, speeds, members, 2, fixed)
    # Speed alone, as the same meters measured it at the batch they stepped: the
    # whole-step speed b / (a + c·b). (meter.speed is a separate average of whole
    # steps; on a busy machine the two estimates disagree by more than the margin.)
    measured = {p: t.local_batch / (t.meter.fixed_s + t.meter.per_sample_s * t.local_batch)
                for p, t in trainers.items()}
    assert 2 * trainers["a"].local_batch == 60  # the theorem's B: members × the measured batch
    proportional = plan_batches(60, measured, members, 2)
    assert affine.batch("b") <= proportional.batch("b")
    for p, t in trainers.items():
        t.step(members, plan=affine)
        assert t.local_batch == affine.batch(p)
