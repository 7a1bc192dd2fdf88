#!/usr/bin/env python
"""What the `[gossip] average_buffers` and `average_optimizer_state` opt-ins cost
and buy, on a BatchNorm CNN (bench/jobs/mnist_bn.py) with AdamW.

One invocation trains 4 peers in one process, four times: parameters only, + the
BatchNorm statistics, + the Adam moments, + both. The peers are real Trainers
(peerd's loop: the job module, its data split, AdamW, the state registry); the
exchange is replaced by an exact in-memory gossip of the gossiped vector
(x_i ← (x_i + x_σ(i)) / 2 over a random derangement σ each round), so the variants
differ only in what is averaged. Reported: the gossiped elements per round (the
traffic), each peer's test accuracy with its own model, the spread of the
BatchNorm running statistics across peers, and the accuracy of the averaged model
(parameters and statistics averaged), after the same steps and seed.

    .venv/bin/python bench/optins.py                 # ~3 min on 2 cores
    .venv/bin/python bench/optins.py --epochs 2

Figures: docs/algorithms.md, "The training state".
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from harness.output import md_table
from harness.script import arg_parser, run_main
from peerd.core.rng import derive_seed
from peerd.core.topology import derangement
from peerd.settings.jobspec import parse_job
from peerd.worker.train.trainer import Trainer

HERE = Path(__file__).resolve().parent
PEERS = [f"p{i}" for i in range(4)]
VARIANTS = {
    "params": "",
    "+ buffers": "average_buffers = true",
    "+ moments": "average_optimizer_state = true",
    "+ both": "average_buffers = true\naverage_optimizer_state = true",
}


def job(gossip: str, epochs: float) -> str:
    return (f'[job]\nname = "optins"\nmodule = "mnist_bn"\nlocal_batch = 32\nepochs = {epochs}\n'
            f'eval_every_rounds = 1000\ndrop_last = true\n'
            f'[optimizer]\nname = "adamw"\nlr = 0.002\nweight_decay = 0.01\nschedule = "cosine"\n'
            f'[gossip]\n{gossip}\n')


def bn_spread(trainers: list[Trainer]) -> float:
    """Relative spread of the running means/vars across peers (0: identical)."""
    spreads = []
    for name, _ in trainers[0].model.named_buffers():
        if name.endswith(("running_mean", "running_var")):
            stack = torch.stack([dict(t.model.named_buffers())[name] for t in trainers])
            spreads.append(float((stack - stack.mean(0)).norm() / stack.mean(0).norm().clamp_min(1e-12)))
    return statistics.fmean(spreads)


def run(gossip: str, epochs: float) -> dict:
    spec = parse_job(job(gossip, epochs), "bench")
    trainers = [Trainer(spec, p, str(HERE / "jobs")) for p in PEERS]
    started, rounds = time.perf_counter(), 0
    while not all(t.done for t in trainers):
        for t in trainers:
            t.step(PEERS)
        sigma = derangement(len(trainers), derive_seed("optins", rounds))
        vectors = [t.flat.vector.clone() for t in trainers]
        for i, t in enumerate(trainers):
            t.flat.vector.add_(vectors[sigma[i]]).mul_(0.5)
        rounds += 1
    own = [t.evaluate()["accuracy"] for t in trainers]
    mean = Trainer(spec, "mean", str(HERE / "jobs"))
    with torch.no_grad():
        for name, value in mean.model.state_dict().items():
            stack = torch.stack([t.model.state_dict()[name].float() for t in trainers])
            value.copy_(stack.mean(0).to(value.dtype))
    return {"gossiped": trainers[0].state.gossiped, "state": trainers[0].state.numel, "rounds": rounds,
            "own": own, "bn_spread": bn_spread(trainers), "mean_model": mean.evaluate()["accuracy"],
            "seconds": time.perf_counter() - started}


def parse_args(argv: list[str] | None = None):
    parser = arg_parser(__doc__)
    parser.add_argument("--epochs", type=float, default=3.0, help="epochs of the 4,000 digits (default 3)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    results = {name: run(gossip, args.epochs) for name, gossip in VARIANTS.items()}
    base = results["params"]["gossiped"]
    print(md_table(["averaged", "elements per round", "× params", "own-model accuracy (min–max)",
                    "BN statistics spread", "averaged model accuracy"],
                   ([name, f"{r['gossiped']:,}", f"{r['gossiped'] / base:.2f}",
                     f"{min(r['own']):.4f}–{max(r['own']):.4f}", f"{r['bn_spread']:.4f}", f"{r['mean_model']:.4f}"]
                    for name, r in results.items())))
    return 0


if __name__ == "__main__":
    run_main(main)
