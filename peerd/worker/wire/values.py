"""How a segment's values travel: the job's wire dtype, its bytes, and the
encoding of the values (fp32 as they are, fp16/bf16 narrowed, int8 as
peerd.worker.wire.quant's records). The final model travels in fp32."""

from __future__ import annotations

import numpy as np
import torch

from peerd.worker.wire import quant

FINAL_STAGE = 3  # a request's stage for the final model (the consensus at the job's end)
FINAL_PART_STAGE = 4  # a part of the final model, as a plan of the end consensus cuts it
FINAL_MEAN_STAGE = 5  # a part's average over the plan's set
STAGES = frozenset(range(FINAL_MEAN_STAGE + 1))
WIRE_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
ITEMSIZE = {"fp32": 4, "fp16": 2, "bf16": 2}


def stage_wire(stage: int, wire: str) -> str:
    """The final model and its averages travel in fp32 whatever the job's wire:
    every peer must sum exactly the values the others sum (its own included)."""
    return "fp32" if stage >= FINAL_STAGE else wire


def wire_nbytes(wire: str, n: int) -> int:
    """Bytes of n values on `wire`."""
    return quant.wire_nbytes(n) if wire == "int8" else n * ITEMSIZE[wire]


def to_wire(values: torch.Tensor, wire: str) -> np.ndarray:
    """Little-endian bytes of `values` in the job's wire dtype (a view for fp32;
    int8: peerd.worker.wire.quant's records, blocks from the start of `values`)."""
    if wire == "fp32":
        return values.numpy()
    if wire == "int8":
        return quant.encode(values)
    narrow = values.to(WIRE_DTYPES[wire])
    return narrow.view(torch.int16).numpy() if wire == "bf16" else narrow.numpy()
