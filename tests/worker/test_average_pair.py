"""One pass over received values (peerd.worker.round.shared.average_pair): the
average is checked instead of the input, and a bad input leaves the own values."""

from __future__ import annotations

import math

import pytest
import torch

from peerd.core.segments import split_even
from peerd.core.topology import plan_round
from peerd.worker.wire.codec import fill_values, finite_by_sum
from peerd.worker.round.crossover import gossip_round
from peerd.worker.round.context import RoundBuffers, RoundContext, RoundInputs
from peerd.worker.round.shared import average_pair
from peerd.worker.wire.stores import StageStore


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("in_place", [False, True])
def test_a_non_finite_value_leaves_the_own_values(bad, in_place):
    own = torch.randn(1000)
    before = own.clone()
    theirs = torch.randn(1000)
    theirs[517] = bad
    into = own if in_place else torch.full((1000,), 7.0)
    assert not average_pair(own, theirs, into, own_first=True)
    assert torch.equal(into, before) and torch.equal(own, before)


@pytest.mark.parametrize("in_place", [False, True])
def test_both_peers_of_a_pair_get_the_same_bits(in_place):
    gen = torch.Generator().manual_seed(2)
    a, b = torch.randn(100_000, generator=gen), torch.randn(100_000, generator=gen)
    expected = (a.double() + b.double()) / 2
    out_a = a.clone() if in_place else torch.empty_like(a)
    out_b = b.clone() if in_place else torch.empty_like(b)
    assert average_pair(out_a if in_place else a, b, out_a, own_first=True)
    assert average_pair(out_b if in_place else b, a, out_b, own_first=False)
    assert torch.equal(out_a, out_b)
    torch.testing.assert_close(out_a.double(), expected, rtol=0, atol=3e-7)  # within one rounding of ½(a + b)


def test_finite_by_sum():
    assert finite_by_sum(torch.randn(10_000)) and finite_by_sum(torch.empty(0))
    for bad in (math.nan, math.inf, -math.inf):
        x = torch.randn(10_000)
        x[-1] = bad
        assert not finite_by_sum(x)
    both = torch.tensor([math.inf, -math.inf])
    assert not finite_by_sum(both)


class UncheckedTransport:
    """A transport that leaves the non-finite check to the round, filling what
    each partner 'sent' (a dict of vectors) with fill_values(check_finite=False)."""

    def __init__(self, vectors: dict[str, torch.Tensor], layout) -> None:
        self.vectors, self.layout = vectors, layout

    async def fetch_segment(self, address, round_, segment, out, timeout, stage=0):
        span = self.layout[segment]
        data = self.vectors[address][span.start : span.stop].numpy()
        fill_values(out, 0, out.numel(), data, 0, check_finite=False)


async def test_the_round_refuses_a_poisoned_segment_that_the_transport_let_through():
    numel, segments = 1000, 4
    layout = split_even(numel, segments)
    mine, theirs = torch.randn(numel), torch.randn(numel)
    theirs[layout[2].start + 3] = math.nan
    plan = plan_round("job", 1, ["a", "b"], "a", segments)
    out = torch.empty(numel)
    ctx = RoundContext("a", layout, UncheckedTransport({"b": theirs}, layout), StageStore())
    buffers = RoundBuffers(mine, torch.empty(numel), 1.0, out)
    result = await gossip_round(ctx, RoundInputs(plan, {"a": "a", "b": "b"}, buffers))
    assert result.misses == 1 and "non-finite" in result.errors["b"]
    assert result.reached == {"b"}  # the other segments came and were averaged
    for s, span in enumerate(layout):
        got, own = out[span.start : span.stop], mine[span.start : span.stop]
        if s == 2:
            assert torch.equal(got, own)
        else:
            torch.testing.assert_close(got, (own + theirs[span.start : span.stop]) / 2)
    assert math.isfinite(result.disagreement)


def test_over_several_blocks_the_average_has_lerps_bits_and_a_late_bad_value_leaves_the_own_values():
    from peerd.worker.round.reduce import BLOCK

    gen = torch.Generator().manual_seed(3)
    own, theirs = torch.randn(2 * BLOCK + 11, generator=gen), torch.randn(2 * BLOCK + 11, generator=gen)
    into = torch.empty_like(own)
    assert average_pair(own, theirs, into, own_first=False)
    assert torch.equal(into, torch.lerp(theirs, own, 0.5))
    theirs[2 * BLOCK + 3] = math.nan  # in the last block: the earlier ones were written already
    assert not average_pair(own, theirs, into, own_first=True)
    assert torch.equal(into, own)
