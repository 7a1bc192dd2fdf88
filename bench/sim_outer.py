"""The outer step against plain gossip rounds, in the simulator (docs/simulation.md,
"Result 6"): the same samples and steps for every variant, rounds every step,
every H steps, or every H steps followed by the outer step. With --groups,
hierarchical groups of that size, one a host, and the variants with an inner tier
(`--group-every`) that averages each group between rounds (Result 8).

Each run is one `python -m peerd.sim` process; `--jobs` run side by side. Prints a
markdown table (mean ± std over the seeds) and writes every run under --out.

    .venv/bin/python bench/sim_outer.py --peers 64,256 --seeds 0,1,2 --steps 512 --jobs 2
    .venv/bin/python bench/sim_outer.py --peers 64 --groups 4,8 --variants 2,6,8,9,10,11,12
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from harness.output import md_row, md_table
from harness.script import arg_parser, names, numbers, run_main

VARIANTS = {
    "every step": ["--period", "1"],
    "every 8": ["--period", "8"],
    "every 32": ["--period", "32"],
    "outer 8, lr 0.7, Nesterov 0.9": ["--outer-every", "8", "--outer-lr", "0.7", "--outer-momentum", "0.9"],
    "outer 8, lr 1, Nesterov 0.5": ["--outer-every", "8", "--outer-lr", "1", "--outer-momentum", "0.5"],
    "outer 32, lr 0.7, Nesterov 0.9": ["--outer-every", "32", "--outer-lr", "0.7", "--outer-momentum", "0.9"],
    "outer 32, lr 1, Nesterov 0.5": ["--outer-every", "32", "--outer-lr", "1", "--outer-momentum", "0.5"],
    # equal weights with the step that sample weights take with DBS's 8 and 2 steps (Result 7)
    "outer 8, lr 1.36, no momentum": ["--outer-every", "8", "--outer-lr", "1.36", "--outer-momentum", "0"],
}
# The inner tier (Result 8; with --groups): between rounds each group takes its exact mean.
for _h in ("32", "8"):
    _outer = ["--outer-every", _h, "--outer-momentum", "0.5"]
    VARIANTS |= {
        f"outer {_h}, lr 0.7, Nesterov 0.5": [*_outer, "--outer-lr", "0.7"],
        f"every {_h}, groups every step": ["--period", _h, "--group-every", "1"],
        f"outer {_h}, lr 1, Nesterov 0.5, groups every step": [*_outer, "--outer-lr", "1", "--group-every", "1"],
        f"outer {_h}, lr 0.7, Nesterov 0.5, groups every step": [*_outer, "--outer-lr", "0.7", "--group-every", "1"],
        f"outer {_h}, lr 1, Nesterov 0.5, groups every 4": [*_outer, "--outer-lr", "1", "--group-every", "4"],
    }


def parse_args(argv: list[str] | None = None):
    p = arg_parser(__doc__, raw=True, description=__doc__)
    p.add_argument("--peers", default="64,256", help="comma list of peer counts (default 64,256)")
    p.add_argument("--seeds", default="0,1,2", help="comma list of seeds (default 0,1,2)")
    p.add_argument("--steps", type=int, default=512, help="local steps per run (default 512)")
    p.add_argument("--variants", default=",".join(str(k) for k in range(len(VARIANTS))),
                   help="comma list of variant numbers, 0 = " + ", ".join(f"{k} = {v}" for k, v in enumerate(VARIANTS)))
    p.add_argument("--algorithm", default="crossover", help="the simulator's algorithm (default crossover)")
    p.add_argument("--jobs", type=int, default=2, help="runs side by side (default 2)")
    p.add_argument("--out", type=Path, default=Path("sim-out/outer"), help="folder for the runs (default sim-out/outer)")
    p.add_argument("--slow", type=float, default=0.0,
                   help="every other peer at this speed from the start, with --dbs-steps (default 0 = all equal)")
    p.add_argument("--weighings", default="equal", help="comma list of equal, samples (--weigh-changes; allreduce only)")
    p.add_argument("--groups", default="0",
                   help="comma list of group sizes: hierarchical groups of that many, one group a host "
                   "(0 = --algorithm as given; default 0)")
    p.add_argument("--extra", default="", help="more simulator flags for every run, space separated")
    args = p.parse_args(argv)
    args.peers = numbers(p, args.peers, int, "--peers")
    args.seeds = numbers(p, args.seeds, int, "--seeds")
    picked = numbers(p, args.variants, int, "--variants")
    if not picked or not all(0 <= k < len(VARIANTS) for k in picked):
        p.error(f"--variants: numbers from 0 to {len(VARIANTS) - 1}")
    args.variants = [list(VARIANTS)[k] for k in picked]
    args.groups = [int(g) for g in args.groups.split(",") if g] or [0]
    if min(args.groups) < 0:
        p.error("--groups: sizes ≥ 0")
    args.weighings = names(p, args.weighings, ("equal", "samples"), "--weighings")
    return args


def run_one(variant: str, weighing: str, group: int, peers: int, seed: int, args) -> dict:
    out = args.out / f"{peers}p" / variant.replace(" ", "").replace(",", "-") / weighing / f"g{group}" / f"s{seed}"
    algorithm = ["--algorithm", "hierarchical", "--group-size", str(group), "--gpus-per-host", str(group)] \
        if group else ["--algorithm", args.algorithm]
    slow = [f"--event=speed:{k}@0={args.slow}" for k in range(1, peers, 2)] + ["--dbs-steps"] if args.slow else []
    cmd = [sys.executable, "-m", "peerd.sim", "--peers", str(peers), *algorithm,
           "--model", "mlp", "--hidden", "32", "--local-batch", "8", "--lr", "0.02", "--rounds", str(args.steps),
           "--seeds", str(seed), "--out", str(out), "--no-plot", "--quiet", "--eval-peers", "16",
           *VARIANTS[variant], *slow, *(["--weigh-changes"] if weighing == "samples" else []), *args.extra.split()]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return json.loads(next(out.glob("*/summary.json")).read_text())


def _cell(values: list[float], fmt: str) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{format(statistics.mean(values), fmt)} ± {format(sd, fmt)}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cells = [(v, w, g, n) for n in args.peers for g in args.groups for v in args.variants for w in args.weighings]
    jobs = [(*cell, s) for cell in cells for s in args.seeds]
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        done = dict(zip(jobs, pool.map(lambda j: run_one(*j, args), jobs)))
    print(md_table(["peers", "group", "rounds", "averaging", "accuracy %", "train loss", "consensus distance",
                    "averaging rounds", "bytes sent per sample", "slow-link bytes per sample"]))
    for v, w, g, n in cells:
        runs = [done[(v, w, g, n, s)] for s in args.seeds]
        print(md_row([n, g or "-", v, w, _cell([100 * r["test_accuracy_mean_peer"] for r in runs], ".1f"),
                      _cell([r["final_train_loss"] for r in runs], ".3f"),
                      _cell([r["mean_consensus_distance"] for r in runs], ".2f"), runs[0]["averaging_rounds"],
                      f"{runs[0]['bytes_per_sample']:.0f}", f"{runs[0]['slow_bytes_per_sample']:.0f}"]), flush=True)
    return 0


if __name__ == "__main__":
    run_main(main)
