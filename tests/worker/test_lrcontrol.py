"""The LR law in force is said at the first step and at every change of the
global batch, in the worker's log: a job file copied from another keeps its
reference batch, and the log is where a user sees what it does to the LR."""

from __future__ import annotations

import logging

from peerd.settings.jobspec import OptimizerSpec
from peerd.worker.train.lrcontrol import LrControl


def test_the_law_and_each_change_are_logged_with_their_factor(caplog):
    control = LrControl(OptimizerSpec(reference_batch=96, scaling="sqrt", max_scale=2.0, ramp_steps=8))
    with caplog.at_level(logging.INFO, logger="peerd.worker"):
        assert round(control.update(32, 0), 3) == 0.577
        control.update(32, 1)  # no change: nothing more
        control.update(128, 2)
    assert [r.getMessage() for r in caplog.records] == [
        "LR: sqrt law against the reference batch 96, cap 2; global batch 32: LR scale 0.577",
        "global batch now 128: LR scale ramps to 1.155 (sqrt law against the reference batch 96, cap 2)",
    ]


def test_without_a_reference_batch_the_log_says_the_lr_is_not_scaled(caplog):
    control = LrControl(OptimizerSpec(reference_batch=0))
    with caplog.at_level(logging.INFO, logger="peerd.worker"):
        assert control.update(96, 0) == 1.0
        assert control.update(32, 5) == 1.0
    assert [r.getMessage() for r in caplog.records] == [
        "LR: no scaling with the global batch ([optimizer] reference_batch = 0); global batch 96: LR scale 1.000"]
