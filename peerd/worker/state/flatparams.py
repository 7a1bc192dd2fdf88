"""The model's parameters as one flat fp32 vector (docs/algorithms.md §1.1).

Each parameter becomes a view into one contiguous buffer, so a segment is a
slice of that buffer and gossip averages it in place: no gather or scatter per
round, and the optimizer keeps working on the same tensors. Other fp32 tensors
the job averages too (BatchNorm statistics, optimizer moments: the
`[gossip] average_*` opt-ins) follow the parameters in the same vector.

Tied weights (a language model's output layer and its token embedding) are one
Parameter that two modules hold: `model.parameters()` lists it once, so it is
one slice of the vector, averaged once and tied still. Two Parameters over the
same memory would be two slices, averaged apart and untied: refused.
"""

from __future__ import annotations

import torch
from torch import nn


class FlatParams:
    def __init__(self, model: nn.Module, extra: list[torch.Tensor] | tuple = ()) -> None:
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise ValueError("the model has no trainable parameters")
        if any(p.dtype != torch.float32 for p in params):
            raise ValueError("peerd gossips fp32 parameters; cast the model with .float()")
        _refuse_aliases(model, params)
        params += list(extra)
        if any(p.dtype != torch.float32 for p in params):
            raise ValueError("only fp32 tensors can be averaged with the parameters")
        if len({p.device for p in params}) > 1:
            raise ValueError("all trainable parameters must be on one device")
        self.params = params  # the parameters, then the extra tensors
        self.shapes = [tuple(p.shape) for p in params]
        self.vector = torch.empty(sum(p.numel() for p in params), dtype=torch.float32, device=params[0].device)
        offset = 0
        with torch.no_grad():
            for p in params:
                n = p.numel()
                self.vector[offset : offset + n].copy_(p.view(-1))
                p.data = self.vector[offset : offset + n].view_as(p)
                offset += n

    def rebind(self, vector: torch.Tensor) -> None:
        """Make the parameters views into `vector` (same size, dtype and device)
        from now on, keeping the Parameter objects the optimizer knows. The worker
        moves the model into the buffer a round wrote, instead of copying back."""
        if vector.shape != self.vector.shape or vector.dtype != self.vector.dtype or vector.device != self.vector.device:
            raise ValueError("rebind needs a vector like the current one")
        offset = 0
        with torch.no_grad():
            for p in self.params:
                n = p.numel()
                p.data = vector[offset : offset + n].view_as(p)
                offset += n
        self.vector = vector

    @property
    def numel(self) -> int:
        return self.vector.numel()


def _refuse_aliases(model: nn.Module, params: list[torch.Tensor]) -> None:
    """Two trainable Parameters over the same memory: weights tied as two objects.
    (Parameters in one storage side by side, as this class leaves them, are not.)"""
    names = {id(p): name for name, p in model.named_parameters()}
    seen: dict[int, str] = {}
    for p in params:
        if p.numel() == 0:
            continue
        name, where = names.get(id(p), "?"), p.data_ptr()
        if where in seen:
            raise ValueError(f"the parameters {seen[where]} and {name} are two nn.Parameter objects over the same "
                             f"memory; tie them as one ({name} = {seen[where]}, as transformers does) so that "
                             f"peerd averages the tensor once and keeps it tied")
        seen[where] = name
