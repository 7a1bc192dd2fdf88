#!/usr/bin/env python
"""Where a group exchange's CPU goes, peerd's hierarchical round against gloo:
`perf` samples of bench/exchange_group.py, split by what ran.

Each method runs twice under `perf record` (all processes, all threads), with
--short and --long repeats; the difference between the two runs' samples, per
extra round and process, is what a round costs, with the start-up (imports,
server start, the random vectors) cancelled out. That cost includes what the
bench does around each timed repeat (the barrier, the vector's reset), the same
for both methods but for the event loop peerd's barrier runs on.

Needs `perf` (linux-tools) and the right to use it (root, or
kernel.perf_event_paranoid ≤ 1). Only 127.0.0.1 is bound, as by exchange_group.py.

    .venv/bin/python bench/exchange_profile.py                  # 4 processes, 64 MiB, 10 and 50 repeats
    .venv/bin/python bench/exchange_profile.py --procs 4 --mib 16 --short 5 --long 25
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from harness.output import md_table
from harness.script import arg_parser, run_main

HERE = Path(__file__).resolve().parent
FREQ = 1999  # samples per second per CPU

# (category, dso pattern or None, symbol pattern), first match wins
CATEGORIES = [
    ("kernel: receive copy", None, r"_copy_to_iter"),
    ("kernel: send copy", None, r"_copy_from_iter"),
    ("kernel: page faults", r"kernel", r"page_fault|clear_page|do_anonymous|memcg|pte_offset|rmqueue|folio"),
    ("kernel: TCP stack, scheduling, other", r"kernel", r""),
    ("arithmetic (mean, mix, checks)", None, r"add_kernel|div_true|lerp|gloo::sum|inner_sum|outer_sum|mul_kernel"),
    ("tensor copies", None, r"direct_copy"),
    ("Python interpreter", r"libpython", r""),
    ("other (libtorch dispatch, libc, uvloop, grpc, gloo)", r"", r""),
]


def categorise(report: str) -> dict[str, int]:
    """Samples per category from `perf report --sort dso,sym -F sample,dso,sym` lines."""
    out: dict[str, int] = {}
    for line in report.splitlines():
        parts = line.split(None, 2)
        if len(parts) < 3 or not parts[0].isdigit():
            continue
        samples, dso, sym = int(parts[0]), parts[1], parts[2]
        for name, dso_re, sym_re in CATEGORIES:
            if (dso_re is None or re.search(dso_re, dso)) and re.search(sym_re, sym):
                out[name] = out.get(name, 0) + samples
                break
    return out


def profile(method: str, repeats: int, args: argparse.Namespace, work: Path) -> dict[str, int]:
    data = work / f"{method}-{repeats}.perf"
    bench = [sys.executable, str(HERE / "exchange_group.py"), "--procs", str(args.procs), "--mib", str(args.mib),
             "--repeats", str(repeats), "--methods", method]
    run = subprocess.run(["perf", "record", "-q", "-F", str(FREQ), "-o", str(data), "--", *bench],
                         capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"perf record of {method} failed ({run.returncode}):\n{run.stderr[-2000:]}")
    row = next((line for line in run.stdout.splitlines() if line.startswith(f"| {method} |")), "")
    print(f"  {method}, {repeats} repeats: {row}", flush=True)
    report = subprocess.run(["perf", "report", "-i", str(data), "--no-children", "--sort", "dso,sym", "--stdio",
                             "-F", "sample,dso,sym"], capture_output=True, text=True, check=True).stdout
    return categorise(report)


def per_round(method: str, args: argparse.Namespace, work: Path) -> dict[str, float]:
    """ms of CPU per process per round: the long run's samples less the short run's."""
    short, long = profile(method, args.short, args, work), profile(method, args.long, args, work)
    ms = 1000.0 / FREQ / (args.procs * (args.long - args.short))
    return {name: (long.get(name, 0) - short.get(name, 0)) * ms for name, _, _ in CATEGORIES}


def table(peerd: dict[str, float], gloo: dict[str, float]) -> str:
    rows = [[name, f"{peerd[name]:.1f}", f"{gloo[name]:.1f}", f"{peerd[name] - gloo[name]:+.1f}"]
            for name in sorted(peerd, key=lambda n: -peerd[n])]
    p, g = sum(peerd.values()), sum(gloo.values())
    rows.append(["total", f"{p:.1f}", f"{g:.1f}", f"{p - g:+.1f} ({p / g:.2f}×)"])
    return md_table(["where", "peerd hierarchical, ms", "gloo, ms", "difference"], rows)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = arg_parser(__doc__, raw=True)
    p.add_argument("--procs", type=int, default=4, help="processes in the group (default 4)")
    p.add_argument("--mib", type=int, default=64, help="the vector's size in MiB (default 64)")
    p.add_argument("--short", type=int, default=10, help="repeats of the short run (default 10)")
    p.add_argument("--long", type=int, default=50, help="repeats of the long run (default 50)")
    args = p.parse_args(argv)
    if not 1 <= args.short < args.long:
        p.error("need 1 ≤ --short < --long")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if shutil.which("perf") is None:
        print("exchange_profile: `perf` is not installed (linux-tools)", file=sys.stderr)
        return 2
    print(f"{args.mib} MiB, {args.procs} processes; perf at {FREQ} Hz, {args.short} and {args.long} repeats",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="peerd-exchange-profile-") as tmp:
        costs = {m: per_round(m, args, Path(tmp)) for m in ("hier", "gloo")}
    print("\nCPU per process per round (all threads, the bench's own work around each repeat included):\n")
    print(table(costs["hier"], costs["gloo"]))
    return 0


if __name__ == "__main__":
    run_main(main)
