#!/usr/bin/env python
"""In memory, over the worker's own rounds: the outer step on a least-squares
problem, plain and overlapped, on the fp32 and int8 wires (docs/algorithms.md,
"The outer step overlapped" and "The outer step on the int8 wire").

Four members each hold 64 rows of a 20-column least-squares problem (the same
true weights, noise 0.1), take `--every` local SGD steps (lr 0.05) between
rounds, and run peerd's Rounds (crossover, 4 segments) through real segment
servers on the in-memory transport, with [outer] as given. Prints, after the
rounds listed in `--at`, the distance of the members' average and of the
farthest member from the solution of all the data, as a fraction of where
they started.

    .venv/bin/python bench/outer_ls.py                                  # four runs, the default outer step
    .venv/bin/python bench/outer_ls.py --runs int8-overlap --anchors-every 1000000   # changes alone

Seconds per run on 2 cores; deterministic (fixed seeds).
"""

from __future__ import annotations

import asyncio
import logging
import textwrap
import types

import torch
from torch import nn

from harness.script import arg_parser, names, numbers, run_main
from peerd.security.rejections import Rejections
from peerd.settings.jobspec import parse_job
from peerd.worker.round import changes
from peerd.worker.round.rounds import Rounds
from peerd.worker.state.trainstate import TrainState
from peerd.worker.train.optim import init_state
from peerd.worker.wire.stores import Identity, SegmentServer
from peerd.worker.wire.transport import MemoryTransport

RUNS = {"fp32": ("fp32", False), "fp32-overlap": ("fp32", True), "int8": ("int8", False),
        "int8-overlap": ("int8", True)}
COLUMNS, ROWS, MEMBERS = 20, 64, 4


class Member:
    def __init__(self, k: int, spec, x: torch.Tensor, y: torch.Tensor) -> None:
        self.id, self.address = f"m{k}", f"127.0.0.1:{2000 + k}"
        torch.manual_seed(0)
        self.model = nn.Linear(COLUMNS, 1, bias=False)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05)
        init_state(self.optimizer)
        self.state = TrainState(self.model, self.optimizer, outer=True)
        link = types.SimpleNamespace(localities={}, daemons={})
        self.rounds = Rounds(spec, self.id, self.state, link, None, Rejections(logging.getLogger("bench")))
        self.x, self.y = x, y

    def local_steps(self, steps: int) -> None:
        for _ in range(steps):
            self.optimizer.zero_grad()
            ((self.model(self.x).squeeze(1) - self.y) ** 2).mean().backward()
            self.optimizer.step()


async def nothing() -> None:
    return None


def ls_job(wire: str, overlap: bool, every: int, lr: float, momentum: float):
    """The members' job: crossover in 4 segments, the outer step as given."""
    return parse_job(textwrap.dedent(f"""
        [job]
        name = "ls"
        script = "train.py"
        [gossip]
        segments = 4
        overlap = {"true" if overlap else "false"}
        wire = "{wire}"
        [outer]
        every = {every}
        lr = {lr}
        momentum = {momentum}
    """), "ls.toml")


async def distances(spec, at: list[int]) -> list[tuple[int, float, float]]:
    """Rounds of `spec` on the least-squares problem; after each round in `at`,
    the distance of the members' average and of the farthest member from the
    solution of all the data, as a fraction of the distance at the start."""
    gen = torch.Generator().manual_seed(1)
    truth = torch.randn(COLUMNS, generator=gen)
    shares = []
    for _ in range(MEMBERS):
        x = torch.randn(ROWS, COLUMNS, generator=gen)
        shares.append((x, x @ truth + 0.1 * torch.randn(ROWS, generator=gen)))
    xs, ys = torch.cat([x for x, _ in shares]), torch.cat([y for _, y in shares])
    best = torch.linalg.lstsq(xs, ys.unsqueeze(1)).solution.squeeze(1)
    members = [Member(k, spec, x, y) for k, (x, y) in enumerate(shares)]
    wire = spec.gossip.wire
    servers = {m.address: SegmentServer(Identity("ls", "fp", m.id), m.rounds.store, len(m.rounds.layout), 256,
                                        m.rounds.stages, wire) for m in members}
    for m in members:
        m.rounds.transport = MemoryTransport(Identity("ls", "fp", m.id), servers, None, wire)
    view = {m.id: m.address for m in members}
    far = float((members[0].model.weight.detach().view(-1) - best).norm())
    found = []
    for r in range(1, max(at) + 1):
        for m in members:
            m.local_steps(spec.outer.every)
        await asyncio.gather(*(m.rounds.next_round(view, nothing) for m in members))
        if r in at:
            weights = torch.stack([m.model.weight.detach().view(-1) for m in members])
            worst = max(float((w - best).norm()) for w in weights)
            found.append((r, float((weights.mean(0) - best).norm()) / far, worst / far))
    for m in members:
        await m.rounds.finish_in_flight(view)
        await m.rounds.aclose()
    return found


def parse_args(argv: list[str] | None = None):
    p = arg_parser(__doc__)
    p.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated, of {', '.join(RUNS)} (default all)")
    p.add_argument("--at", default="30,60,120", help="rounds after which to print (default %(default)s)")
    p.add_argument("--every", type=int, default=4, help="[outer] every: local steps per round (default 4)")
    p.add_argument("--lr", type=float, default=0.7, help="[outer] lr (default 0.7)")
    p.add_argument("--momentum", type=float, default=0.9, help="[outer] momentum, Nesterov (default 0.9)")
    p.add_argument("--anchors-every", type=int, default=changes.ANCHORS_EVERY,
                   help="int8: one round in this many averages the anchors (default %(default)s)")
    args = p.parse_args(argv)
    args.runs = names(p, args.runs, RUNS, "--runs")
    args.at = numbers(p, args.at, int, "--at")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(2)
    changes.ANCHORS_EVERY = args.anchors_every  # read by anchors_round at each round
    print("run            round  average  farthest   (distance to the solution / at the start)")
    for name in args.runs:
        spec = ls_job(*RUNS[name], args.every, args.lr, args.momentum)
        for r, mean, worst in asyncio.run(distances(spec, args.at)):
            print(f"{name:<14} {r:>5}  {mean:7.4f}  {worst:8.4f}")
    return 0


if __name__ == "__main__":
    run_main(main)
