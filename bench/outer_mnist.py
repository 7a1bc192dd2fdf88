#!/usr/bin/env python
"""The outer step through real daemons: the built-in example job (a CNN on the
shipped MNIST digits, SGD with momentum, 12 epochs) on three local peers that
start together, with its rounds as each variant sets them, one after the other
in one invocation (docs/algorithms.md, "The outer step", its figures table):

  p1              a round after every local step, no outer step (the example as shipped)
  p8              a round every 8 local steps, no outer step
  outer-sgd       [outer] every = 8, lr = 1, momentum = 0: the same algorithm as p8
  outer-m05       [outer] every = 8, the defaults (lr 0.7, Nesterov momentum 0.5)
  outer-lr05      [outer] every = 8, lr = 0.5, Nesterov momentum 0.9
  outer-diloco    [outer] every = 8, DiLoCo's lr 0.7 and Nesterov momentum 0.9
  outer-int8      outer-m05 with the changes on the int8 wire
  outer-overlap   outer-m05 with the outer exchange behind the next 8 steps
  outer-int8-overlap   both

Reported per variant: the test accuracy and loss of the model the peers saved
(model.pt, the consensus of the three), the rounds they ran and the seconds
from the joins to the last finish.

    .venv/bin/python bench/outer_mnist.py                         # every variant, ~7 min on 2 cores
    .venv/bin/python bench/outer_mnist.py --variants p1,outer-m05 --epochs 4

Each run's daemon logs go under --out (default runs/outer-mnist-TIMESTAMP),
with summary.json.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import tomli_w

from harness.cluster import job_dir, train_job
from harness.output import md_table, write_json
from harness.script import arg_parser, load_logged, names, run_dir, run_main
from peerd.cli.localcluster import default_job

H = 8
M05 = {"every": H, "momentum": 0.5}
# name: ([gossip] keys set, [outer] table or None)
VARIANTS = {
    "p1": ({"period_steps": 1}, None),
    "p8": ({"period_steps": H}, None),
    "outer-sgd": ({}, {"every": H, "lr": 1.0, "momentum": 0.0}),
    "outer-m05": ({}, M05),
    "outer-lr05": ({}, {"every": H, "lr": 0.5, "momentum": 0.9}),
    "outer-diloco": ({}, {"every": H, "momentum": 0.9}),
    "outer-int8": ({"wire": "int8"}, M05),
    "outer-overlap": ({"overlap": True}, M05),
    "outer-int8-overlap": ({"wire": "int8", "overlap": True}, M05),
}
PEERS = 3


def job_text(variant: str, epochs: int) -> str:
    """The example job, named after the variant, its rounds as the variant sets them."""
    gossip, outer = VARIANTS[variant]
    data = tomllib.loads(default_job().read_text())
    data["job"].update(name=f"outer-{variant}", epochs=epochs, min_peers=PEERS, eval_every_rounds=100000)
    if outer is not None:
        del data["gossip"]["period_steps"]  # [outer] every is the rounds' period
        data["outer"] = outer
    data["gossip"].update(gossip)
    return tomli_w.dumps(data)


def run(variant: str, epochs: int, out: Path) -> dict:
    text = job_text(variant, epochs)
    name = tomllib.loads(text)["job"]["name"]
    jobs, seconds = train_job(PEERS, out, text)
    record = json.loads((job_dir(out / "peer-0", name) / "model.json").read_text())
    metrics = record["metrics"]
    result = {"variant": variant, "accuracy": metrics["consensus_accuracy"], "loss": metrics["consensus_loss"],
              "rounds": max(j.progress.round for j in jobs), "seconds": seconds}
    print(f"  {variant}: accuracy {result['accuracy']:.3f}, loss {result['loss']:.3f}, {result['rounds']} rounds, "
          f"{seconds:.0f} s", flush=True)
    return result


def table(results: list[dict]) -> str:
    return md_table(["variant", "accuracy", "loss", "rounds", "seconds"],
                    [[r["variant"], f"{r['accuracy']:.3f}", f"{r['loss']:.3f}", r["rounds"], f"{r['seconds']:.0f}"]
                     for r in results])


def parse_args(argv: list[str] | None = None):
    parser = arg_parser(__doc__, defaults=True)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="which, in order (default: all)")
    parser.add_argument("--epochs", type=int, default=12, help="the job's epochs (default 12, the example's)")
    parser.add_argument("--out", type=Path, default=None, help="run directory (default runs/outer-mnist-TIMESTAMP)")
    args = parser.parse_args(argv)
    args.variants = names(parser, args.variants, VARIANTS, "--variants")
    if args.epochs < 1:
        parser.error("--epochs must be ≥ 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = run_dir(args.out, "outer-mnist")
    with load_logged() as load:
        results = [run(v, args.epochs, out / v) for v in args.variants]
    print(table(results))
    write_json(out / "summary.json", {"results": results, "load": load, "args": vars(args) | {"out": str(out)}})
    return 0


if __name__ == "__main__":
    run_main(main)
