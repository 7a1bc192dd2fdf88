#!/usr/bin/env python
"""How often the example job collapses: one process against peers' averaging.

The built-in example's CNN with its SGD recipe (momentum 0.9, weight decay,
cosine over 8 epochs, batch 32 per peer) is trained in this one process, once
per data order, in each variant:

  single  one model, batch 32, the given LR unscaled: a script run alone.
  peers   4 models joining at steps 0, 16, 17 and 32 as in the two-rack test,
          each taking the state (weights and momentum) of the first; after
          every step the hierarchical round's arithmetic (peerd.worker.round.reduce):
          the mean over each rack of 2, mixed with the other rack's mean
          (w = ½·min|H|/|G|), rounded to the wire (fp32 or bf16); the LR follows
          peerd's law for the global batch (peerd.core.lr.ScaleRamp).

each with and without clipping the gradient's norm at 1.0. A run has collapsed
when its test accuracy ends below 0.2 (chance is 0.1; a collapsed model
predicts one class). Only the arithmetic of the rounds is emulated here, no
network: the question is whether averaging changes the job's own stability.

    .venv/bin/python bench/stability.py --lr 0.1 --orders 12     # ~10 min on 2 cores
    .venv/bin/python bench/stability.py --lr 0.05 --orders 40 --variants single

Writes runs.csv and summary.json under --out (default runs/stability-TIMESTAMP).
"""

from __future__ import annotations

import copy
import math
import time
from pathlib import Path

import torch

from harness.output import write_csv, write_json
from harness.script import arg_parser, names, run_dir, run_main
from peerd.core.lr import ScaleRamp
from peerd.examples.mnist import make_datasets, make_model
from peerd.worker.round.reduce import mix_groups, round_to_wire

VARIANTS = ("single", "peers-fp32", "peers-bf16")
JOINS = (0, 16, 17, 32)  # the step each of the 4 peers starts at
RACKS = ((0, 1), (2, 3))
EPOCHS, BATCH, REFERENCE = 8, 32, 96


def parse_args(argv: list[str] | None = None):
    p = arg_parser(__doc__)
    p.add_argument("--lr", type=float, default=0.1, help="the job's LR at the reference batch of 96 (default 0.1)")
    p.add_argument("--orders", type=int, default=12, help="data orders (runs per variant; default 12)")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated from {', '.join(VARIANTS)}")
    p.add_argument("--clip", default="0,1", help="clip norms to try, comma-separated; 0: none (default 0,1)")
    p.add_argument("--out", type=Path, default=None, help="run directory (default runs/stability-TIMESTAMP)")
    args = p.parse_args(argv)
    args.variants = names(p, args.variants, VARIANTS, "--variants")
    args.clip = [float(v) for v in args.clip.split(",")]
    return args


def _load(model: torch.nn.Module, vector: torch.Tensor) -> None:
    torch.nn.utils.vector_to_parameters(vector, model.parameters())


class Run:
    """One variant on one data order."""

    def __init__(self, data, lr: float, clip: float, order: int) -> None:
        self.x, self.y = data
        self.lr, self.clip = lr, clip
        self.order = torch.Generator().manual_seed(order)
        self.perm, self.pos = torch.randperm(len(self.y), generator=self.order), 0

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.pos + BATCH > len(self.y):
            self.perm, self.pos = torch.randperm(len(self.y), generator=self.order), 0
        idx = self.perm[self.pos : self.pos + BATCH]
        self.pos += BATCH
        return self.x[idx], self.y[idx]

    def step(self, model, optimizer, lr: float) -> None:
        for group in optimizer.param_groups:
            group["lr"] = lr
        x, y = self.batch()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        if self.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), self.clip)
        optimizer.step()


def _optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.0, momentum=0.9, weight_decay=1e-4)


def train_single(run: Run) -> torch.nn.Module:
    torch.manual_seed(0)
    model = make_model()
    optimizer = _optimizer(model)
    steps = EPOCHS * len(run.y) // BATCH
    for step in range(steps):  # the LR as given: a script alone knows no law
        run.step(model, optimizer, run.lr * 0.5 * (1 + math.cos(math.pi * step / steps)))
    return model


def train_peers(run: Run, wire: str) -> torch.nn.Module:
    torch.manual_seed(0)
    models, optimizers = [], []
    ramp = ScaleRamp(reference_batch=REFERENCE)
    total, done, step = EPOCHS * len(run.y), 0, 0
    while done < total:
        while len(models) < len(JOINS) and JOINS[len(models)] <= step:  # a join takes peer-0's state
            model = copy.deepcopy(models[0]) if models else make_model()
            optimizer = _optimizer(model)
            if optimizers:
                optimizer.load_state_dict(optimizers[0].state_dict())
            models.append(model)
            optimizers.append(optimizer)
        ramp.set_batch(BATCH * len(models), step)
        lr = run.lr * ramp.scale(step) * 0.5 * (1 + math.cos(math.pi * done / total))
        for model, optimizer in zip(models, optimizers):
            run.step(model, optimizer, lr)
        done += BATCH * len(models)
        _average(models, wire)
        step += 1
    return models[0]


def _average(models: list[torch.nn.Module], wire: str) -> None:
    """The hierarchical round's result on every member (all reached in time)."""
    racks = [[i for i in rack if i < len(models)] for rack in RACKS]
    racks = [rack for rack in racks if rack]
    means = [torch.stack([torch.nn.utils.parameters_to_vector(models[i].parameters()).detach() for i in rack]).mean(0) for rack in racks]
    if len(racks) == 2:
        small = min(map(len, racks))
        means = [mix_groups(means[g], means[1 - g], 0.5 * small / len(racks[g])) for g in range(2)]
    for rack, mean in zip(racks, means):
        for i in rack:
            _load(models[i], round_to_wire(mean, wire))


@torch.no_grad()
def accuracy(model: torch.nn.Module, test) -> float:
    x, y = test.tensors
    return float((model(x).argmax(1) == y).float().mean())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    out = run_dir(args.out, "stability")
    train, test = make_datasets()
    rows, summary = [], {}
    for variant in args.variants:
        for clip in args.clip:
            accs = []
            for order in range(args.orders):
                started = time.monotonic()
                run = Run(train.tensors, args.lr, clip, order)
                model = train_single(run) if variant == "single" else train_peers(run, variant.split("-")[1])
                accs.append(accuracy(model, test))
                rows.append({"variant": variant, "clip": clip, "order": order, "accuracy": round(accs[-1], 4),
                             "seconds": round(time.monotonic() - started, 1)})
                print(f"{variant} clip {clip:g} order {order}: accuracy {accs[-1]:.3f}", flush=True)
            collapsed = sum(a < 0.2 for a in accs)
            live = [a for a in accs if a >= 0.2]
            summary[f"{variant} clip {clip:g}"] = {"collapsed": collapsed, "runs": len(accs),
                                                   "mean_live_accuracy": round(sum(live) / max(1, len(live)), 4)}
    write_csv(out / "runs.csv", rows)
    write_json(out / "summary.json", {"lr": args.lr, "orders": args.orders, "results": summary})
    for name, result in summary.items():
        print(f"{name:22s} collapsed {result['collapsed']:2d} of {result['runs']}, "
              f"live runs' mean accuracy {result['mean_live_accuracy']:.3f}")
    return 0


if __name__ == "__main__":
    run_main(main)
