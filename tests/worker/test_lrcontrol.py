"""The LR law in force is said at the first step and at every change of the
global batch, in the worker's log: a job file copied from another keeps its
reference batch, and the log is where a user sees what it does to the LR."""

from __future__ import annotations

import logging

import pytest
import torch

from peerd.settings.jobspec import OptimizerSpec
from peerd.worker.train.lrcontrol import LrControl


def installed(control: LrControl) -> torch.optim.Optimizer:
    """An optimizer under `control`'s hooks: its step() is a step's LR applied."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    control.install(optimizer)
    return optimizer


def test_the_law_and_each_change_are_logged_with_their_factor(caplog):
    control = LrControl(OptimizerSpec(reference_batch=96, scaling="sqrt", max_scale=2.0, ramp_steps=8))
    optimizer = installed(control)
    with caplog.at_level(logging.INFO, logger="peerd.worker"):
        assert round(control.update(32, 0), 3) == 0.577
        assert not caplog.records  # said at the step that uses it
        optimizer.step()
        control.update(32, 1)  # no change: nothing more
        optimizer.step()
        control.update(128, 2)
    assert [r.getMessage() for r in caplog.records] == [
        "LR: sqrt law against the reference batch 96, cap 2; global batch 32: LR scale 0.577",
        "global batch now 128: LR scale ramps to 1.155 (sqrt law against the reference batch 96, cap 2)",
    ]


def test_without_a_reference_batch_the_log_says_the_lr_is_not_scaled(caplog):
    control = LrControl(OptimizerSpec(reference_batch=0))
    optimizer = installed(control)
    with caplog.at_level(logging.INFO, logger="peerd.worker"):
        assert control.update(96, 0) == 1.0
        optimizer.step()
        assert control.update(32, 5) == 1.0
        optimizer.step()
    assert [r.getMessage() for r in caplog.records] == [
        "LR: no scaling: the job's LR exactly ([optimizer] reference_batch = 0); global batch 96: LR scale 1.000"]


def test_scaling_none_is_the_scripts_lr_exactly_whatever_the_batch(caplog):
    """A reference batch with `scaling = "none"`: the factor stays 1, said so in
    the words peerctl status, the live page and check-config use."""
    control = LrControl(OptimizerSpec(reference_batch=32, scaling="none"), lr_of="the script's")
    optimizer = installed(control)
    with caplog.at_level(logging.INFO, logger="peerd.worker"):
        assert control.update(256, 0) == 1.0
        optimizer.step()
        assert control.update(8, 3) == 1.0 and control.scale == 1.0
        optimizer.step()
    assert control.law() == 'no scaling: the script\'s LR exactly ([optimizer] scaling = "none")'
    assert [r.getMessage() for r in caplog.records] == [f"LR: {control.law()}; global batch 256: LR scale 1.000"]


def test_the_scale_is_the_laws_factor_without_the_dbs_share():
    control = LrControl(OptimizerSpec(reference_batch=32, scaling="linear", max_scale=4.0, ramp_steps=0))
    assert control.update(64, 0, batch_scale=1.5) == 3.0
    assert control.scale == 2.0 and control.law() == "linear law against the reference batch 32, cap 4"
    assert LrControl(OptimizerSpec(reference_batch=32, max_scale=float("inf"))).law().endswith(", no cap")


def test_a_subclass_that_steps_its_base_gets_the_factor_once():
    """torch runs the step hooks once per hooked class a step() passes: a
    script's SGD subclass calling super().step(), once SGD's own step is hooked
    (another SGD was made), still steps at the script's LR times the factor."""

    class Noting(torch.optim.SGD):
        fail = False

        def step(self, closure=None):
            self.used = self.param_groups[0]["lr"]
            if self.fail:
                raise RuntimeError("out of memory")
            return super().step(closure)

    torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)  # hooks SGD.step itself
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = Noting([param], lr=0.1)
    seen = []
    control = LrControl(OptimizerSpec(reference_batch=32, scaling="linear", max_scale=4.0, ramp_steps=0))
    control.install(optimizer)
    optimizer.register_step_pre_hook(lambda opt, args, kwargs: seen.append(opt.param_groups[0]["lr"]))
    control.update(64, 0)
    for _ in range(2):
        param.grad = torch.ones(1)
        optimizer.step()
        assert optimizer.used == 0.2 and seen[-1] == 0.2 and optimizer.param_groups[0]["lr"] == 0.1
    assert float(param.detach()) == pytest.approx(-0.4)  # two steps of 0.2 × the gradient 1
    optimizer.fail = True  # a step that raises never takes its factor off; the script goes on
    with pytest.raises(RuntimeError):
        optimizer.step()
    optimizer.fail, optimizer.param_groups[0]["lr"] = False, 0.05  # its scheduler sets the next LR
    optimizer.step()
    assert optimizer.used == 0.1 and optimizer.param_groups[0]["lr"] == 0.05
