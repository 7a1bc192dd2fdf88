"""The job's own code: a job module's callables, found by name, with defaults.

A job module needs only `make_model()`. Everything else has today's behaviour as
its default (docs/operations.md, "Job modules"):

    make_datasets() -> (train, test)          map-style datasets; make_datasets(ctx)
                                              to read this peer's files (data_mode = "local")
    make_loader(dataset, batch_sampler, ctx)  a DataLoader over peerd's sampler
    loss(model, batch) -> Tensor | (Tensor, dict)
    evaluate(model, batches) -> dict[str, float]
    make_optimizer(params, spec) -> torch.optim.Optimizer

`[job] model` and `data` ("module:callable") override make_model and
make_datasets. Anything missing or of the wrong kind is a ConfigError naming the
callable and what was expected, raised at join, before any training.
"""

from __future__ import annotations

import importlib
import inspect
import math
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import ModuleType

import torch
from torch import nn

from peerd.errors import ConfigError
from peerd.settings.jobspec import JobSpec

CALLABLES = ("make_model", "make_datasets", "make_loader", "loss", "evaluate", "make_optimizer")


@dataclass(frozen=True)
class JobContext:
    """What a job's callables may want to know about the peer they run on."""

    peer_id: str
    device: torch.device
    batch_size: int  # this peer's batch now (DBS may change it)
    seed: int
    data_root: str = ""
    loader_workers: int = 0
    pin_memory: bool = False
    prefetch_factor: int = 2


def _import(name: str, spec_dir: str, what: str) -> ModuleType:
    if spec_dir and spec_dir not in sys.path:
        sys.path.insert(0, spec_dir)
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"cannot import {name!r} for {what}: no module named {exc.name!r} "
            "(the job's code must be installed on this machine or sit next to the job file)"
        ) from None


def load_entry(entry: str, spec_dir: str = "") -> Callable:
    """Import "module:callable", looking next to the job file first."""
    module_name, _, attr = entry.partition(":")
    module = _import(module_name, spec_dir, repr(entry))
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ConfigError(f"module {module_name!r} has no {attr!r} (from {entry!r})") from None


class JobCode:
    """The callables of one job, each either the job's own or peerd's default."""

    def __init__(self, spec: JobSpec, spec_dir: str = "") -> None:
        found: dict[str, Callable] = {}
        if spec.module:
            module = _import(spec.module, spec_dir, f"job.module = {spec.module!r}")
            for name in CALLABLES:
                value = getattr(module, name, None)
                if value is not None:
                    if not callable(value):
                        raise ConfigError(f"{spec.module}.{name} is {type(value).__name__}, expected a function")
                    found[name] = value
        if spec.model:
            found["make_model"] = load_entry(spec.model, spec_dir)
        if spec.data:
            found["make_datasets"] = load_entry(spec.data, spec_dir)
        where = spec.module or spec.model.partition(":")[0]
        for name in ("make_model", "make_datasets"):
            if name not in found:
                raise ConfigError(f"the job module {where!r} has no {name}() (job {spec.name!r} needs one)")
        self.where = where
        self.own = frozenset(found)
        self.make_model: Callable[[], nn.Module] = found["make_model"]
        self.make_datasets: Callable[[], tuple] = found["make_datasets"]
        self.make_loader: Callable | None = found.get("make_loader")
        self.loss_fn: Callable = found.get("loss", default_loss)
        self.evaluate_fn: Callable = found.get("evaluate", default_evaluate)
        self.make_optimizer: Callable | None = found.get("make_optimizer")
        self.metric = spec.metric
        self.data_mode = spec.data_mode

    def datasets(self, ctx: JobContext):
        """make_datasets(ctx) when it takes the context, else make_datasets().
        With local data it must take it: ctx.data_root is where this peer's data is."""
        try:
            takes_ctx = bool(inspect.signature(self.make_datasets).parameters)
        except (TypeError, ValueError):  # a builtin or C callable: no signature to read
            takes_ctx = False
        if not takes_ctx and self.data_mode == "local":
            raise ConfigError(f"{self.name('make_datasets')} takes no argument, but data_mode = 'local' needs "
                              "make_datasets(ctx): each peer reads its own data under ctx.data_root")
        return self.make_datasets(ctx) if takes_ctx else self.make_datasets()

    def name(self, callable_name: str) -> str:
        """How messages name a callable: the job's own, or peerd's default."""
        own = callable_name in self.own
        return f"{self.where}.{callable_name}()" if own else f"peerd's default {callable_name}()"

    def loss(self, model: nn.Module, batch) -> tuple[torch.Tensor, dict[str, float]]:
        """The job's loss as (scalar tensor, extra scalars), checked."""
        value = self.loss_fn(model, batch)
        extras: dict[str, float] = {}
        if isinstance(value, tuple):
            if len(value) != 2 or not isinstance(value[1], dict):
                raise ConfigError(f"{self.name('loss')} returned a tuple; expected (loss tensor, dict of scalars)")
            value, extras = value
        if not isinstance(value, torch.Tensor) or value.numel() != 1:
            shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise ConfigError(f"{self.name('loss')} returned {shape}; expected a scalar tensor (the mean loss)")
        if not value.requires_grad:
            raise ConfigError(f"{self.name('loss')} returned a tensor without a gradient; "
                              "compute it from the model's output")
        return value, {k: float(v) for k, v in extras.items()}

    def evaluate(self, model: nn.Module, batches: Iterable) -> dict[str, float]:
        """The job's evaluation, checked: a dict of numbers holding the job's metric."""
        result = self.evaluate_fn(model, batches)
        if not isinstance(result, dict):
            raise ConfigError(f"{self.name('evaluate')} returned {type(result).__name__}; "
                              "expected a dict of metric name -> number")
        try:
            metrics = {str(k): float(v) for k, v in result.items()}
        except (TypeError, ValueError):
            raise ConfigError(f"{self.name('evaluate')} returned a value that is not a number: {result!r}") from None
        if self.metric not in metrics:
            raise ConfigError(f"{self.name('evaluate')} returned {sorted(metrics)}, without job.metric = "
                              f"{self.metric!r}; set [job] metric to one of them")
        return metrics


def _inputs_targets(batch) -> tuple[torch.Tensor, torch.Tensor]:
    if not (isinstance(batch, (tuple, list)) and len(batch) >= 2):
        raise ConfigError("peerd's default loss and evaluate take batches of (inputs, targets); "
                          "this job's batches are not: give the job module its own loss() and evaluate()")
    return batch[0], batch[1]


def default_loss(model: nn.Module, batch) -> torch.Tensor:
    """Cross-entropy of a classifier on (inputs, labels)."""
    x, y = _inputs_targets(batch)
    return nn.functional.cross_entropy(model(x), y)


def default_evaluate(model: nn.Module, batches: Iterable) -> dict[str, float]:
    """Accuracy and mean cross-entropy of a classifier over the test set."""
    correct = seen = 0
    total_loss = 0.0
    for batch in batches:
        x, y = _inputs_targets(batch)
        logits = model(x).float()
        total_loss += float(nn.functional.cross_entropy(logits, y, reduction="sum"))
        correct += int((logits.argmax(1) == y).sum())
        seen += len(y)
    if seen == 0:
        return {"accuracy": math.nan, "loss": math.nan}
    return {"accuracy": correct / seen, "loss": total_loss / seen}
