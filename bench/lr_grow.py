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

import argparse
import math
import statistics
import sys
import time
import tomllib
from pathlib import Path

import tomli_w

from _harness import job_status
from peerd.cluster import LocalCluster, default_job

REPO = Path(__file__).resolve().parents[1]
VARIANTS = {
    "default": {},
    "jump": {"scaling": "linear", "max_scale": math.inf, "ramp_steps": 0},
}


def job_text(name: str, optimizer: dict, epochs: float) -> str:
    data = tomllib.loads(default_job().read_text())
    data["job"].update(name=name, epochs=epochs, eval_every_rounds=50)
    data["optimizer"].update({"lr": 0.05, "schedule": "constant", "reference_batch": 32, "ramp_steps": 8, **optimizer})
    return tomli_w.dumps(data)


def run(name: str, optimizer: dict, args: argparse.Namespace) -> dict:
    text = job_text(f"grow-{name}", optimizer, args.epochs)
    job = f"grow-{name}"
    with LocalCluster(args.grow, args.out / name) as cluster:
        cluster.wait_ready()
        first, *others = cluster.peers
        with cluster.client(first) as c:
            c.join(text)
        trace: list[tuple[float, int, float, float, int]] = []  # (t, round, lr, loss, global batch) of peer-0
        start = time.monotonic()
        while (j := job_status(cluster, first, job)) is None or j.progress.round < args.alone:
            time.sleep(0.5)
        before = (j.progress.lr, j.progress.loss)
        for peer in others:
            with cluster.client(peer) as c:
                c.join(text)
        while True:
            jobs = [job_status(cluster, p, job) for p in cluster.peers]
            p0 = jobs[0].progress
            trace.append((time.monotonic() - start, p0.round, p0.lr, p0.loss, p0.global_batch))
            if any(j is not None and j.state == "failed" for j in jobs):
                raise SystemExit(f"{name}: a peer failed; logs under {args.out / name}")
            if all(j is not None and j.state == "finished" for j in jobs):
                break
            time.sleep(0.5)
    # From the first round peer-0 sees the larger global batch (the newcomers serve).
    grown = next((t[1] for t in trace if t[4] > 32), None)
    after = [t for t in trace if grown is not None and grown <= t[1] <= grown + args.window]
    return {"variant": name, "lr_before": before[0], "loss_before": before[1],
            "lr_after": max((t[2] for t in after), default=math.nan),
            "loss_max_after": max((t[3] for t in after), default=math.nan),
            "accuracy": [j.progress.metric for j in jobs], "grown_at": grown,
            "batch_after": max((t[4] for t in after), default=0)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grow", type=int, default=6, help="workers after the change (default 6)")
    parser.add_argument("--alone", type=int, default=60, help="rounds peer-0 trains alone (default 60)")
    parser.add_argument("--window", type=int, default=100, help="rounds after the change to watch (default 100)")
    parser.add_argument("--epochs", type=float, default=4.0, help="epochs of the job (default 4)")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / time.strftime("lr-grow-%Y%m%d-%H%M%S"))
    args = parser.parse_args(argv)
    results = [run(name, optimizer, args) for name, optimizer in VARIANTS.items()]
    print(f"| variant | global batch grew at round | LR before → highest after | loss before → highest in "
          f"{args.window} rounds after | final test accuracy per peer (mean) |\n|---|---|---|---|---|")
    for r in results:
        acc = r["accuracy"]
        print(f"| {r['variant']} | {r['grown_at']} (to {r['batch_after']}) | {r['lr_before']:.3f} → {r['lr_after']:.3f} "
              f"| {r['loss_before']:.3f} → "
              f"{r['loss_max_after']:.3f} | {', '.join(f'{a:.3f}' for a in acc)} ({statistics.fmean(acc):.4f}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
