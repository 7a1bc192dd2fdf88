"""How the simulator scales: rounds/s and peak memory from 64 to 1024 peers.

Each size runs in its own process (`python -m peerd.sim`), so the peak RSS read
from its summary.json is that size's alone. Prints a markdown table.

    .venv/bin/python bench/sim_scale.py --peers 64,128,256,512,1024 --rounds 50
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from harness.output import md_row, md_table
from harness.script import arg_parser, numbers, run_main


def parse_args(argv: list[str] | None = None):
    p = arg_parser(__doc__, raw=True, description=__doc__)
    p.add_argument("--peers", default="64,128,256,512,1024", help="comma list of peer counts")
    p.add_argument("--algorithm", default="crossover,hierarchical,sgp", help="comma list of algorithms")
    p.add_argument("--rounds", type=int, default=50, help="rounds per run (default 50)")
    p.add_argument("--batch-per-peer", type=int, default=4, help="local batch; global = peers × this (default 4)")
    p.add_argument("--model", default="logreg", help="logreg or mlp (default logreg)")
    args = p.parse_args(argv)
    args.peers = numbers(p, args.peers, int, "--peers")
    return args


def run_size(algorithm: str, peers: int, args, out: Path) -> dict:
    """One simulation in its own process; its summary.json."""
    cmd = [sys.executable, "-m", "peerd.sim", "--peers", str(peers), "--algorithm", algorithm,
           "--rounds", str(args.rounds), "--global-batch", str(peers * args.batch_per_peer),
           "--model", args.model, "--out", str(out), "--no-plot", "--quiet", "--eval-peers", "16"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return json.loads(next(out.glob("*/summary.json")).read_text())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(md_table(["algorithm", "peers", "rounds", "wall s", "rounds/s", "CPU s", "rounds per CPU s",
                    "peak RSS MiB", "bytes/peer/round", "simulated s"]))
    with tempfile.TemporaryDirectory() as tmp:
        for algorithm in args.algorithm.split(","):
            for peers in args.peers:
                s = run_size(algorithm, peers, args, Path(tmp) / f"{algorithm}-{peers}")
                print(md_row([algorithm, peers, s["rounds"], f"{s['real_time_s']:.1f}", f"{s['rounds_per_s']:.2f}",
                              f"{s['cpu_time_s']:.1f}", f"{s['rounds_per_cpu_s']:.2f}", f"{s['peak_rss_mib']:.0f}",
                              f"{s['bytes_per_peer_per_round'] / 1e3:.1f} kB", f"{s['sim_time_s']:.2f}"]), flush=True)
    return 0


if __name__ == "__main__":
    run_main(main)
