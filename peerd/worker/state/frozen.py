"""What the training has frozen, as element ranges of the state's vector
(docs/algorithms.md, "Frozen tensors").

A parameter whose `requires_grad` is False and a buffer of a module in eval
mode (a frozen backbone's BatchNorm statistics) keep the values the training
left: a gossip round and a state transfer leave them as they were. What counts
is asked at the moment (`Frozen.spans`), so a script that freezes or unfreezes
a tensor mid-job is followed. Parameters frozen before attach are not in the
vector at all (TrainState keeps the trainable ones); those frozen later, the
buffers averaged with `average_buffers` and the optimizer's moments of a frozen
parameter are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

Check = Callable[[], bool]


def param_frozen(param: torch.Tensor) -> Check:
    return lambda: not param.requires_grad


def buffer_frozen(model: nn.Module, name: str) -> Check:
    """A buffer is frozen while the module that holds it is in eval mode."""
    module = model.get_submodule(name.rpartition(".")[0])
    return lambda: not module.training


class Frozen:
    """The vector's tensors, each with the test of whether it is frozen now."""

    def __init__(self, pieces: list[tuple[int, Check]]) -> None:
        self._pieces: list[tuple[int, int, Check]] = []  # start, stop, check
        offset = 0
        for numel, check in pieces:
            self._pieces.append((offset, offset + numel, check))
            offset += numel

    def spans(self, limit: int | None = None) -> list[tuple[int, int]]:
        """The ranges frozen now, neighbours merged; only those that start below
        `limit` elements (the gossiped part: its first `limit`)."""
        out: list[tuple[int, int]] = []
        for start, stop, check in self._pieces:
            if limit is not None and start >= limit:
                break
            if not check():
                continue
            if out and out[-1][1] == start:
                out[-1] = (out[-1][0], stop)
            else:
                out.append((start, stop))
        return out


@contextmanager
def kept(spans: list[tuple[int, int]], vector: Callable[[], torch.Tensor],
         residual: Callable[[], torch.Tensor | None] = lambda: None) -> Iterator[None]:
    """`vector()`'s values in `spans` after the block as they were before it
    (`vector` is asked again after: a round may move the model into another
    buffer); the int8 wire's `residual()`, if any, owes nothing there."""
    if not spans:
        yield
        return
    before = vector()
    saved = [before[a:b].clone() for a, b in spans]
    try:
        yield
    finally:
        after, owed = vector(), residual()
        for (a, b), values in zip(spans, saved):
            after[a:b].copy_(values)
            if owed is not None:
                owed[a:b].zero_()
