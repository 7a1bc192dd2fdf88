"""peerd.lightning's decisions that need neither Lightning nor a daemon
(peerd.worker.train.lightningjob): what a Trainer must agree to, the job's
position in one process's steps, where each schedule is at it, a step's batches."""

from __future__ import annotations

from dataclasses import replace

import pytest

from peerd.errors import ConfigError
from peerd.worker.train.lightningjob import (Optimization, Schedule, StepScale, TrainerSetup, check,
                                             optimization_refusals, refusals, scheduler_target, split)

AGREES = TrainerSetup(max_epochs=3, max_steps=-1, single_device=True, val_every_epoch=True, whole_data=True,
                      reload_every=0)


def test_a_trainer_of_the_jobs_epochs_on_one_device_is_taken():
    assert refusals(AGREES, 3.0, 0) == []
    check([])  # nothing to refuse: no error


@pytest.mark.parametrize("change, epochs, global_batch, says", [
    (dict(max_epochs=4), 3.0, 0, "Trainer(max_epochs=4) must be the job's [job] epochs = 3"),
    (dict(max_epochs=1000), 3.0, 0, "an unset max_epochs is 1000"),
    ({}, 2.5, 0, "make [job] epochs (2.5) a whole number"),
    (dict(max_steps=96), 3.0, 0, "drop Trainer(max_steps=96)"),
    (dict(single_device=False), 3.0, 0, "make the Trainer with devices=1"),
    (dict(val_every_epoch=False), 3.0, 0, "leave Trainer(val_check_interval) at 1.0"),
    (dict(whole_data=False), 3.0, 0, "drop limit_train_batches, overfit_batches and fast_dev_run"),
    (dict(reload_every=1), 3.0, 0, "drop reload_dataloaders_every_n_epochs"),
    (dict(stoppers=("EarlyStopping",)), 3.0, 0, "drop EarlyStopping: a peer that stops by its own"),
    (dict(accumulation_scheduled=True), 3.0, 0, "give accumulate_grad_batches one value"),
    (dict(resumed=True), 3.0, 0, "drop fit(ckpt_path=...)"),
    ({}, 3.0, 96, "set [job] global_batch = 0"),
])
def test_what_would_train_another_job_is_refused_with_its_fix(change, epochs, global_batch, says):
    found = refusals(replace(AGREES, **change), epochs, global_batch)
    assert len(found) == 1 and says in found[0], found
    with pytest.raises(ConfigError, match="peerd.lightning: this Trainer cannot train the job") as caught:
        check(found)
    assert says in str(caught.value)


def test_every_refusal_is_said_at_once():
    found = refusals(replace(AGREES, max_epochs=5, max_steps=10, reload_every=2), 3.0, 0)
    assert len(found) == 3
    with pytest.raises(ConfigError) as caught:
        check(found)
    assert all(reason in str(caught.value) for reason in found)


def schedule(interval="epoch", frequency=1, plateau=False, positional=True, name="lr_scheduler_0") -> Schedule:
    return Schedule(name, interval, frequency, plateau, positional)


def test_one_optimizer_in_automatic_optimization_with_schedules_peerd_follows_is_taken():
    plateau = schedule(plateau=True, positional=False, name="lr_scheduler_1")
    opt = Optimization(True, 1, (schedule(), schedule("step", name="lr_scheduler_2"), plateau,
                                 schedule(frequency=3, name="lr_scheduler_3")))
    assert optimization_refusals(opt) == []


@pytest.mark.parametrize("opt, says", [
    (Optimization(False, 1), "use automatic optimization"),
    (Optimization(True, 2), "configure_optimizers gave 2"),
    (Optimization(True, 1, (schedule("step", frequency=2),)), "drop frequency=2"),
    (Optimization(True, 1, (schedule(positional=False),)), "is not a torch LRScheduler"),
    (Optimization(True, 1, (schedule("batch"),)), "interval 'batch'"),
])
def test_an_optimization_peerd_cannot_follow_is_refused(opt, says):
    found = optimization_refusals(opt)
    assert len(found) == 1 and says in found[0], found


def test_the_jobs_position_in_one_process_steps_ends_at_the_jobs_steps():
    scale = StepScale(epochs=3, samples=1024, step_batch=32)
    assert scale.per_epoch == 32 and scale.total == 96
    assert [scale.position_steps(p) for p in (0.0, 0.5, 1.0, 2.999, 3.0)] == [0, 16, 32, 95, 96]
    # A step's batch that does not divide the data: the short last step counts (peerd.total_steps).
    odd = StepScale(epochs=2, samples=1000, step_batch=64)
    assert odd.total == 32 and odd.position_steps(2.0) == 31 and odd.position_steps(5.0) == 32


def test_a_schedule_is_at_the_jobs_epoch_or_steps_in_its_own_unit():
    assert scheduler_target(schedule(), epoch=2, steps=70) == 2
    assert scheduler_target(schedule(frequency=2), epoch=3, steps=70) == 1  # stepped after epochs 1, 3, ...
    assert scheduler_target(schedule("step"), epoch=2, steps=70) == 70
    assert scheduler_target(schedule("step"), epoch=2, steps=70, limit=64) == 64  # a OneCycleLR's own end
    assert scheduler_target(schedule(plateau=True, positional=False), epoch=2, steps=70) is None


@pytest.mark.parametrize("n, parts, sizes", [(32, 2, [16, 16]), (33, 2, [16, 17]), (3, 4, [1, 1, 1]), (1, 1, [1])])
def test_a_step_is_cut_into_even_batches_none_empty(n, parts, sizes):
    indices = list(range(100, 100 + n))
    cut = split(indices, parts)
    assert [len(c) for c in cut] == sizes and sum(cut, []) == indices
