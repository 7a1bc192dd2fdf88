"""The model a finished peer puts into the consensus at the job's end, as one
fp32 vector (docs/algorithms.md, "One model at the end"):

    [ gossiped vector | float buffers gossip leaves alone | integer buffers ]

Gossip averages the parameters (and buffers only with average_buffers), so
without the middle part each peer would save its own BatchNorm statistics
beside the common parameters: a different model.pt on every peer, each scored
on statistics that do not match the weights. The consensus averages the first
two parts exactly (a buffer of another float type in fp32: an fp64 one comes
back rounded to fp32); integer and boolean buffers (`num_batches_tracked`) travel in 16-bit
pieces, each exact in fp32, and take the largest value among the members.
"""

from __future__ import annotations

import torch

from peerd.core.segments import Span
from peerd.worker.state.trainstate import TrainState

PIECES = 4  # an int64 as four 16-bit pieces
_MASK = 0xFFFF


def encode_ints(values: torch.Tensor) -> torch.Tensor:
    """int64 values (any shape) -> fp32 pieces, 4 per value, each an integer in 0..65535."""
    v = values.reshape(-1).to(torch.int64)
    pieces = [(v >> (16 * k)) & _MASK for k in range(PIECES)]
    return torch.stack(pieces, 1).reshape(-1).to(torch.float32)


def decode_ints(pieces: torch.Tensor) -> torch.Tensor:
    """encode_ints' inverse: a 1-D int64 tensor."""
    p = pieces.reshape(-1, PIECES).to(torch.int64)
    out = p[:, 0].clone()
    for k in range(1, PIECES):
        out |= p[:, k] << (16 * k)
    return out


def largest_ints(tails: list[torch.Tensor]) -> torch.Tensor:
    """The integer part of the consensus: each value the largest among the
    members' (encoded pieces in, encoded pieces out)."""
    values = torch.stack([decode_ints(t) for t in tails])
    return encode_ints(values.max(dim=0).values)


class FinalModel:
    """A TrainState's model as the end consensus sees it."""

    def __init__(self, state: TrainState) -> None:
        self.state = state
        self.floats = state.kept_float_buffers
        self.ints = state.int_buffers

    @property
    def int_elems(self) -> int:
        """Elements at the vector's end that hold integer buffers."""
        return PIECES * sum(b.numel() for b in self.ints)

    def vector(self) -> torch.Tensor:
        """A CPU fp32 copy of the final model."""
        parts = [self.state.flat.vector.detach().reshape(-1).cpu()]
        parts += [t.detach().reshape(-1).cpu().to(torch.float32) for t in self.floats]
        parts += [encode_ints(b.detach().cpu()) for b in self.ints]
        return torch.cat(parts).to(torch.float32)

    def layout(self, gossip: list[Span]) -> list[Span]:
        """The gossip's segments, then one more for the buffers (they are small)."""
        end = gossip[-1].stop if gossip else 0
        numel = self.state.flat.numel + sum(t.numel() for t in self.floats) + self.int_elems
        return [*gossip, Span(end, numel)] if numel > end else list(gossip)

    @torch.no_grad()
    def adopt(self, vector: torch.Tensor) -> None:
        """Make the model the consensus `vector` (a CPU fp32 vector of this layout)."""
        flat = self.state.flat.vector
        flat.copy_(vector[: flat.numel()].to(flat.device))
        offset = flat.numel()
        for t in self.floats:
            t.view(-1).copy_(vector[offset : offset + t.numel()].to(device=t.device, dtype=t.dtype))
            offset += t.numel()
        for b in self.ints:
            n = PIECES * b.numel()
            b.view(-1).copy_(decode_ints(vector[offset : offset + n]).to(b.dtype).to(b.device))
            offset += n
