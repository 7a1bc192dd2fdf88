"""The arithmetic of a hierarchical round (DESIGN §1.3), apart from any fetch:
reduce a segment over the group, mix it with the partner group's, round it to
the wire dtype. No asyncio and no transport: peerd.worker.hierarchy fetches the
values and calls these, tests call them on tensors.

Received values are checked once, on what is computed from them: a non-finite
input makes the mean or the mix non-finite (peerd.worker.codec.finite_by_sum).
Only then are the inputs looked at one by one, to name the bad one.
"""

from __future__ import annotations

import torch

from peerd.worker.codec import finite_by_sum


def _mean(mine: torch.Tensor, received: list[torch.Tensor], out: torch.Tensor | None) -> torch.Tensor:
    # The first sum writes the result: no separate copy of `mine`.
    if received:
        total = torch.add(mine, received[0]) if out is None else torch.add(mine, received[0], out=out)
    else:
        total = mine.clone() if out is None else out.copy_(mine)
    for values in received[1:]:
        total.add_(values)
    return total.div_(1 + len(received))


def reduce_group(mine: torch.Tensor, received: list[torch.Tensor],
                 out: torch.Tensor | None = None) -> tuple[torch.Tensor, list[int]]:
    """The mean of `mine` and the groupmates' values that arrived, in `out` (a
    new tensor without it; not one of the inputs), and the indices into
    `received` refused for a non-finite value (left out of the mean)."""
    total = _mean(mine, received, out)
    if finite_by_sum(total) or not received:
        return total, []
    refused = [i for i, values in enumerate(received) if not finite_by_sum(values)]
    return _mean(mine, [v for i, v in enumerate(received) if i not in refused], out), refused


def mix_groups(total: torch.Tensor, theirs: torch.Tensor, weight: float,
               out: torch.Tensor | None = None) -> torch.Tensor | None:
    """(1 − w)·total + w·theirs in one pass, in `out` (a new tensor without
    it); None when `theirs` held a non-finite value (the caller keeps `total`)."""
    mixed = torch.lerp(total, theirs, weight) if out is None else torch.lerp(total, theirs, weight, out=out)
    return mixed if finite_by_sum(mixed) else None


def round_to_wire(values: torch.Tensor, wire_dtype: torch.dtype) -> torch.Tensor:
    """`values` as the group members will receive them. The owner keeps the
    same rounding, or the group could never agree closer than the rounding."""
    return values if wire_dtype == torch.float32 else values.to(wire_dtype).float()
