#!/usr/bin/env python
"""The same MNIST training as a script job and as a job module, on 3 real daemons:
does `peerd.attach` train what peerd's own loop trains?

One invocation runs, one after the other on 3 daemons on 127.0.0.1 (LocalCluster):

  module  the built-in job module (peerd/examples/mnist.toml) with the script's
          settings: 4 epochs, batch 32 per peer, SGD 0.05 with momentum 0.9 and
          weight decay 1e-4, cosine over the job, reference batch 96
  script  examples/mnist_script.toml: examples/mnist_peerd.py, the plain PyTorch
          script with peerd.attach (its own loop, optimizer and CosineAnnealingLR,
          which peerd steps to the job's position)

Reported: each peer's final test accuracy, their mean, and the wall time from the
last join to the last finish.

    .venv/bin/python bench/script_vs_module.py          # ~3 min on 2 cores
"""

from __future__ import annotations

import statistics
from pathlib import Path

from harness import ROOT
from harness.cluster import train_job
from harness.output import md_table
from harness.script import arg_parser, run_dir, run_main
from peerd.cli.localcluster import default_job, job_with

SCRIPT_JOB = ROOT / "examples" / "mnist_script.toml"


def module_job() -> str:
    """mnist.toml with the script's settings."""
    return job_with(default_job(), job={"name": "mnist-module", "epochs": 4, "eval_every_rounds": 40},
                    optimizer={"lr": 0.05, "momentum": 0.9, "weight_decay": 0.0001, "schedule": "cosine",
                               "reference_batch": 96})


def run(name: str, text: str, spec_dir: str, peers: int, out: Path) -> dict:
    jobs, wall = train_job(peers, out / name, text, spec_dir)
    accuracies = [j.progress.metric for j in jobs]
    return {"variant": name, "accuracies": accuracies, "mean": statistics.fmean(accuracies), "wall_s": wall,
            "steps": [j.progress.step for j in jobs]}


def parse_args(argv: list[str] | None = None):
    parser = arg_parser(__doc__)
    parser.add_argument("--peers", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="run directory (default runs/script-vs-module-TIMESTAMP)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = run_dir(args.out, "script-vs-module")
    results = [run("module", module_job(), "", args.peers, out),
               run("script", SCRIPT_JOB.read_text(), str(SCRIPT_JOB.parent), args.peers, out)]
    print(md_table(["variant", "test accuracy per peer", "mean", "steps per peer", "wall s"],
                   ([r["variant"], ", ".join(f"{a:.4f}" for a in r["accuracies"]), f"{r['mean']:.4f}",
                     ", ".join(map(str, r["steps"])), f"{r['wall_s']:.0f}"] for r in results)))
    return 0


if __name__ == "__main__":
    run_main(main)
