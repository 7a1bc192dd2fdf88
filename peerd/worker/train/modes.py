"""Each module's own train/eval flag, kept across what peerd runs between steps.

A job or script that keeps part of its model in eval mode (a frozen backbone's
BatchNorm: its statistics must not move) trains in those modes; an evaluation
puts the model in eval mode, and `model.train()` afterwards would set every
module, the frozen ones too. So peerd saves every module's flag before and
gives each its own back after (docs/operations.md, "Script jobs" and "What
peerd's own loop does to the model").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

import torch
from torch import nn

from peerd.errors import ConfigError


@contextmanager
def modes_kept(model: nn.Module) -> Iterator[None]:
    """Every module's train/eval flag after the block as it was before."""
    modes = [(module, module.training) for module in model.modules()]
    try:
        yield
    finally:
        for module, training in modes:  # parents first: each ends with its own flag
            module.train(training)


def in_eval_mode(model: nn.Module) -> list[str]:
    """The names of the modules in eval mode whose parent trains (or the root's
    name, "model", when it is in eval mode itself): what a log says is frozen."""
    names = ["model"] if not model.training else []
    for name, module in model.named_modules():
        parent = model.get_submodule(name.rpartition(".")[0]) if name else None
        if parent is not None and parent.training and not module.training:
            names.append(name)
    return names


def script_evaluation(model: nn.Module, evaluate: Callable[[], Mapping[str, float]]) -> Callable[[], dict]:
    """The script's evaluate(), safe to call between its steps: without gradients,
    every module's mode as it was after (model.train(flag) would set them all, and
    put a backbone the script froze in eval mode back in train mode), and its
    result checked."""

    def run() -> dict[str, float]:
        with modes_kept(model), torch.no_grad():
            metrics = evaluate()
        try:
            return {str(k): float(v) for k, v in dict(metrics).items()}
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"peerd.attach(evaluate=...): evaluate() must return a dict of numbers, "
                              f"got {metrics!r}") from exc

    return run
