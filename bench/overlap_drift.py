#!/usr/bin/env python
"""In memory, no network: what the one-round delay of overlapped gossip does to the
peers' own models and to their average (docs/algorithms.md, "Overlapped rounds").

Four peers train a 784 → W → W → 10 MLP on the bundled MNIST digits with the batches
a DBS plan gave the capped-links benchmark's peers (60, 60, 4, 4 samples) and their
LRs (0.05 × b_i / mean b, SGD momentum 0.9), `period` local steps a round, and
average segment by segment over the real crossover plans (peerd.core.topology):

  plain     the round mixes the models after the steps: x ← mix(x)
  overlap   the round mixes the snapshot taken at its start and lands one round
            later: x ← x + mix(x_r) − x_r (peerd.worker.round.correction)

Every 2 rounds it prints the peers' mean and lowest own test accuracy, the
accuracy of their average, and their spread ‖x_i − x̄‖ / ‖x̄‖.

    .venv/bin/python bench/overlap_drift.py                       # plain and overlap, 8 steps, 16 rounds; overlap, 4 steps, 32 rounds
    .venv/bin/python bench/overlap_drift.py --runs overlap:8:16   # one run: MODE:PERIOD:ROUNDS

About a minute per run on 2 cores; deterministic (fixed seeds).
"""

from __future__ import annotations

import torch
from torch import nn

from harness.script import arg_parser, run_main
from harness.training import accuracy
from peerd.core.segments import split_even
from peerd.core.topology import plan_round
from peerd.examples.mnist import make_datasets

PEERS = ("p0", "p1", "p2", "p3")
BATCHES = {"p0": 60, "p1": 60, "p2": 4, "p3": 4}
LR = 0.05
SEGMENTS = 8


def flat(m: nn.Module) -> torch.Tensor:
    return torch.nn.utils.parameters_to_vector(m.parameters()).detach()


def mix(snaps: dict[str, torch.Tensor], round_: int, layout) -> dict[str, torch.Tensor]:
    """One flat crossover round over the snapshots: each segment averaged with the plan's source."""
    out = {}
    for p in PEERS:
        plan = plan_round("job", round_, PEERS, p, SEGMENTS)
        v = snaps[p].clone()
        for s, span in enumerate(layout):
            src = snaps[plan.sources[s]]
            v[span.start : span.stop] = 0.5 * (snaps[p][span.start : span.stop] + src[span.start : span.stop])
        out[p] = v
    return out


def run(mode: str, period: int, rounds: int, width: int) -> None:
    train, test = make_datasets()
    x, y = train.tensors
    tx, ty = test.tensors

    def model() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Flatten(), nn.Linear(784, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                             nn.Linear(width, 10))

    mean_b = sum(BATCHES.values()) / len(PEERS)
    models = {p: model() for p in PEERS}
    opts = {p: torch.optim.SGD(models[p].parameters(), lr=LR * BATCHES[p] / mean_b, momentum=0.9,
                               weight_decay=1e-4) for p in PEERS}
    layout = split_even(flat(models["p0"]).numel(), SEGMENTS)
    gen = torch.Generator().manual_seed(1)
    pending = None
    for r in range(1, rounds + 1):
        for p in PEERS:
            for _ in range(period):
                idx = torch.randint(0, len(y), (BATCHES[p],), generator=gen)
                opts[p].zero_grad()
                nn.functional.cross_entropy(models[p](x[idx]), y[idx]).backward()
                opts[p].step()
        if mode == "plain":
            mixed = mix({p: flat(models[p]) for p in PEERS}, r, layout)
            for p in PEERS:
                torch.nn.utils.vector_to_parameters(mixed[p], models[p].parameters())
        else:
            if pending is not None:  # the round before lands now
                snaps, mixed = pending
                for p in PEERS:
                    torch.nn.utils.vector_to_parameters(flat(models[p]) + mixed[p] - snaps[p], models[p].parameters())
            snaps = {p: flat(models[p]) for p in PEERS}
            pending = (snaps, mix(snaps, r, layout))
        if r % 2 == 0:
            accs = [accuracy(models[p], tx, ty, eval_mode=False) for p in PEERS]
            vs = torch.stack([flat(models[p]) for p in PEERS])
            avg = model()
            torch.nn.utils.vector_to_parameters(vs.mean(0), avg.parameters())
            spread = float((vs - vs.mean(0)).norm() / vs.mean(0).norm())
            print(f"{mode} {period} steps, round {r}: mean own {sum(accs) / len(accs):.3f} min {min(accs):.3f} "
                  f"average {accuracy(avg, tx, ty, eval_mode=False):.3f} spread {spread:.3f}", flush=True)


def parse_args(argv: list[str] | None = None):
    p = arg_parser(__doc__)
    p.add_argument("--runs", default="plain:8:16,overlap:8:16,overlap:4:32",
                   help="MODE:PERIOD:ROUNDS, comma-separated; MODE plain or overlap (default %(default)s)")
    p.add_argument("--width", type=int, default=512, help="hidden width of the MLP (default 512)")
    args = p.parse_args(argv)
    args.runs = [spec.split(":") for spec in args.runs.split(",")]
    if any(len(r) != 3 or r[0] not in ("plain", "overlap") for r in args.runs):
        p.error("--runs: MODE:PERIOD:ROUNDS, MODE plain or overlap")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(2)
    for mode, period, rounds in args.runs:
        run(mode, int(period), int(rounds), args.width)
    return 0


if __name__ == "__main__":
    run_main(main)
