"""The job's optimizer: any torch.optim class by name, its state made up front.

The state (momentum, Adam's moments, ...) must exist before the first exchange:
a newcomer takes it as one fixed layout, and a donor that has not stepped yet
must hold the same tensors. As hivemind does, one step with zero gradients
creates it; here without weight decay for that step (decay would turn the zero
gradient into a multiple of the weights, and so the moments), with the
parameters put back after it and every step counter reset to 0. That leaves
each optimizer as a fresh one: zero moments (SGD's first step with dampening 0
is buf = grad either way), step sizes that start from the LR (Rprop, ASGD).
The step is the torch class's own, without the step hooks: a script's
optimizer subclass or hook does not see it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable

import torch

from peerd.errors import ConfigError
from peerd.settings.jobspec import OptimizerSpec

# Keywords peerd sets itself (the LR follows its schedule, scaling and ramp).
_OWN = {"params", "lr"}


def optimizer_classes() -> dict[str, type[torch.optim.Optimizer]]:
    """torch.optim's optimizers by lower-case name."""
    return {name.lower(): cls for name, cls in vars(torch.optim).items()
            if isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer) and cls is not torch.optim.Optimizer}


def build_optimizer(params: list[torch.nn.Parameter], spec: OptimizerSpec,
                    make_optimizer: Callable | None = None, where: str = "") -> torch.optim.Optimizer:
    if make_optimizer is not None:
        optimizer = make_optimizer(params, spec)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ConfigError(f"{where}make_optimizer() returned {type(optimizer).__name__}; "
                              "expected a torch.optim.Optimizer")
    else:
        classes = optimizer_classes()
        if spec.name not in classes:
            raise ConfigError(f"optimizer.name = {spec.name!r}: torch.optim has no such optimizer; "
                              f"one of {', '.join(sorted(classes))}")
        cls = classes[spec.name]
        accepted = sorted(set(inspect.signature(cls.__init__).parameters) - _OWN - {"self"})
        unknown = sorted(set(spec.kwargs) - set(accepted))
        if unknown:
            raise ConfigError(f"optimizer: {cls.__name__} takes no {', '.join(unknown)}; "
                              f"it accepts {', '.join(accepted)}")
        try:
            optimizer = cls(params, lr=spec.lr, **spec.kwargs)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"optimizer {cls.__name__}: {exc}") from None
    init_state(optimizer)
    return optimizer


def _own_step(optimizer: torch.optim.Optimizer) -> Callable[[], object]:
    """The step of the torch.optim class `optimizer` is or derives from, without
    the step hooks or a subclass's own step(): a script's optimizer (a wrapper
    that notes each step, its hooks) never sees the step that makes its state.
    An optimizer of the script's own with no torch one under it: its step()."""
    for cls in type(optimizer).__mro__:
        step = cls.__dict__.get("step")
        if step is not None and cls.__module__.startswith("torch.optim") and cls is not torch.optim.Optimizer:
            step = step.__wrapped__ if getattr(step, "hooked", False) else step  # Optimizer.profile_hook_step's
            return lambda: step(optimizer)
    return optimizer.step


def init_state(optimizer: torch.optim.Optimizer) -> None:
    """Create every state tensor with one zero-gradient step."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    decays = [group.get("weight_decay") for group in optimizer.param_groups]
    saved = [p.grad for p in params]
    for p in params:
        p.grad = torch.zeros_like(p)
    for group in optimizer.param_groups:
        if "weight_decay" in group:
            group["weight_decay"] = 0.0
    try:
        with torch.no_grad():
            before = [p.detach().clone() for p in params]
            _own_step(optimizer)()
            for p, b in zip(params, before):
                p.copy_(b)
    finally:
        for p, g in zip(params, saved):
            p.grad = g
        for group, decay in zip(optimizer.param_groups, decays):
            if decay is not None:
                group["weight_decay"] = decay
    for state in optimizer.state.values():
        for key, value in state.items():
            if key == "step":
                state[key] = torch.zeros_like(value) if isinstance(value, torch.Tensor) else 0


def state_tensors(optimizer: torch.optim.Optimizer, params: Iterable[torch.nn.Parameter]) -> list[tuple[str, torch.Tensor]]:
    """The optimizer's per-parameter float tensors shaped like their parameter
    (moments, momentum), in parameter order, then key order: the part of its
    state that is as big as the model."""
    out = []
    for k, p in enumerate(params):
        for key, value in sorted(optimizer.state.get(p, {}).items()):
            if isinstance(value, torch.Tensor) and value.is_floating_point() and value.shape == p.shape:
                out.append((f"{k}.{key}", value))
    return out
