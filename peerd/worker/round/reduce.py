"""The arithmetic of a hierarchical round (docs/algorithms.md §1.3), apart from any fetch:
reduce a segment over the group, mix it with the partner group's, round it to
the wire dtype. No asyncio and no transport: peerd.worker.round.hierarchy fetches the
values and calls these, tests call them on tensors.

Received values are checked once, on what is computed from them: a non-finite
input makes the mean or the mix non-finite (peerd.worker.wire.codec.finite_by_sum).
Only then are the inputs looked at one by one, to name the bad one.
"""

from __future__ import annotations

import torch

from peerd.worker.wire.codec import finite_by_sum
from peerd.worker.wire.quant import round_trip_
from peerd.worker.wire.values import WIRE_DTYPES


# The mean is computed block by block: a block of the result stays in the cache
# across its sums, the division and the check, where whole-segment passes read
# and write it from memory each time (one 16 MiB segment of 4 members, single
# thread: 9.9 ms against 12.0). Each element's operations and their order are
# the same, so the bits are too.
BLOCK = 128 * 1024  # elements: 512 KiB


def _mean(mine: torch.Tensor, received: list[torch.Tensor], out: torch.Tensor | None) -> tuple[torch.Tensor, bool]:
    """The mean, in `out` (or a new tensor), and whether it is finite."""
    total = torch.empty_like(mine) if out is None else out
    finite = True
    for start in range(0, mine.numel(), BLOCK):
        block = total[start : start + BLOCK]
        if not received:
            block.copy_(mine[start : start + BLOCK])
            continue
        # The first sum writes the result: no separate copy of `mine`.
        torch.add(mine[start : start + BLOCK], received[0][start : start + BLOCK], out=block)
        for values in received[1:]:
            block.add_(values[start : start + BLOCK])
        block.div_(1 + len(received))
        finite = finite_by_sum(block) and finite
    return total, finite


def reduce_group(mine: torch.Tensor, received: list[torch.Tensor],
                 out: torch.Tensor | None = None) -> tuple[torch.Tensor, list[int]]:
    """The mean of `mine` and the groupmates' values that arrived, in `out` (a
    new tensor without it; not one of the inputs), and the indices into
    `received` refused for a non-finite value (left out of the mean). Only
    what came in is checked: `mine` is this peer's own."""
    total, finite = _mean(mine, received, out)
    if finite:
        return total, []
    refused = [i for i, values in enumerate(received) if not finite_by_sum(values)]
    return _mean(mine, [v for i, v in enumerate(received) if i not in refused], out)[0], refused


def mix_groups(total: torch.Tensor, theirs: torch.Tensor, weight: float,
               out: torch.Tensor | None = None) -> torch.Tensor | None:
    """(1 − w)·total + w·theirs in one pass, in `out` (a new tensor without
    it); None when `theirs` held a non-finite value (the caller keeps `total`)."""
    mixed = torch.empty_like(total) if out is None else out
    finite = True
    for start in range(0, total.numel(), BLOCK):  # checked while in the cache, as the mean
        block = mixed[start : start + BLOCK]
        torch.lerp(total[start : start + BLOCK], theirs[start : start + BLOCK], weight, out=block)
        finite = finite_by_sum(block) and finite
    return mixed if finite else None


def round_to_wire(values: torch.Tensor, wire: str) -> torch.Tensor:
    """`values` (one whole segment) as the group members will receive them. The
    owner keeps the same rounding, or the group could never agree closer than
    the rounding."""
    if wire == "fp32":
        return values
    rounded = values.clone()
    round_to_wire_(rounded, wire)
    return rounded


def round_to_wire_(values: torch.Tensor, wire: str) -> None:
    """round_to_wire in place."""
    if wire == "int8":
        round_trip_(values)
    elif wire != "fp32":
        values.copy_(values.to(WIRE_DTYPES[wire]))
