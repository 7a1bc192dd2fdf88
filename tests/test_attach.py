"""peerd.attach's pieces that need no daemon: the script's evaluate() wrapper."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from peerd.errors import ConfigError
from peerd.peer import _script_evaluation


def test_the_scripts_evaluate_runs_without_gradients_and_keeps_the_models_mode():
    model = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))
    seen = {}

    def evaluate():
        model.eval()  # as scripts do, without switching back
        seen["grad"] = torch.is_grad_enabled()
        return {"val_loss": torch.tensor(1.5), "accuracy": 1}

    model.train()
    assert _script_evaluation(model, evaluate)() == {"val_loss": 1.5, "accuracy": 1.0}
    assert model.training and seen["grad"] is False
    model.eval()
    _script_evaluation(model, evaluate)()
    assert not model.training


@pytest.mark.parametrize("result", [None, 0.5, {"accuracy": "high"}, [("a", 1, 2)]])
def test_an_evaluate_that_returns_no_dict_of_numbers_is_named(result):
    with pytest.raises(ConfigError, match=r"evaluate\(\) must return a dict of numbers"):
        _script_evaluation(nn.Linear(1, 1), lambda: result)()


def test_the_mode_comes_back_when_evaluate_raises():
    model = nn.Linear(1, 1)

    def evaluate():
        model.eval()
        raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError, match="out of memory"):
        _script_evaluation(model, evaluate)()
    assert model.training
