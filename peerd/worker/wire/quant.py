"""The int8 wire: blockwise absmax quantisation of a segment (docs/algorithms.md,
"The int8 wire and error feedback"; the bytes: docs/protocol.md). Pure functions
on tensors and buffers: no I/O, no state.

A segment's values are cut into blocks of BLOCK from the segment's start; each
block is sent as one record: its scale (float32, little-endian), then its
values as int8 codes in −127..127, value = code × scale. The last record may be
shorter. Records are whole at every multiple of BLOCK, so a segment sent in
chunks of a multiple of BLOCK is the same bytes as sent in one piece.

The scale is absmax / 127 rounded up to 17 significant bits (never below it, so
no value is clamped, also where absmax / 127 underflows). Then code × scale
is exact in fp32 (7 + 17 bits), and quantising values already quantised gives
back the same values: a value the owner rounded (a hierarchical
round's stage 2) reaches its readers bit for bit as the owner holds it. Below
fp32's normal range (absmax under 127 × 2^-126) that grid is too coarse for the
largest code to stay 127, so the scale is the next power of two instead: the
largest code is then 64..127 and quantising again keeps that scale.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from peerd.errors import InvalidMessage, PeerUnavailable

# 256 values a scale: the scale costs 4/256 = 1.6 % more bytes (3.94× fewer than
# fp32), and a block as small as a few rows of a layer keeps one large weight
# from coarsening many others (docs/algorithms.md, "The int8 wire and error feedback").
BLOCK = 256
RECORD = BLOCK + 4
LEVELS = 127
_LOW_BITS = (1 << 7) - 1  # float32 mantissa bits dropped from a scale: 23 − 16
_NORMAL_BITS = 1 << 23  # the bits of 2^-126, fp32's least normal number


class NonFiniteValues(PeerUnavailable):
    """Values with a NaN or an infinity cannot be quantised: they have no scale.
    Never sent; a partner asking for them is answered that they are unavailable."""


def wire_nbytes(n: int) -> int:
    """Bytes of n values on the int8 wire."""
    return n + 4 * math.ceil(n / BLOCK)


def values_in(nbytes: int) -> int:
    """How many values `nbytes` of records hold; InvalidMessage if no count fits."""
    blocks = math.ceil(nbytes / RECORD)
    n = nbytes - 4 * blocks
    if n <= 0 or math.ceil(n / BLOCK) != blocks:
        raise InvalidMessage(f"partner sent {nbytes} bytes: not whole int8 records", "bad_dtype")
    return n


def _blocks(values: torch.Tensor) -> torch.Tensor:
    """`values` as (blocks, BLOCK), the last padded with zeros (a copy only then)."""
    n = values.numel()
    full = n - n % BLOCK
    if full == n:
        return values.reshape(-1, BLOCK)
    padded = values.new_zeros(math.ceil(n / BLOCK) * BLOCK)
    padded[:n] = values
    return padded.view(-1, BLOCK)


def _next_power_of_two(bits: torch.Tensor) -> torch.Tensor:
    """The least power of two ≥ each of `bits` (int32 in 0..2^30; 0 gives 0)."""
    v = bits - 1
    for shift in (1, 2, 4, 8, 16):
        v = v | (v >> shift)
    return v + 1


def quantise(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(scales, codes) of a 1-D float32 tensor: one scale per block, codes int8
    (padded to whole blocks). NonFiniteValues if any value is NaN or ±inf."""
    blocks = _blocks(values)
    absmax = blocks.abs().amax(dim=1)
    if not bool(torch.isfinite(absmax).all()):
        raise NonFiniteValues("non-finite values cannot be quantised for the int8 wire")
    # absmax / 127 rounded up to 17 significant bits; one grid step more where the
    # division rounded down (127 × scale is exact, so the test is too).
    raw = (absmax / LEVELS).view(torch.int32)
    bits = (raw + _LOW_BITS) & ~_LOW_BITS
    tiny = bits < _NORMAL_BITS  # a subnormal scale: a power of two (module docstring)
    bits = torch.where(tiny, _next_power_of_two(raw), bits)
    low = bits.view(torch.float32) * LEVELS < absmax
    bits = torch.where(low, torch.where(tiny, (bits * 2).clamp_(min=1), bits + _LOW_BITS + 1), bits)
    scales = bits.view(torch.float32)
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))  # a zero block: codes 0
    codes = torch.round(blocks / safe[:, None]).clamp_(-LEVELS, LEVELS).to(torch.int8)
    return scales, codes


def dequantise(scales: torch.Tensor, codes: torch.Tensor, n: int) -> torch.Tensor:
    """The n values (scales, codes) stand for, float32."""
    return (codes.float() * scales[:, None]).view(-1)[:n]


def round_trip_(values: torch.Tensor) -> None:
    """Replace `values` (one segment) by what a reader of them receives."""
    scales, codes = quantise(values)
    values.copy_(dequantise(scales, codes, values.numel()))


def encode(values: torch.Tensor) -> np.ndarray:
    """The records of a 1-D float32 CPU tensor, as uint8."""
    n = values.numel()
    scales, codes = quantise(values)
    records = torch.empty((scales.numel(), RECORD), dtype=torch.uint8)
    records[:, :4] = scales.view(torch.uint8).view(-1, 4)
    records[:, 4:] = codes.view(torch.uint8)
    return records.view(-1)[: wire_nbytes(n)].numpy()


def decode_into(data, out: np.ndarray) -> None:
    """Write the values of `data` (records of exactly out.size values) into the
    float32 array `out`. InvalidMessage for a negative or non-finite scale or a
    code of −128 (never sent)."""
    raw = np.frombuffer(data, dtype=np.uint8)
    n = out.size
    if raw.size != wire_nbytes(n):
        raise InvalidMessage(f"partner sent {raw.size} bytes for {n} int8 values", "bad_dtype")
    full = n // BLOCK
    parts = [(raw[: full * RECORD].reshape(full, RECORD), out[: full * BLOCK].reshape(full, BLOCK))]
    if n > full * BLOCK:
        parts.append((raw[full * RECORD :].reshape(1, -1), out[full * BLOCK :].reshape(1, -1)))
    for records, target in parts:
        scales = np.ascontiguousarray(records[:, :4]).view("<f4").reshape(-1)
        codes = records[:, 4:].view(np.int8)
        if not (np.isfinite(scales).all() and (scales >= 0).all()):
            raise InvalidMessage("partner sent a negative or non-finite int8 scale", "bad_dtype")
        if (codes == -128).any():
            raise InvalidMessage("partner sent an int8 code of -128", "bad_dtype")
        np.multiply(codes, scales[:, None], out=target, dtype=np.float32)
