"""What a script froze keeps the values it left (docs/algorithms.md, "Frozen
tensors"): through every kind of gossip round (pair, flat crossover,
hierarchical, overlapped) on every wire (fp32, bf16, int8), and through a state
transfer; the trainable rest is averaged and taken as before.

Each peer is a real TrainState and a real Rounds (the worker's), over the
in-memory transport; the peers start from different models, so an average
would change every tensor it touched."""

from __future__ import annotations

import asyncio
import logging
import textwrap
import types

import pytest
import torch
from torch import nn

from peerd.security.rejections import Rejections
from peerd.settings.jobspec import parse_job
from peerd.worker.round.rounds import Rounds
from peerd.worker.state.trainstate import TrainState
from peerd.worker.train.optim import init_state
from peerd.worker.wire.stores import Identity, SegmentServer
from peerd.worker.wire.transport import MemoryTransport

WIRES = ["fp32", "bf16", "int8"]
KINDS = {  # peers, [gossip] mode, overlap
    "pair": (2, "crossover", False),
    "flat": (3, "crossover", False),
    "hierarchical": (4, "hierarchical", False),
    "overlapped": (3, "crossover", True),
    "overlapped hierarchical": (4, "hierarchical", True),
}


def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Sequential(nn.Linear(4, 64), nn.BatchNorm1d(64)), nn.ReLU(), nn.Linear(64, 3))
    with torch.no_grad():  # statistics of their own, as a pretrained backbone has
        model[0][1].running_mean.normal_()
        model[0][1].running_var.uniform_(0.5, 2.0)
        model[0][1].num_batches_tracked.fill_(100 + seed)
    return model


class Worker:
    """One peer's model, optimizer and state (as attach() registers them), frozen
    as a fine-tuning script freezes a backbone: its Linear's bias before attach,
    its weight after (still in the gossiped vector), its BatchNorm in eval mode."""

    def __init__(self, k: int, spec, device: str = "cpu") -> None:
        self.id, self.address = f"w{k}", f"127.0.0.1:{1000 + k}"
        self.model = make_model(k).to("cpu" if device == "cpu-copy" else device)
        backbone = self.model[0]
        backbone[0].bias.requires_grad_(False)
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.SGD(trainable, lr=0.1, momentum=0.9)
        init_state(self.optimizer)
        with torch.no_grad():
            for p in trainable:
                self.optimizer.state[p]["momentum_buffer"].normal_()
        g = spec.gossip
        self.state = TrainState(self.model, self.optimizer, average_buffers=g.average_buffers,
                                average_optimizer_state=g.average_optimizer_state)
        backbone[0].weight.requires_grad_(False)
        backbone.eval()
        self.frozen = self.snapshot(frozen=True)
        self.trainable = self.snapshot(frozen=False)
        link = types.SimpleNamespace(localities={}, daemons={})
        self.rounds = Rounds(spec, self.id, self.state, link, None, Rejections(logging.getLogger("test")))
        if device == "cpu-copy":  # the path of a model off the CPU, on every machine (test_cuda.py does so too)
            self.rounds.work = torch.empty(self.state.gossiped)

    def snapshot(self, frozen: bool) -> dict[str, torch.Tensor]:
        """The frozen tensors (parameters with requires_grad False, the eval-mode
        BatchNorm's buffers, the frozen weight's momentum), or the others."""
        backbone = self.model[0]
        out = {name: t.detach().clone() for name, t in self.model.state_dict().items()
               if name.startswith("0.") == frozen}
        weight = backbone[0].weight
        if frozen and weight in self.optimizer.state:
            out["momentum of 0.0.weight"] = self.optimizer.state[weight]["momentum_buffer"].clone()
        return out


def job(kind: str, wire: str):
    peers, mode, overlap = KINDS[kind]
    return parse_job(textwrap.dedent(f"""
        [job]
        name = "frozen"
        script = "train.py"
        [gossip]
        mode = "{mode}"
        group_size = 2
        overlap = {str(overlap).lower()}
        wire = "{wire}"
        segments = 4
        average_buffers = true
        average_optimizer_state = true
    """), "frozen.toml"), peers


def wired(workers: list[Worker], wire: str) -> dict[str, str]:
    servers = {w.address: SegmentServer(Identity("frozen", "fp", w.id), w.rounds.store, len(w.rounds.layout), 256,
                                        w.rounds.stages, wire) for w in workers}
    for w in workers:
        w.rounds.transport = MemoryTransport(Identity("frozen", "fp", w.id), servers, None, wire)
    return {w.id: w.address for w in workers}


async def rounds(workers: list[Worker], view: dict[str, str], count: int) -> None:
    async def nothing() -> None:
        return None

    for _ in range(count):
        results = await asyncio.gather(*(w.rounds.next_round(view, nothing) for w in workers))
        assert all(r is None or r.misses == 0 for r in results), results
    await asyncio.gather(*(w.rounds.finish_in_flight(view) for w in workers))  # an overlapped round's correction
    for w in workers:
        w.rounds.settle_feedback()  # as before the end consensus
        await w.rounds.aclose()


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize("kind", list(KINDS))
async def test_a_round_leaves_what_the_script_froze_as_it_was(kind, wire, caplog):
    spec, peers = job(kind, wire)
    workers = [Worker(k, spec) for k in range(peers)]
    assert workers[0].rounds.state.frozen.spans(workers[0].state.gossiped)  # frozen parts in the gossiped vector
    caplog.set_level(logging.INFO, logger="peerd.worker")
    await rounds(workers, wired(workers, wire), 3)
    # Said once per worker: the frozen weight, its momentum and the BatchNorm's two statistics.
    said = [r.getMessage().partition(": ")[2] for r in caplog.records if "frozen" in r.getMessage()]
    assert said == [f"{4 * 64 + 4 * 64 + 2 * 64} of the {workers[0].state.gossiped} averaged values frozen "
                    "(requires_grad=False, or a module in eval mode): kept as they are"] * peers
    for w in workers:
        now = w.snapshot(frozen=True)
        for name, before in w.frozen.items():
            assert torch.equal(now[name], before), (w.id, name)  # bit for bit
        trained = w.snapshot(frozen=False)
        assert not torch.equal(trained["2.weight"], w.trainable["2.weight"])  # the rest was averaged
    if kind == "pair" and wire == "fp32":  # a pair round is the exact average: both hold the same head
        assert torch.equal(workers[0].model[2].weight, workers[1].model[2].weight)


@pytest.mark.parametrize("device", ["cpu-copy", pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="torch sees no CUDA device")])])
@pytest.mark.parametrize("wire", ["fp32", "int8"])
async def test_a_round_of_a_model_off_the_cpu_leaves_what_is_frozen_too(device, wire):
    """Rounds.work: the model is copied to the host, averaged there and copied
    back; what is frozen comes back as it was on the model's device."""
    spec, peers = job("flat", wire)
    workers = [Worker(k, spec, device if k == 0 else "cpu") for k in range(peers)]
    assert workers[0].rounds.work is not None
    await rounds(workers, wired(workers, wire), 3)
    if device == "cuda":
        torch.cuda.synchronize()
    for w in workers:
        now = w.snapshot(frozen=True)
        assert all(torch.equal(now[name], before) for name, before in w.frozen.items()), w.id
        assert not torch.equal(w.snapshot(frozen=False)["2.weight"], w.trainable["2.weight"])


def test_a_state_transfer_keeps_what_this_peer_froze_and_takes_the_rest(caplog):
    """A newcomer whose backbone is frozen keeps its own backbone (parameters,
    statistics, the counter, the frozen weight's momentum) and takes the donor's
    head, momentum of the head and LR."""
    spec, _ = job("flat", "fp32")
    donor, newcomer = Worker(1, spec), Worker(2, spec)
    donor.optimizer.param_groups[0]["lr"] = 0.025
    caplog.set_level(logging.INFO, logger="peerd.worker")
    newcomer.state.adopt(donor.state.vector(), donor.state.extra())
    now = newcomer.snapshot(frozen=True)
    assert all(torch.equal(now[name], before) for name, before in newcomer.frozen.items())
    assert not torch.equal(donor.frozen["0.1.running_mean"], newcomer.frozen["0.1.running_mean"])
    taken = newcomer.snapshot(frozen=False)
    assert all(torch.equal(taken[name], value) for name, value in donor.snapshot(frozen=False).items())
    head = newcomer.model[2].weight
    assert torch.equal(newcomer.optimizer.state[head]["momentum_buffer"],
                       donor.optimizer.state[donor.model[2].weight]["momentum_buffer"])
    assert newcomer.optimizer.param_groups[0]["lr"] == 0.025
    assert "kept this worker's own values of" in caplog.text
    # Unfrozen again, the same tensors are taken like any other.
    newcomer.model[0].train()
    newcomer.model[0][0].weight.requires_grad_(True)
    newcomer.state.adopt(donor.state.vector(), donor.state.extra())
    assert torch.equal(newcomer.model[0][1].running_mean, donor.model[0][1].running_mean)
    assert torch.equal(newcomer.model[0][0].weight, donor.model[0][0].weight)
    assert torch.equal(newcomer.model[0][0].bias, newcomer.frozen["0.0.bias"])  # frozen at attach: never in the state
