#!/usr/bin/env python
"""The language-model example job (peerd/examples/charlm.py): validation loss
of peerd's decentralised training against one process with the same total
samples and schedule.

Both variants read the job file (default peerd/examples/charlm.toml) and train
the same model from the same seed on `epochs × len(train)` samples with AdamW,
bf16 autocast and gradient clipping as the file says. The LR schedule is the
job's (peerd.core.schedule, as the worker computes it), over *global* steps of
`reference_batch` samples each:

    lr(step) = lr · min(1, (step + 1) / warmup_steps) · cosine(samples done / total samples)

Variants (run in the order given by --variants):

  single      one process, batches of `reference_batch` samples, a seeded
              permutation of the training windows per epoch; torch threads
              from --threads. The reference.
  peerd       --peers real daemons on 127.0.0.1 with the job file, as
              `peerd cluster --job charlm` runs it (each worker one thread);
              the result is the mean of the peers' final validation loss.
  peerd-bf16  `peerd` with the job's [gossip] wire = "bf16"
  peerd-int8  `peerd` with wire = "int8": blockwise int8 codes with error
              feedback (docs/algorithms.md, 'The int8 wire and error feedback').
  local-adam  a diagnostic: --peers models in one process, each with its own
              AdamW stepping on its 1/peers of the same global batches, the
              parameters averaged exactly after every step: peerd's gossip every
              step with a perfect all-reduce instead. Its gap to `single` is
              what per-peer optimizer state costs (Adam's second moment taken
              from a local batch of reference_batch/peers), not gossip.

Reported per variant: the final validation loss and perplexity, wall time of
training (the clock starts at the first step; process start, torch import and
the data's decompression are not counted), steps and samples.

    .venv/bin/python bench/charlm.py                        # every variant
    .venv/bin/python bench/charlm.py --variants single --threads 1

summary.json and curves.csv (validation loss every --eval-every steps) go
under --out (default runs/charlm-TIMESTAMP).
"""

from __future__ import annotations

import copy
import math
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

from harness import ROOT
from harness.cluster import train_job
from harness.output import write_csv, write_json
from harness.script import arg_parser, run_dir, run_main
from peerd.core.schedule import schedule_factor
from peerd.examples import charlm

Curve = Callable[[int, float, dict], None]


@dataclass(frozen=True)
class Plan:
    """What every variant trains: read once from the job file."""

    seed: int
    epochs: float
    local_batch: int
    reference_batch: int
    lr: float
    betas: tuple[float, float]
    weight_decay: float
    schedule: str
    warmup_steps: int
    grad_clip_norm: float
    precision: str

    @classmethod
    def from_job(cls, path: Path) -> Plan:
        spec = tomllib.loads(path.read_text())
        job, opt, train = spec["job"], spec["optimizer"], spec.get("train", {})
        if opt.get("name") != "adamw":
            raise SystemExit(f"{path}: this bench expects optimizer.name = 'adamw'")
        return cls(
            seed=int(job.get("seed", 0)),
            epochs=float(job["epochs"]),
            local_batch=int(job["local_batch"]),
            reference_batch=int(opt["reference_batch"]),
            lr=float(opt["lr"]),
            betas=tuple(opt.get("betas", (0.9, 0.999))),
            weight_decay=float(opt.get("weight_decay", 0.01)),
            schedule=str(opt.get("schedule", "cosine")),
            warmup_steps=int(opt.get("warmup_steps", 0)),
            grad_clip_norm=float(train.get("grad_clip_norm", 0.0)),
            precision=str(train.get("precision", "fp32")),
        )

    def lr_at(self, step: int, progress: float) -> float:
        """The job's LR at global `step` with `progress` ∈ [0, 1] of the samples done."""
        return self.lr * schedule_factor(self.schedule, progress, step, self.warmup_steps)


@dataclass
class Result:
    variant: str
    val_loss: float
    perplexity: float
    wall_s: float
    steps: int
    samples: int


def parse_args(argv: list[str] | None = None):
    p = arg_parser(__doc__)
    p.add_argument("--job", type=Path, default=ROOT / "peerd/examples/charlm.toml", help="job file")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {list(VARIANTS)}")
    p.add_argument("--threads", type=int, default=2, help="torch threads of the single process (default 2)")
    p.add_argument("--peers", type=int, default=3, help="daemons of the peerd variant, models of local-adam (default 3)")
    p.add_argument("--eval-every", type=int, default=50, help="global steps between evaluations (default 50)")
    p.add_argument("--epochs", type=float, help="override the job file's epochs")
    p.add_argument("--out", type=Path, help="output folder (default runs/charlm-TIMESTAMP)")
    return p.parse_args(argv)


def epoch_batches(n: int, batch: int, seed: int, epochs: float) -> Iterator[list[int]]:
    """Indices of `epochs` passes over range(n), a seeded permutation per epoch, in
    batches of `batch`; an epoch's last batch may be short, the last one is cut at
    epochs × n samples."""
    left = round(epochs * n)
    epoch = 0
    while left > 0:
        order = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch)).tolist()
        order = order[:left]
        left -= len(order)
        epoch += 1
        for start in range(0, len(order), batch):
            yield order[start : start + batch]


def evaluate(model: torch.nn.Module, test: Dataset, plan: Plan) -> dict[str, float]:
    """As peerd calls the job's evaluate: no_grad, eval mode, collated test batches."""
    model.eval()
    with torch.no_grad():
        metrics = charlm.evaluate(model, DataLoader(test, batch_size=plan.local_batch))
    model.train()
    return metrics


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch, lr: float, plan: Plan) -> None:
    """As the worker steps: LR, autocast forward, backward, clipping, optimizer step."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=plan.precision == "bf16"):
        value = charlm.loss(model, batch)
    optimizer.zero_grad(set_to_none=True)
    value.backward()
    if plan.grad_clip_norm > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), plan.grad_clip_norm)
    optimizer.step()


def _models(plan: Plan, args, n: int) -> tuple[list, list]:
    """n copies of the job's model from its seed, each with its own AdamW."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(plan.seed)
    first = charlm.make_model()
    models = [first] + [copy.deepcopy(first) for _ in range(n - 1)]
    return models, [torch.optim.AdamW(m.parameters(), lr=plan.lr, betas=plan.betas, weight_decay=plan.weight_decay)
                    for m in models]


def _loop(name: str, plan: Plan, args, curve: Curve, step: Callable, model, data) -> Result:
    """The in-process variants: global batches of reference_batch samples of the
    job's epochs, each trained by step(indices, lr); `model` evaluated every
    --eval-every steps and at the end."""
    train, test = data
    total = round(plan.epochs * len(train))
    steps = samples = 0
    start = time.perf_counter()
    for indices in epoch_batches(len(train), plan.reference_batch, plan.seed, plan.epochs):
        step(indices, plan.lr_at(steps, samples / total))
        steps, samples = steps + 1, samples + len(indices)
        if steps % args.eval_every == 0:
            curve(steps, time.perf_counter() - start, evaluate(model, test, plan))
    wall = time.perf_counter() - start
    final = evaluate(model, test, plan)
    curve(steps, wall, final)
    return Result(name, final["val_loss"], final["perplexity"], wall, steps, samples)


def _batch(train: Dataset, indices: list[int]):
    return torch.utils.data.default_collate([train[i] for i in indices])


def run_single(plan: Plan, args, curve: Curve) -> Result:
    """One process, global batches of reference_batch samples."""
    (model,), (optimizer,) = _models(plan, args, 1)
    data = charlm.make_datasets()
    return _loop("single", plan, args, curve,
                 lambda indices, lr: train_step(model, optimizer, _batch(data[0], indices), lr, plan), model, data)


def run_local_adam(plan: Plan, args, curve: Curve) -> Result:
    """A diagnostic: --peers models in one process, each with its own AdamW, each
    stepping on its 1/peers of every global batch, parameters averaged exactly
    after every step. What peerd's gossip every step would reach with a perfect
    all-reduce of the parameters; the gap to `single` is that of per-peer optimizer
    state (Adam's second moment from a local batch), not of gossip."""
    models, optimizers = _models(plan, args, args.peers)
    data = charlm.make_datasets()

    def step(indices: list[int], lr: float) -> None:
        for k, (model, optimizer) in enumerate(zip(models, optimizers)):
            part = indices[k :: args.peers]
            if part:
                train_step(model, optimizer, _batch(data[0], part), lr, plan)
        with torch.no_grad():
            for tensors in zip(*(m.parameters() for m in models)):
                mean = torch.stack(tensors).mean(0)
                for t in tensors:
                    t.copy_(mean)

    return _loop("local-adam", plan, args, curve, step, models[0], data)


def run_peerd(plan: Plan, args, curve: Curve, wire: str = "") -> Result:
    """--peers real daemons on 127.0.0.1 (peerd.cli.localcluster.LocalCluster), each joined to
    the job file: what `peerd cluster --job charlm` runs. The clock starts when the
    last peer has joined; the result is the mean of the peers' final val_loss.
    `wire`, if given, replaces the job's [gossip] wire."""
    from peerd.cli.localcluster import job_with
    from peerd.settings.jobspec import load_job

    _, text = load_job(args.job)
    if wire:
        text = job_with(args.job, gossip={"wire": wire})
    name = f"peerd-{wire}" if wire else "peerd"
    jobs, wall = train_job(args.peers, args.out_dir / name, text, str(args.job.resolve().parent), interval_s=2.0)
    losses = [j.progress.metrics["val_loss"] for j in jobs]
    val = sum(losses) / len(losses)
    steps = max(j.progress.step for j in jobs)
    curve(steps, wall, {"val_loss": val, "perplexity": math.exp(val)})
    print(f"   {name} per peer: {', '.join(f'{v:.4f}' for v in losses)}", flush=True)
    return Result(name, val, math.exp(val), wall, steps, sum(j.progress.samples for j in jobs))


VARIANTS: dict[str, Callable[[Plan, object, Curve], Result]] = {
    "single": run_single,
    "peerd": run_peerd,
    "peerd-bf16": lambda plan, args, curve: run_peerd(plan, args, curve, "bf16"),
    "peerd-int8": lambda plan, args, curve: run_peerd(plan, args, curve, "int8"),
    "local-adam": run_local_adam,
}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = Plan.from_job(args.job)
    if args.epochs is not None:
        plan = Plan(**{**asdict(plan), "epochs": args.epochs})
    out = args.out_dir = run_dir(args.out, "charlm")
    results, rows = [], []
    for name in args.variants.split(","):
        if name not in VARIANTS:
            raise SystemExit(f"unknown variant {name!r}; known: {list(VARIANTS)}")

        def curve(step: int, wall: float, metrics: dict, name: str = name) -> None:
            rows.append({"variant": name, "step": step, "wall_s": round(wall, 2), **metrics})
            print(f"{name:>10} step {step:5d}  {wall:7.1f} s  val_loss {metrics['val_loss']:.4f}", flush=True)

        results.append(VARIANTS[name](plan, args, curve))
    write_csv(out / "curves.csv", rows, ["variant", "step", "wall_s", "val_loss", "perplexity"])
    write_json(out / "summary.json", {"plan": asdict(plan), "results": [asdict(r) for r in results]}, indent=2)
    print(f"\n{'variant':>10}  {'val_loss':>8}  {'ppl':>6}  {'wall s':>7}  {'steps':>5}  {'samples':>7}")
    for r in results:
        print(f"{r.variant:>10}  {r.val_loss:8.4f}  {r.perplexity:6.2f}  {r.wall_s:7.1f}  {r.steps:5d}  {r.samples:7d}")
    print(f"uniform guess: ln({len(charlm.VOCAB)}) = {math.log(len(charlm.VOCAB)):.4f}; outputs in {out}")
    return 0


if __name__ == "__main__":
    run_main(main)
