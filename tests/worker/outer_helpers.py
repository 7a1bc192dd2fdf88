"""Members with the outer step in memory, for the outer step's tests: a job
file, a member (model, optimizer, training state, Rounds) and the in-memory
transport between members, on any wire."""

from __future__ import annotations

import asyncio
import logging
import textwrap
import types

import torch
from torch import nn

from peerd.security.rejections import Rejections
from peerd.settings.jobspec import parse_job
from peerd.worker.round.rounds import Rounds
from peerd.worker.state.trainstate import TrainState
from peerd.worker.train.optim import init_state
from peerd.worker.wire.stores import Identity, SegmentServer
from peerd.worker.wire.transport import MemoryTransport


def job(mode: str = "crossover", outer: str = "every = 4\n", gossip: str = ""):
    return parse_job(textwrap.dedent(f"""
        [job]
        name = "outer"
        script = "train.py"
        [gossip]
        mode = "{mode}"
        group_size = 2
        segments = 4
    """) + gossip + "[outer]\n" + outer, "outer.toml")


class Worker:
    """One member: a model, its optimizer and the state attach() registers."""

    def __init__(self, k: int, spec, seed: int = 0) -> None:
        self.id, self.address = f"w{k}", f"127.0.0.1:{1000 + k}"
        torch.manual_seed(seed)  # the shared starting point
        self.model = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 3))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)
        init_state(self.optimizer)
        g = spec.gossip
        self.state = TrainState(self.model, self.optimizer, average_buffers=g.average_buffers,
                                average_optimizer_state=g.average_optimizer_state, outer=spec.outer.enabled)
        link = types.SimpleNamespace(localities={}, daemons={})
        self.rounds = Rounds(spec, self.id, self.state, link, None, Rejections(logging.getLogger("test")))

    def local_steps(self, seed: int, common: int | None = None) -> None:
        """H local steps, stood in for by a change of the model's own (`seed`),
        and one all members share (`common`), as a shared data set gives."""
        n = self.state.gossiped
        with torch.no_grad():
            self.state.flat.vector.add_(0.05 * torch.randn(n, generator=torch.Generator().manual_seed(seed)))
            if common is not None:
                self.state.flat.vector.add_(0.5 * torch.randn(n, generator=torch.Generator().manual_seed(common)))


def wired(workers: list[Worker], wire: str = "fp32") -> dict[str, str]:
    servers = {w.address: SegmentServer(Identity("outer", "fp", w.id), w.rounds.store, len(w.rounds.layout), 256,
                                        w.rounds.stages, wire) for w in workers}
    for w in workers:
        w.rounds.transport = MemoryTransport(Identity("outer", "fp", w.id), servers, None, wire)
    return {w.id: w.address for w in workers}


async def nothing() -> None:
    return None


async def one_round(workers: list[Worker], view: dict[str, str]) -> None:
    results = await asyncio.gather(*(w.rounds.next_round(view, nothing) for w in workers))
    assert all(r is not None and r.misses == 0 for r in results), results
