"""The int8 wire's quantiser: exact bounds of a round trip, its bytes, and what it refuses."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from peerd.errors import InvalidMessage
from peerd.worker.wire.quant import (
    BLOCK, NonFiniteValues, decode_into, dequantise, encode, quantise, round_trip_, values_in, wire_nbytes,
)

finite = st.floats(-2.0 ** 100, 2.0 ** 100, allow_nan=False, width=32)  # subnormals included
segments = arrays(np.float32, st.integers(1, 3 * BLOCK + 7), elements=finite)


@settings(max_examples=500, deadline=None)
@given(segments)
def test_round_trip_error_is_at_most_half_a_scale(values):
    x = torch.from_numpy(values)
    scales, codes = quantise(x)
    back = dequantise(scales, codes, x.numel())
    per_value = scales.repeat_interleave(BLOCK)[: x.numel()].double()
    error = (back.double() - x.double()).abs()
    # Half a scale, and the fp32 rounding of value / scale (a relative 2^-24 of ≤ 127 steps).
    assert bool((error <= per_value * (0.5 + 127 * 2.0 ** -23)).all())
    assert int(codes.abs().max()) <= 127


@settings(max_examples=200, deadline=None)
@given(segments)
def test_bytes_decode_to_the_round_trip_and_quantising_again_changes_nothing(values):
    x = torch.from_numpy(values.copy())
    data = encode(x)
    assert data.nbytes == wire_nbytes(x.numel()) and values_in(data.nbytes) == x.numel()
    out = np.empty(x.numel(), np.float32)
    decode_into(data, out)
    round_trip_(x)
    assert np.array_equal(out, x.numpy())  # what a reader gets is what the sender holds, bit for bit
    again = np.empty(x.numel(), np.float32)
    decode_into(encode(x), again)
    assert np.array_equal(again, out)  # idempotent: an owner's rounded stage 2 reaches its readers unchanged


def test_chunks_at_block_multiples_are_the_same_bytes_as_one_piece():
    x = torch.randn(5 * BLOCK + 3)
    whole = encode(x)
    pieces = np.concatenate([encode(x[i : i + 2 * BLOCK]) for i in range(0, x.numel(), 2 * BLOCK)])
    assert np.array_equal(whole, pieces)


def test_a_block_of_tiny_values_keeps_its_bound_where_absmax_over_127_underflows():
    x = torch.tensor([1e-45, -1e-45, 3e-45] + [0.0] * (BLOCK - 3))
    scales, codes = quantise(x)
    assert scales[0] > 0 and bool(((dequantise(scales, codes, BLOCK) - x).abs() <= scales[0] / 2).all())


@pytest.mark.parametrize("units", [(48800, -36400), (1, 0), (3, 2), (5000, 77), (1 << 22, 12345), (1 << 30, 3)])
def test_blocks_below_the_normal_range_are_idempotent_too(units):
    # Values in units of 2^-149, fp32's least subnormal: where absmax / 127 is
    # subnormal a 17-bit scale grid is coarse (48800 units: scale 512, largest
    # code 95), and quantising the round trip again moved its values.
    x = torch.zeros(BLOCK)
    x[: len(units)] = torch.tensor([u * 2.0 ** -149 for u in units], dtype=torch.float64).float()
    once = x.clone()
    round_trip_(once)
    twice = once.clone()
    round_trip_(twice)
    assert torch.equal(once, twice)
    scales, codes = quantise(x)
    assert bool(((dequantise(scales, codes, BLOCK) - x).abs() <= scales[0] / 2).all())


def test_a_zero_block_is_exact_and_costs_no_division():
    x = torch.cat([torch.zeros(BLOCK), torch.full((BLOCK,), 127 / 32), torch.zeros(5)])
    scales, codes = quantise(x)
    assert scales.tolist() == [0.0, 1 / 32, 0.0]
    assert torch.equal(dequantise(scales, codes, x.numel()), x)  # zeros stay zeros, 127/32 = 127 × 1/32


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_values_are_refused(bad):
    x = torch.randn(2 * BLOCK)
    x[BLOCK + 1] = bad
    with pytest.raises(NonFiniteValues, match="non-finite values cannot be quantised"):
        quantise(x)
    with pytest.raises(NonFiniteValues):
        encode(x)


def test_bad_records_are_refused():
    data = bytearray(encode(torch.randn(BLOCK + 10)))
    out = np.empty(BLOCK + 10, np.float32)
    for patch, why in ((np.float32(-1.0), "negative or non-finite"), (np.float32(math.nan), "negative or non-finite")):
        bad = bytearray(data)
        bad[0:4] = patch.tobytes()
        with pytest.raises(InvalidMessage, match=why):
            decode_into(bytes(bad), out)
    bad = bytearray(data)
    bad[4] = 0x80  # −128
    with pytest.raises(InvalidMessage, match="-128"):
        decode_into(bytes(bad), out)
    with pytest.raises(InvalidMessage, match="bytes for"):
        decode_into(bytes(data[:-1]), out)
    with pytest.raises(InvalidMessage, match="not whole int8 records"):
        values_in(4)  # a scale and no value
