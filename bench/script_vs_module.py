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

import argparse
import statistics
import sys
import time
import tomllib
from pathlib import Path

import tomli_w

from _harness import wait_finished
from peerd.cluster import LocalCluster, default_job

REPO = Path(__file__).resolve().parents[1]
SCRIPT_JOB = REPO / "examples" / "mnist_script.toml"


def module_job() -> str:
    """mnist.toml with the script's settings."""
    data = tomllib.loads(default_job().read_text())
    data["job"].update(name="mnist-module", epochs=4, eval_every_rounds=40)
    data["optimizer"].update(lr=0.05, momentum=0.9, weight_decay=0.0001, schedule="cosine", reference_batch=96)
    return tomli_w.dumps(data)


def run(name: str, text: str, spec_dir: str, peers: int, out: Path) -> dict:
    job = tomllib.loads(text)["job"]["name"]
    with LocalCluster(peers, out / name) as cluster:
        cluster.wait_ready()
        for peer in cluster.peers:
            with cluster.client(peer) as c:
                c.join(text, spec_dir)
        start = time.perf_counter()
        jobs = wait_finished(cluster, job, f"{name}: a peer failed; logs under {out / name}")
        wall = time.perf_counter() - start
    accuracies = [j.progress.metric for j in jobs]
    return {"variant": name, "accuracies": accuracies, "mean": statistics.fmean(accuracies), "wall_s": wall,
            "steps": [j.progress.step for j in jobs]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO / "runs" / time.strftime("script-vs-module-%Y%m%d-%H%M%S"))
    args = parser.parse_args(argv)
    results = [run("module", module_job(), "", args.peers, args.out),
               run("script", SCRIPT_JOB.read_text(), str(SCRIPT_JOB.parent), args.peers, args.out)]
    print("| variant | test accuracy per peer | mean | steps per peer | wall s |\n|---|---|---|---|---|")
    for r in results:
        print(f"| {r['variant']} | {', '.join(f'{a:.4f}' for a in r['accuracies'])} | {r['mean']:.4f} "
              f"| {', '.join(map(str, r['steps']))} | {r['wall_s']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
