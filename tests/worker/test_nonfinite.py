"""A non-finite value from a partner never reaches the model, over the bulk lane.

The lane leaves stages 0 and 1 unchecked (peerd.worker.wire.codec.ROUND_CHECKED_STAGES):
the round checks what it computes from them. Stage 2 is copied as it is, so the
lane checks it. Each path is tested here with a poisoned partner on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import math

import pytest
import torch

from peerd.core.segments import split_even
from peerd.core.topology import plan_round
from peerd.errors import InvalidMessage
from peerd.worker.wire.bulk import BulkServer
from peerd.worker.wire.bulk_client import BulkClient
from peerd.worker.round.crossover import gossip_round
from peerd.worker.wire.stores import Identity, SegmentServer, SnapshotStore, StageStore

from bulk_helpers import segment_request
from hierarchy_helpers import NUMEL, VIEW, PoisonedStages, make_peers, served


def _poison(vector: torch.Tensor, layout) -> None:
    """An infinity in every segment (the NaN cases poison other stages)."""
    for span in layout:
        vector[span.start + span.size // 2] = math.inf


@pytest.mark.parametrize("wire", ["fp32", "bf16"])
async def test_the_lane_leaves_stages_0_and_1_to_the_round_and_refuses_stage_2(wire):
    store, stages = SnapshotStore(NUMEL), StageStore()
    segments = SegmentServer(Identity("job", "fp", "srv"), store, 6, 1000, stages, wire=wire)
    server = BulkServer(segments)
    port = await server.start("127.0.0.1")
    client = BulkClient(wire)
    try:
        vector = torch.randn(NUMEL)
        layout = split_even(NUMEL, 6)
        _poison(vector, layout)
        await store.publish(1, vector)
        await stages.begin(1, [2])
        await stages.put(1, 1, 2, vector[layout[2].start : layout[2].stop].clone())
        await stages.put(1, 2, 2, vector[layout[2].start : layout[2].stop].clone())
        out = torch.empty(layout[2].size)
        for stage in (0, 1):  # passed through: the round's average will be non-finite
            await client.fetch("127.0.0.1", port, segment_request(1, 2, stage=stage), out, 5.0)
            assert not torch.isfinite(out).all()
        with pytest.raises(InvalidMessage, match="non-finite"):
            await client.fetch("127.0.0.1", port, segment_request(1, 2, stage=2), out, 5.0)
    finally:
        await client.aclose()
        await server.close()


@pytest.mark.parametrize("hand_over", [False, True])
async def test_a_flat_round_keeps_the_own_values_of_a_poisoned_segment(hand_over):
    peers = make_peers({"a": (), "b": ()})
    a, b = peers["a"], peers["b"]
    poisoned = split_even(NUMEL, len(a.layout))[2]
    b.vector[poisoned.start + 5] = math.nan
    before = a.vector.clone()
    async with served(peers) as (addresses, transports):
        await b.store.publish(1, b.vector)
        into = await a.store.hand_over(1, a.vector) if hand_over else None
        if into is None:
            await a.store.publish(1, a.vector)
        plan = plan_round("job", 1, ["a", "b"], "a", len(a.layout))
        result = await gossip_round(a.context(transports["a"]), a.inputs(plan, addresses, out=into))
    got = into if hand_over else a.vector
    assert result.misses == 1 and "non-finite" in result.errors["b"]
    assert "non-finite" in result.non_finite["b"]  # the round's refusal, for the engine's rejections count
    assert torch.equal(got[poisoned.start : poisoned.stop], before[poisoned.start : poisoned.stop])
    assert torch.isfinite(got).all()
    rest = torch.ones(NUMEL, dtype=torch.bool)
    rest[poisoned.start : poisoned.stop] = False
    torch.testing.assert_close(got[rest], ((before + b.vector) / 2)[rest])


@pytest.mark.parametrize("hand_over", [False, True])
@pytest.mark.parametrize("stage", [0, 1, 2])
async def test_a_hierarchical_round_refuses_a_poisoned_stage(stage, hand_over):
    """a2 sends non-finite values in one stage: its own model (stage 0: inf), its
    group's mean to the partner group (stage 1: NaN) or its final segments to
    its group (stage 2: NaN)."""
    peers = make_peers(VIEW)
    rogue = peers["a2"]
    if stage == 0:
        _poison(rogue.vector, rogue.layout)
    else:
        rogue.stages = rogue.server.stages = PoisonedStages(stage)
    before = {p: peer.vector.clone() for p, peer in peers.items()}
    async with served(peers) as (addresses, transports):
        results = dict(zip(peers, await asyncio.gather(*(
            peer.round(1, VIEW, addresses, transports[p], hand_over=hand_over) for p, peer in peers.items()))))
    honest = [p for p in peers if p != "a2"]
    for p in honest:
        assert torch.isfinite(peers[p].vector).all(), p
    refusing = [p for p in honest if "non-finite" in results[p].errors.get("a2", "")]
    # Stages 0 and 1 are the round's to refuse (counted by the engine), stage 2 the lane's.
    counted = [p for p in honest if "a2" in results[p].non_finite]
    assert counted == (refusing if stage < 2 else []), (counted, refusing)
    if stage == 1:  # the partner group's owners that mix with a2's stage 1
        assert refusing and all(p.startswith("b") for p in refusing)
    else:  # a2's groupmates: its contribution (stage 0) or its segments (stage 2)
        assert {"a1", "a3"} <= set(refusing)  # (a NaN model also spoils a2's stages 1 and 2)
    if stage == 2:  # the segments a2 owns keep the own values
        from peerd.core.groups import plan_hierarchical

        owned = plan_hierarchical("job", 1, VIEW, "a1", len(rogue.layout), 3).owned_by("a2")
        for p in ("a1", "a3"):
            for s in owned:
                span = rogue.layout[s]
                assert torch.equal(peers[p].vector[span.start : span.stop], before[p][span.start : span.stop])
