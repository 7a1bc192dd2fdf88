"""SegmentChunk on the wire, encoded and decoded by hand.

The bytes are exactly protobuf's (a test compares them with SerializeToString and
FromString), but the payload goes from the snapshot into the message in one
copy and comes out as a view into the received buffer, where the protobuf
runtime would copy it twice more each way. Segments are the bulk of peerd's
traffic, so this is where the copies cost (docs/benchmarks.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from peerd.errors import InvalidMessage
from peerd.worker.wire import quant

_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _tag(field: int, wire: int) -> bytes:
    return _varint(field << 3 | wire)


@dataclass(frozen=True)
class ChunkView:
    round: int
    segment: int
    offset: int
    total: int
    data: memoryview  # little-endian float32 values, a view into the received message


def encode_segment_chunk(round_: int, segment: int, offset: int, total: int, data) -> bytes:
    """SegmentChunk bytes; `data` is any buffer (a numpy view of the snapshot)."""
    parts = []
    for field, value in ((1, round_), (2, segment), (3, offset), (4, total)):
        if value:  # proto3 leaves zero scalars out
            parts += (_tag(field, _VARINT), _varint(value))
    payload = memoryview(data).cast("B")
    if payload.nbytes:
        parts += (_tag(5, _LENGTH), _varint(payload.nbytes), payload)
    return b"".join(parts)


def decode_segment_chunk(message: bytes) -> ChunkView:
    view = memoryview(message)
    values = {1: 0, 2: 0, 3: 0, 4: 0}
    data = view[0:0]
    pos, end = 0, len(view)
    while pos < end:
        key, pos = _read_varint(view, pos)
        field, wire = key >> 3, key & 7
        if wire == _VARINT:
            value, pos = _read_varint(view, pos)
            if field in values:
                values[field] = value
        elif wire == _LENGTH:
            size, pos = _read_varint(view, pos)
            if pos + size > end:
                raise ValueError("truncated SegmentChunk")
            if field == 5:
                data = view[pos : pos + size]
            pos += size
        elif wire in (_FIXED64, _FIXED32):
            pos += 8 if wire == _FIXED64 else 4  # unknown field from a newer peer
        else:
            raise ValueError(f"bad wire type {wire} in SegmentChunk")
    if pos != end:
        raise ValueError("truncated SegmentChunk")
    return ChunkView(values[1], values[2], values[3], values[4], data)


def _read_varint(view: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(view) or shift > 63:
            raise ValueError("bad varint in SegmentChunk")
        byte = view[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def all_finite(values: torch.Tensor) -> bool:
    """True if no value is NaN or ±inf: min and max propagate NaN and are ±inf
    if any value is. One pass and no temporary, where isfinite(x).all() builds a
    bool tensor as large as x (40× slower on 64 MiB, single-threaded)."""
    if values.numel() == 0:
        return True
    lo, hi = torch.aminmax(values)
    return bool(torch.isfinite(lo) & torch.isfinite(hi))


def finite_by_sum(values: torch.Tensor) -> bool:
    """True if no value is NaN or ±inf, from their sum: a NaN or an infinity makes
    the sum NaN or infinite. One pass and no temporary, ~40 % cheaper than
    all_finite's aminmax. It refuses finite values whose sum overflows fp32
    (|sum| > 3.4e38), which no model has; a caller refusing them keeps its own
    values, the safe side."""
    return math.isfinite(float(values.sum()))


# Stages a round only uses through what it computes and checks (the flat
# average, the group mean, the mix): a transport may leave their non-finite
# check to the round. Stage 2 (the all-gather) is copied as it is: checked.
ROUND_CHECKED_STAGES = frozenset({0, 1})

_WIRE_NUMPY = {"fp32": "<f4", "fp16": "<f2", "bf16": "<u2"}


def _values_in(nbytes: int, wire: str) -> int:
    if wire == "int8":
        return quant.values_in(nbytes) if nbytes else 0
    itemsize = np.dtype(_WIRE_NUMPY[wire]).itemsize
    if nbytes % itemsize:
        raise InvalidMessage(f"partner sent {nbytes} bytes: not whole {wire} values", "bad_dtype")
    return nbytes // itemsize


def fill_values(
    out: torch.Tensor, offset: int, total: int, data, filled: int, wire: str = "fp32", check_finite: bool = True,
) -> int:
    """Copy one received chunk into `out` at `offset`, widened to fp32, after
    checking it against what was asked: a wrong length, gap, overrun, partial
    value or non-finite value is refused. Returns the elements filled so far.
    check_finite=False leaves the non-finite check to a caller that checks what
    it computes from the values (ROUND_CHECKED_STAGES)."""
    if total != out.numel():
        raise InvalidMessage(f"partner sent a segment of {total} elements, expected {out.numel()}", "wrong_length")
    nbytes = memoryview(data).nbytes
    size = _values_in(nbytes, wire)
    if offset != filled or (wire == "int8" and offset % quant.BLOCK):
        raise InvalidMessage(f"partner sent a chunk at {offset}, expected {filled}", "bad_offset")
    if size == 0 or offset + size > total:
        raise InvalidMessage(f"partner sent a chunk of {size} at {offset} in a segment of {total}", "oversize")
    target = out[offset : offset + size]
    if wire == "int8":
        quant.decode_into(data, target.numpy())
    elif wire == "bf16":  # numpy has no bfloat16; its bits are the top half of a float32's
        values = np.frombuffer(data, dtype=np.uint16)
        target.numpy().view(np.uint32)[:] = values.astype(np.uint32) << 16
    else:  # the one copy (and widening), into the preallocated buffer
        target.numpy()[:] = np.frombuffer(data, dtype=np.dtype(_WIRE_NUMPY[wire]))
    if check_finite and not all_finite(target):
        raise InvalidMessage(f"partner sent non-finite values at {offset}..{offset + size}", "non_finite")
    return filled + size
