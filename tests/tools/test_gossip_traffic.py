"""Traffic per peer per round, counted in real rounds (bench/traffic.py):
flat crossover receives and sends exactly one model whatever the number of
peers; hierarchical crossover what docs/algorithms.md says."""

from __future__ import annotations

import sys
from fractions import Fraction
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from traffic import Setup, measure  # noqa: E402

from peerd.core.groups import plan_hierarchical  # noqa: E402
from peerd.core.segments import split_even  # noqa: E402
from peerd.worker.wire.quant import wire_nbytes  # noqa: E402

SEGMENTS = 8
NUMEL = SEGMENTS * 1_250  # equal segments: counts are exact fractions of the model


def per_round(traffic, peer: str, which: str = "received") -> set[int]:
    return {rnd[peer] for rnd in getattr(traffic, which)}


@pytest.mark.parametrize("peers", [2, 4, 8])
@pytest.mark.parametrize("mode", ["crossover", "whole"])
async def test_flat_gossip_moves_exactly_one_model_per_peer_per_round(mode, peers):
    t = await measure(Setup(mode, peers, NUMEL, SEGMENTS), rounds=3)
    assert t.misses == 0
    for p in t.received[0]:
        assert per_round(t, p, "received") == {NUMEL * 4}, p
        assert per_round(t, p, "sent") == {NUMEL * 4}, p


async def test_narrow_wire_halves_the_bytes():
    t = await measure(Setup("crossover", 4, NUMEL, SEGMENTS, wire="bf16"), rounds=2)
    assert t.misses == 0
    assert {b for rnd in t.received + t.sent for b in rnd.values()} == {NUMEL * 2}


async def test_the_int8_wire_moves_a_byte_a_value_and_a_scale_a_block():
    t = await measure(Setup("crossover", 4, NUMEL, SEGMENTS, wire="int8"), rounds=2)
    assert t.misses == 0
    model = sum(wire_nbytes(span.size) for span in split_even(NUMEL, SEGMENTS))
    assert {b for rnd in t.received + t.sent for b in rnd.values()} == {model}
    assert 3.9 < NUMEL * 4 / model < 4.0


@pytest.mark.parametrize(("peers", "group_size", "models"), [
    (2, 4, Fraction(1)),         # one group of 2: 2(|G|−1)/|G|, no partner group
    (4, 4, Fraction(3, 2)),      # one group of 4
    (8, 4, Fraction(7, 4)),      # two groups of 4: 2(|G|−1)/|G| + 1/|G| = 2 − 1/|G|
    (2, 2, Fraction(1)),
    (4, 2, Fraction(3, 2)),      # two groups of 2
    (8, 2, Fraction(3, 2)),      # four groups of 2
])
async def test_hierarchical_traffic_matches_the_documented_formula(peers, group_size, models):
    setup = Setup("hierarchical", peers, NUMEL, SEGMENTS, group_size)
    t = await measure(setup, rounds=3)
    assert t.misses == 0
    # SEGMENTS is a multiple of every group size here: every owner holds the same share.
    for rnd in t.received + t.sent:
        assert set(rnd.values()) == {models * NUMEL * 4}


async def test_hierarchical_traffic_per_member_follows_its_owned_segments():
    """Unequal shares (6 segments in groups of 4, uneven segment sizes): a member
    receives every segment it does not own once, and each segment it owns from
    the |G| − 1 others and from the partner group."""
    numel, segments = 10_007, 6
    setup = Setup("hierarchical", 8, numel, segments, group_size=4)
    t = await measure(setup, rounds=2)
    assert t.misses == 0
    sizes = [span.size for span in split_even(numel, segments)]
    for r, received in enumerate(t.received, start=1):
        for p, got in received.items():
            plan = plan_hierarchical("traffic", r, setup.localities(), p, segments, 4)
            owned = plan.owned_by(p)
            expected = sum(sizes[s] * (len(plan.group) - 1 + (plan.sources[s] is not None)) for s in owned)
            expected += sum(sizes[s] for s in range(segments) if s not in owned)
            assert got == expected * 4, (r, p)
        # What one peer received another sent.
        assert sum(received.values()) == sum(t.sent[r - 1].values())


async def test_counts_are_the_same_over_grpc():
    for mode, models in (("crossover", Fraction(1)), ("hierarchical", Fraction(7, 4))):
        t = await measure(Setup(mode, 8, NUMEL, SEGMENTS, group_size=4), rounds=2, grpc=True)
        assert t.misses == 0
        for rnd in t.received + t.sent:
            assert set(rnd.values()) == {models * NUMEL * 4}, mode
