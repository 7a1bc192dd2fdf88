"""Overlapped rounds, the math (docs/algorithms.md, "Overlapped rounds").

A round mixes the snapshot X_r while local updates U_r continue; its effect is
applied one round stale: X ← X_r + U_r + (W_r X_r − X_r) = W_r X_r + U_r.
Checked here with no network and no event loop: exactly in rationals over the
real plans, then in fp32 through peerd.worker.round.correction with N peers in memory.
"""

from __future__ import annotations

import random
from fractions import Fraction

import pytest
import torch

from peerd.core.groups import plan_hierarchical
from peerd.core.segments import split_even
from peerd.core.topology import plan_round
from peerd.worker.round.correction import PendingRound, apply_correction

PEERS = [f"p{i}" for i in range(7)]


def flat_matrix(round_: int, peers: list[str], segment: int) -> list[list[Fraction]]:
    """W[i][j]: the weight peer i's new value of `segment` gives peer j's snapshot."""
    n, index = len(peers), {p: i for i, p in enumerate(peers)}
    w = [[Fraction(0)] * n for _ in range(n)]
    for p in peers:
        source = plan_round("job", round_, peers, p, segment + 1).sources[segment]
        w[index[p]][index[p]] += Fraction(1, 2)
        w[index[p]][index[source]] += Fraction(1, 2)
    return w


def hierarchical_matrix(round_: int, peers: list[str], segment: int, size: int) -> list[list[Fraction]]:
    """Group mean, then (1 − w)·own group's mean + w·partner group's mean."""
    n, index = len(peers), {p: i for i, p in enumerate(peers)}
    view = {p: () for p in peers}
    w = [[Fraction(0)] * n for _ in range(n)]
    for p in peers:
        plan = plan_hierarchical("job", round_, view, p, segment + 1, size)
        weight = Fraction(plan.weight).limit_denominator(1000) if plan.sources[segment] else Fraction(0)
        partner = next(g for g in plan.groups if plan.sources[segment] in g) if plan.sources[segment] else ()
        for q in plan.group:
            w[index[p]][index[q]] += (1 - weight) / len(plan.group)
        for q in partner:
            w[index[p]][index[q]] += weight / len(partner)
    return w


def matmul(w, x):
    return [sum((w[i][j] * x[j] for j in range(len(x))), Fraction(0)) for i in range(len(w))]


def disagreement(x) -> Fraction:
    mean = sum(x, Fraction(0)) / len(x)
    return sum(((v - mean) ** 2 for v in x), Fraction(0))


MATRICES = [
    pytest.param(lambda r, s: flat_matrix(r, PEERS, s), id="flat"),
    pytest.param(lambda r, s: hierarchical_matrix(r, PEERS, s, 3), id="hierarchical-3+2+2"),
]


@pytest.mark.parametrize("matrix", MATRICES)
def test_stale_mixing_keeps_the_mean_exactly_and_stays_doubly_stochastic(matrix):
    rnd = random.Random(5)
    x = [Fraction(rnd.randint(-1000, 1000), 7) for _ in PEERS]
    for r in range(6):
        w = matrix(r, 0)
        assert all(sum(row) == 1 for row in w)
        assert all(sum(w[i][j] for i in range(len(w))) == 1 for j in range(len(w)))
        assert all(v >= 0 for row in w for v in row)
        u = [Fraction(rnd.randint(-50, 50), 11) for _ in PEERS]  # local steps during the round
        snapshot = list(x)
        mixed = matmul(w, snapshot)
        now = [s + d for s, d in zip(snapshot, u)]
        corrections = [m - s for m, s in zip(mixed, snapshot)]
        assert sum(corrections) == 0  # the corrections cancel over the peers
        x = [v + c for v, c in zip(now, corrections)]
        assert x == [m + d for m, d in zip(mixed, u)]  # = W X_r + U_r
        assert sum(x) == sum(snapshot) + sum(u)  # the mean moves by the local updates only


@pytest.mark.parametrize("matrix", MATRICES)
def test_without_local_updates_overlap_is_the_plain_round(matrix):
    rnd = random.Random(6)
    plain = [Fraction(rnd.randint(-1000, 1000)) for _ in PEERS]
    stale, start = list(plain), disagreement(plain)
    for r in range(8):
        w = matrix(r, 1)
        plain = matmul(w, plain)
        snapshot = list(stale)
        stale = [v + (m - s) for v, m, s in zip(stale, matmul(w, snapshot), snapshot)]
        assert stale == plain
    assert disagreement(plain) < start / 100  # and the consensus contracts as it does without overlap


# ---------------------------------------------------------------- fp32, in memory

NUMEL = 4_099
SEGMENTS = 5
MEAN_TOL = 2e-6  # fp32: a few ulps of values of magnitude ~1-3, summed over 8 peers


def mix_flat(round_: int, snapshots: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What gossip_round computes for every peer, from the plans alone."""
    layout = split_even(NUMEL, SEGMENTS)
    out = {}
    for p, mine in snapshots.items():
        plan = plan_round("job", round_, list(snapshots), p, SEGMENTS)
        mixed = torch.empty_like(mine)
        for s, span in enumerate(layout):
            theirs = snapshots[plan.sources[s]][span.start : span.stop]
            torch.add(mine[span.start : span.stop], theirs, out=mixed[span.start : span.stop]).mul_(0.5)
        out[p] = mixed
    return out


def stack_mean(vectors: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.stack([v.double() for v in vectors.values()]).mean(0)


def spread(vectors: dict[str, torch.Tensor]) -> float:
    stacked = torch.stack([v.double() for v in vectors.values()])
    return float((stacked - stacked.mean(0)).square().sum())


def test_overlapped_rounds_keep_the_mean_in_fp32_with_local_updates():
    gen = torch.Generator().manual_seed(0)
    peers = [f"p{i}" for i in range(8)]
    models = {p: torch.randn(NUMEL, generator=gen) for p in peers}
    expected = stack_mean(models)
    for r in range(10):
        snapshots = {p: v.clone() for p, v in models.items()}
        pending = {p: PendingRound(r, snapshots[p], m) for p, m in mix_flat(r, snapshots).items()}
        for p in peers:  # local steps while the round is in flight
            step = 0.01 * torch.randn(NUMEL, generator=gen)
            models[p].add_(step)
            expected += step.double() / len(peers)
        for p in peers:
            pending[p].apply(models[p])
        torch.testing.assert_close(stack_mean(models), expected, rtol=0, atol=MEAN_TOL)


def test_overlapped_rounds_contract_like_plain_rounds_without_local_updates():
    gen = torch.Generator().manual_seed(1)
    peers = [f"p{i}" for i in range(8)]
    plain = {p: torch.randn(NUMEL, generator=gen) for p in peers}
    stale = {p: v.clone() for p, v in plain.items()}
    start = spread(plain)
    for r in range(6):
        plain = mix_flat(r, plain)
        snapshots = {p: v.clone() for p, v in stale.items()}
        for p, mixed in mix_flat(r, snapshots).items():
            PendingRound(r, snapshots[p], mixed).apply(stale[p])
        for p in peers:  # x + (m − x) is m up to one rounding per value
            torch.testing.assert_close(stale[p], plain[p], rtol=0, atol=1e-6)
    # E‖D‖² contracts by (n − 2)/(2(n − 1)) = 3/7 per round for n = 8: 6 rounds ≈ 0.006.
    assert spread(stale) < 0.05 * start
    assert spread(stale) == pytest.approx(spread(plain), rel=1e-3)


def test_a_missed_round_is_no_correction():
    vector = torch.arange(6.0)
    snapshot = vector.clone()
    vector.add_(1.0)  # local steps
    PendingRound(0, snapshot, snapshot.clone()).apply(vector)  # the round kept the own value
    assert torch.equal(vector, torch.arange(6.0) + 1.0)


def test_correction_is_applied_once_and_shapes_must_match():
    pending = PendingRound(3, torch.zeros(4), torch.ones(4))
    vector = torch.zeros(4)
    pending.apply(vector)
    assert torch.equal(vector, torch.ones(4))
    with pytest.raises(RuntimeError, match="already applied"):
        pending.apply(vector)
    with pytest.raises(ValueError):
        apply_correction(torch.zeros(3), torch.zeros(4), torch.zeros(4))
    with pytest.raises(ValueError):
        PendingRound(0, torch.zeros(4), torch.zeros(5))
