#!/usr/bin/env python
"""Data loading that keeps the device busy: samples/s of peerd's training loop on
a data set whose samples take ~2 ms of CPU each to prepare (bench/jobs/slow_samples.py),
with the samples prepared in the training thread ([data] loader_workers = 0) and in
2 DataLoader worker processes (loader_workers = 2), one after the other in one
invocation. Both read exactly the same samples (peerd's sampler decides which).

    .venv/bin/python bench/loader.py            # ~1 min on 2 cores
    .venv/bin/python bench/loader.py --steps 100 --workers 0 2 4

Figures: docs/benchmarks.md, "Data loading".
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from harness.output import md_table
from harness.script import arg_parser, run_main
from peerd.settings.jobspec import parse_job
from peerd.worker.train.trainer import Trainer

HERE = Path(__file__).resolve().parent


def job(workers: int) -> str:
    return (f'[job]\nname = "slow"\nmodule = "slow_samples"\nlocal_batch = 32\nepochs = 100\n'
            f'[optimizer]\nname = "sgd"\nlr = 0.05\n[data]\nloader_workers = {workers}\nprefetch_factor = 4\n')


def measure(workers: int, steps: int, warmup: int) -> float:
    trainer = Trainer(parse_job(job(workers), "bench"), "a", str(HERE / "jobs"))
    try:
        for _ in range(warmup):  # worker processes start, the first batches fill the queue
            trainer.step(["a"])
        start, samples = time.perf_counter(), trainer.samples
        for _ in range(steps):
            trainer.step(["a"])
        return (trainer.samples - samples) / (time.perf_counter() - start)
    finally:
        trainer.close()


def parse_args(argv: list[str] | None = None):
    parser = arg_parser(__doc__, raw=True)
    parser.add_argument("--steps", type=int, default=60, help="measured steps per variant (default 60)")
    parser.add_argument("--warmup", type=int, default=10, help="steps before measuring (default 10)")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2], help="loader workers to compare")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    rates = {w: measure(w, args.steps, args.warmup) for w in args.workers}
    base = rates[args.workers[0]]
    print(md_table(["loader_workers", "samples/s", "× first"],
                   ([w, f"{rate:.0f}", f"{rate / base:.2f}"] for w, rate in rates.items())))
    return 0


if __name__ == "__main__":
    run_main(main)
