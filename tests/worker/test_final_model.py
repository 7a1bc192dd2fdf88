"""The model at the job's end covers every buffer: BatchNorm statistics are
averaged with the parameters and integer counters take the largest value, so
peers that end together hold the same model, bit for bit."""

from __future__ import annotations

import asyncio
import io

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from peerd.core.consensus import plan_consensus

from peerd.core.segments import split_even
from peerd.worker.state.consensus import exact_average
from peerd.worker.state.endparts import final_consensus
from peerd.worker.state.finalmodel import FinalModel, decode_ints, encode_ints
from peerd.worker.wire.stores import FinalStore, Identity, SegmentServer, SnapshotStore
from peerd.worker.state.trainstate import TrainState
from peerd.worker.wire.transport import MemoryTransport

SEGMENTS = 3


def test_integers_travel_exactly_in_fp32_pieces():
    values = torch.tensor([0, 1, -1, 65535, 65536, 2**40 + 7, -(2**62), 2**63 - 1], dtype=torch.int64)
    pieces = encode_ints(values)
    assert pieces.dtype == torch.float32 and pieces.numel() == 4 * values.numel()
    assert torch.equal(decode_ints(pieces), values)


def bn_net(seed: int) -> nn.Module:
    torch.manual_seed(0)  # the same initial model, as init = "shared" gives
    net = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 2))
    gen = torch.Generator().manual_seed(seed)
    net.train()
    for _ in range(seed + 1):  # each peer saw other batches: other statistics and counts
        net(torch.randn(8, 4, generator=gen) * (seed + 1))
    return net


class Finisher:
    def __init__(self, peer_id: str, seed: int, average_buffers: bool) -> None:
        self.id = peer_id
        self.model = bn_net(seed)
        opt = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)
        self.state = TrainState(self.model, opt, average_buffers=average_buffers)
        with torch.no_grad():  # each peer's parameters differ a little too
            self.state.flat.vector.add_(seed * 0.01)
        self.layout = split_even(self.state.flat.numel, SEGMENTS)
        self.final = FinalStore()
        self.identity = Identity("job", "fp", peer_id)
        self.server = SegmentServer(self.identity, SnapshotStore(self.state.flat.numel), SEGMENTS, 64,
                                    final=self.final)

    async def conclude(self, addresses, transport):
        model = FinalModel(self.state)
        c = await final_consensus(self.id, model, self.final, addresses, self.layout, transport, 10.0)
        model.adopt(c.vector)
        return c


def saved(model: nn.Module) -> bytes:
    out = io.BytesIO()
    torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, out)
    return out.getvalue()


@pytest.mark.parametrize("average_buffers", [False, True])
async def test_peers_that_end_together_save_byte_identical_models_with_averaged_statistics(average_buffers):
    group = [Finisher(f"p{k}", k, average_buffers) for k in range(3)]
    before = [{k: v.clone() for k, v in f.model.state_dict().items()} for f in group]
    servers = {f"mem-{f.id}": f.server for f in group}
    addresses = {f.id: f"mem-{f.id}" for f in group}
    results = await asyncio.gather(*(f.conclude(addresses, MemoryTransport(f.identity, servers)) for f in group))
    assert all(r.plan.size == 3 for r in results)
    files = {saved(f.model) for f in group}
    assert len(files) == 1  # one model.pt, whoever writes it
    state = group[0].model.state_dict()
    for name in ("1.running_mean", "1.running_var", "0.weight"):
        mean = torch.stack([b[name].double() for b in before]).mean(0).float()
        torch.testing.assert_close(state[name], mean, rtol=1e-6, atol=1e-6)
    counts = [int(b["1.num_batches_tracked"]) for b in before]
    assert counts == [1, 2, 3]
    assert int(state["1.num_batches_tracked"]) == max(counts)


async def test_frozen_statistics_come_out_of_the_consensus_unchanged():
    group = [Finisher(f"p{k}", k, False) for k in range(3)]
    frozen = torch.full((6,), 2.9)  # (2.9 + 2.9 + 2.9) / 3 is not 2.9 in fp32
    for f in group:
        f.model[1].running_var.copy_(frozen)
    servers = {f"mem-{f.id}": f.server for f in group}
    addresses = {f.id: f"mem-{f.id}" for f in group}
    await asyncio.gather(*(f.conclude(addresses, MemoryTransport(f.identity, servers)) for f in group))
    assert all(torch.equal(f.model[1].running_var, frozen) for f in group)
    assert not torch.equal(group[0].model[1].running_mean, bn_net(0)[1].running_mean)  # the others were averaged


def test_buffers_of_other_float_types_are_averaged_not_taken_for_integers():
    class Net(nn.Module):
        def __init__(self, value: float) -> None:
            super().__init__()
            self.lin = nn.Linear(2, 1)
            self.register_buffer("halves", torch.tensor([0.5, 1.75], dtype=torch.float16) * value)
            self.register_buffer("steps", torch.tensor(3, dtype=torch.int32))

    net = Net(1.0)
    state = TrainState(net, torch.optim.SGD(net.parameters(), lr=0.1))
    model = FinalModel(state)
    vector = model.vector()
    with torch.no_grad():
        net.halves.zero_()
        net.steps.zero_()
    model.adopt(vector)
    assert net.halves.tolist() == [0.5, 1.75] and net.halves.dtype == torch.float16
    assert int(net.steps) == 3 and net.steps.dtype == torch.int32


async def test_a_peer_alone_keeps_its_own_model():
    f = Finisher("p0", 2, False)
    before = saved(f.model)
    servers = {"mem-p0": f.server}
    result = await f.conclude({"p0": "mem-p0"}, MemoryTransport(f.identity, servers))
    assert result.plan.alone
    assert saved(f.model) == before


def test_the_mean_of_equal_values_is_that_value_where_the_plain_sum_is_not():
    a = torch.tensor([2.9])
    assert not torch.equal((a + a + a) / 3, a)  # fp32 rounding: the sum then the division is a ulp off
    plan = plan_consensus("p0", ["p1", "p2"])
    assert torch.equal(exact_average(plan, {p: a.clone() for p in plan.members}), a)


FINITE = st.floats(-2.0**100, 2.0**100, width=32)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 9), size=st.integers(1, 40), weighted=st.booleans(), data=st.data())
def test_where_every_member_holds_the_same_value_the_average_is_that_value_bit_for_bit(n, size, weighted, data):
    """A frozen parameter or frozen BatchNorm statistics come out of the end
    consensus unchanged; every other value is the plain ordered sum, then the
    division (or the weighted sum)."""
    values = lambda: torch.tensor(data.draw(st.lists(FINITE, min_size=size, max_size=size)), dtype=torch.float32)
    common, frozen = values(), torch.tensor(data.draw(st.lists(st.booleans(), min_size=size, max_size=size)))
    models = {f"p{k}": torch.where(frozen, common, values()) for k in range(n)}
    weights = {p: data.draw(st.floats(0.1, 10.0)) for p in models} if weighted else None
    plan = plan_consensus("p0", list(models), weights)
    out = exact_average(plan, models)
    assert torch.equal(out[frozen].view(torch.int32), common[frozen].view(torch.int32))  # -0.0 stays -0.0
    plain = models[plan.members[0]] * (1 if plan.uniform else plan.weights[0])
    for peer, w in zip(plan.members[1:], plan.weights[1:]):
        plain = plain + (models[peer] if plan.uniform else models[peer] * w)
    plain = plain / plan.size if plan.uniform else plain
    same = torch.stack([m == models["p0"] for m in models.values()]).all(0)
    assert torch.equal(out[~same], plain[~same])
