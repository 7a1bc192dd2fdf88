#!/usr/bin/env python
"""The LR through a large membership change on real daemons.

One invocation grows a job from 1 worker to --grow workers (default 6, the most
this machine holds) on real daemons on 127.0.0.1, twice:

  default  peerd's defaults: scaling "sqrt", max_scale 2, ramp_steps 8
  jump     the linear rule, no cap, no ramp (ramp_steps 0): the LR jumps ×k at once

The job is the built-in MNIST example with lr 0.05 meant for one worker
(reference_batch 32), a constant schedule (so only the change moves the LR), and
--epochs epochs. peer-0 trains alone for --alone rounds, then the others join
together. Reported per variant: peer-0's LR and training loss (EMA) just before the
change and over the rounds after it (max loss), and every peer's final test
accuracy.

    .venv/bin/python bench/lr_grow.py            # ~6 min on 2 cores
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path

from harness.cluster import job_status, join_all, poll_until, wait_finished
from harness.output import md_table
from harness.script import arg_parser, run_dir, run_main
from peerd.cli.localcluster import LocalCluster, default_job, job_with

VARIANTS = {
    "default": {},
    "jump": {"scaling": "linear", "max_scale": math.inf, "ramp_steps": 0},
}
ALONE_S = 600.0  # bound on peer-0's rounds alone


def job_text(name: str, optimizer: dict, epochs: float) -> str:
    return job_with(default_job(), job={"name": name, "epochs": epochs, "eval_every_rounds": 50},
                    optimizer={"lr": 0.05, "schedule": "constant", "reference_batch": 32, "ramp_steps": 8,
                               **optimizer})


def grow(cluster: LocalCluster, job: str, text: str, args) -> tuple[tuple[float, float], list, list]:
    """peer-0 trains alone for --alone rounds, then the others join: peer-0's
    (LR, loss) before, its (t, round, lr, loss, global batch) at every poll after,
    and every peer's final status."""
    first, *others = cluster.peers
    join_all(cluster, text, peers=[first])
    start = time.monotonic()
    j = poll_until(lambda: (j := job_status(cluster, first, job)) is not None and j.progress.round >= args.alone and j,
                   ALONE_S, f"peer-0 to train {args.alone} rounds alone", interval_s=0.5)
    join_all(cluster, text, peers=others)
    trace: list[tuple[float, int, float, float, int]] = []

    def note(statuses: list) -> None:
        p0 = statuses[0].progress
        trace.append((time.monotonic() - start, p0.round, p0.lr, p0.loss, p0.global_batch))

    jobs = wait_finished(cluster, job, f"a peer failed; logs under {cluster.out}", 0.5, note)
    return (j.progress.lr, j.progress.loss), trace, jobs


def run(name: str, optimizer: dict, args, out: Path) -> dict:
    job = f"grow-{name}"
    with LocalCluster(args.grow, out / name) as cluster:
        cluster.wait_ready()
        before, trace, jobs = grow(cluster, job, job_text(job, optimizer, args.epochs), args)
    # From the first round peer-0 sees the larger global batch (the newcomers serve).
    grown = next((t[1] for t in trace if t[4] > 32), None)
    after = [t for t in trace if grown is not None and grown <= t[1] <= grown + args.window]
    return {"variant": name, "lr_before": before[0], "loss_before": before[1],
            "lr_after": max((t[2] for t in after), default=math.nan),
            "loss_max_after": max((t[3] for t in after), default=math.nan),
            "accuracy": [j.progress.metric for j in jobs], "grown_at": grown,
            "batch_after": max((t[4] for t in after), default=0)}


def parse_args(argv: list[str] | None = None):
    parser = arg_parser(__doc__)
    parser.add_argument("--grow", type=int, default=6, help="workers after the change (default 6)")
    parser.add_argument("--alone", type=int, default=60, help="rounds peer-0 trains alone (default 60)")
    parser.add_argument("--window", type=int, default=100, help="rounds after the change to watch (default 100)")
    parser.add_argument("--epochs", type=float, default=4.0, help="epochs of the job (default 4)")
    parser.add_argument("--out", type=Path, default=None, help="run directory (default runs/lr-grow-TIMESTAMP)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = run_dir(args.out, "lr-grow")
    results = [run(name, optimizer, args, out) for name, optimizer in VARIANTS.items()]
    print(md_table(["variant", "global batch grew at round", "LR before → highest after",
                    f"loss before → highest in {args.window} rounds after", "final test accuracy per peer (mean)"],
                   ([r["variant"], f"{r['grown_at']} (to {r['batch_after']})",
                     f"{r['lr_before']:.3f} → {r['lr_after']:.3f}", f"{r['loss_before']:.3f} → {r['loss_max_after']:.3f}",
                     f"{', '.join(f'{a:.3f}' for a in r['accuracy'])} ({statistics.fmean(r['accuracy']):.4f})"]
                    for r in results)))
    return 0


if __name__ == "__main__":
    run_main(main)
