"""The hierarchical round's arithmetic (peerd.worker.round.reduce), without sockets."""

from __future__ import annotations

import math

import pytest
import torch

from peerd.worker.round.reduce import mix_groups, reduce_group, round_to_wire


def vectors(k: int, n: int = 1000) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(k)
    return [torch.randn(n, generator=gen) for _ in range(k)]


@pytest.mark.parametrize("k", [0, 1, 2, 4])
def test_reduce_is_the_mean_as_a_new_tensor(k):
    mine, *received = vectors(k + 1)
    before = mine.clone()
    total, refused = reduce_group(mine, received)
    assert refused == []
    torch.testing.assert_close(total, torch.stack([mine, *received]).mean(0))
    assert torch.equal(mine, before)
    assert total.data_ptr() not in {mine.data_ptr(), *(r.data_ptr() for r in received)}


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_reduce_leaves_out_a_non_finite_contribution_and_names_it(bad):
    mine, a, b, c = vectors(4)
    b[10] = bad
    total, refused = reduce_group(mine, [a, b, c])
    assert refused == [1]
    torch.testing.assert_close(total, torch.stack([mine, a, c]).mean(0))


def test_reduce_with_every_contribution_bad_is_the_own_value():
    mine, a = vectors(2)
    a[0] = math.nan
    total, refused = reduce_group(mine, [a])
    assert refused == [0] and torch.equal(total, mine)


@pytest.mark.parametrize("weight", [0.0, 1 / 6, 1 / 3, 0.5])
def test_mix_is_the_weighted_average(weight):
    total, theirs = vectors(2)
    mixed = mix_groups(total, theirs, weight)
    torch.testing.assert_close(mixed, (1 - weight) * total + weight * theirs)


def test_mix_refuses_a_non_finite_partner_value():
    total, theirs = vectors(2)
    theirs[-1] = math.inf
    assert mix_groups(total, theirs, 0.25) is None


def test_round_to_wire():
    values = torch.tensor([1.0 + 2**-12, 3.0])
    assert round_to_wire(values, "fp32") is values
    rounded = round_to_wire(values, "bf16")
    assert rounded.dtype == torch.float32 and torch.equal(rounded, torch.tensor([1.0, 3.0]))
    assert torch.equal(round_to_wire(rounded, "bf16"), rounded)  # idempotent: members agree with the owner


@pytest.mark.parametrize("k", [1, 3])
def test_reduce_into_a_buffer_over_several_blocks_gives_the_bits_of_whole_passes(k):
    from peerd.worker.round.reduce import BLOCK

    mine, *received = vectors(k + 1, n=2 * BLOCK + 777)
    whole = torch.add(mine, received[0])
    for values in received[1:]:
        whole.add_(values)
    whole.div_(k + 1)
    out = torch.full_like(mine, math.nan)
    total, refused = reduce_group(mine, received, out=out)
    assert refused == [] and total.data_ptr() == out.data_ptr()
    assert torch.equal(total, whole)


def test_reduce_into_a_buffer_names_a_contribution_bad_in_a_later_block():
    from peerd.worker.round.reduce import BLOCK

    mine, a, b = vectors(3, n=2 * BLOCK + 5)
    b[2 * BLOCK + 1] = math.inf
    total, refused = reduce_group(mine, [a, b], out=torch.empty_like(mine))
    assert refused == [1]
    assert torch.equal(total, torch.add(mine, a).div_(2))


def test_mix_into_a_buffer():
    total, theirs = vectors(2)
    out = torch.empty_like(total)
    mixed = mix_groups(total, theirs, 0.25, out=out)
    assert mixed.data_ptr() == out.data_ptr() and torch.equal(mixed, torch.lerp(total, theirs, 0.25))
