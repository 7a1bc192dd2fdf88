#!/usr/bin/env python
"""The overhead of peerd's framework integrations: time per optimizer step of
each framework example under peerd (one peer) against the same example alone.

One invocation runs, for each framework in --frameworks, one after the other:

  alone   the example as its own docs run it: one plain process, no peerd
          (`python examples/lightning_digits.py`, `python examples/hf_charlm.py`)
  peerd   the same example as a script job (its job file, examples/*.toml, with
          --peerd: Lightning's Trainer with peerd.lightning.Peerd(), or
          peerd.transformers.Trainer) on a 1-peer local cluster (one daemon on
          127.0.0.1), so every step also pays peer.step() and its round

Both read the same data in the same batches for the same epochs, with the same
torch threads (--threads; the worker's `[worker] threads`). The examples run
unchanged under bench/jobs/fw_timed.py, which stamps the clock after every
optimizer step; a step's time is one stamp to the next (loading, forward,
backward, the optimizer and, under peerd, what follows the step), the first
--warmup steps left out. Reported: steps, median and mean ms per step, and
peerd / alone for both.

    .venv/bin/python bench/frameworks.py                  # ~2-3 min on 2 cores
    .venv/bin/python bench/frameworks.py --frameworks lightning --repeats 2

Each run's files (the worker's log, step_times.json) go under --out (default
runs/frameworks-TIMESTAMP), with summary.json.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from harness import ROOT
from harness.cluster import join_all, wait_finished
from harness.output import md_table, write_json
from harness.script import arg_parser, load_logged, names, run_dir, run_main
from peerd.cli.localcluster import LocalCluster, job_with
from peerd.errors import PeerdError

WRAPPER = ROOT / "bench" / "jobs" / "fw_timed.py"
JOB_FILES = {"lightning": ROOT / "examples" / "lightning_digits.toml", "hf": ROOT / "examples" / "hf_charlm.toml"}
LABELS = {"lightning": "Lightning (examples/lightning_digits.py)", "hf": "HF Trainer (examples/hf_charlm.py)"}
RUN_LIMIT_S = 300.0  # one run's bound: a run that takes longer has gone wrong


def env_for(threads: int) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def step_times(path: Path, warmup: int) -> list[float]:
    """Each optimizer step's seconds from step_times.json, the first `warmup` left out."""
    stamps = json.loads(path.read_text())
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    if len(gaps) <= warmup:
        raise PeerdError(f"{path}: {len(stamps)} steps stamped, too few past --warmup {warmup}")
    return gaps[warmup:]


def run_alone(framework: str, epochs: str, threads: int, out: Path) -> Path:
    out.mkdir(parents=True)
    with open(out / "output.log", "w") as log:
        done = subprocess.run([sys.executable, str(WRAPPER), framework, "--epochs", epochs], cwd=out, stdout=log,
                              stderr=subprocess.STDOUT, env=env_for(threads), timeout=RUN_LIMIT_S)
    if done.returncode != 0:
        raise PeerdError(f"{framework} alone exited with {done.returncode}; see {out / 'output.log'}")
    return out / "step_times.json"


def run_peerd(framework: str, epochs: str, threads: int, out: Path) -> Path:
    """The example's job file with the wrapper as its script, on one daemon."""
    name, length = f"fw-{framework}", float(epochs)
    length = int(length) if length.is_integer() else length  # Lightning's max_epochs must equal it
    text = job_with(JOB_FILES[framework], job={"name": name, "script": WRAPPER.name, "epochs": length,
                                               "args": [framework, "--peerd", "--epochs", epochs],
                                               "min_peers": 1})
    with LocalCluster(1, out, settings=lambda peer: {"worker": {"threads": threads}}) as cluster:
        cluster.wait_ready()
        join_all(cluster, text, str(WRAPPER.parent))
        deadline = time.monotonic() + RUN_LIMIT_S
        wait_finished(cluster, name, f"the {framework} job failed; logs under {out}",
                      on_poll=lambda statuses: time.monotonic() < deadline or _late(framework, out))
        return cluster.peers[0].dir / "state" / "jobs" / name / "step_times.json"


def _late(framework: str, out: Path) -> None:
    raise PeerdError(f"the {framework} job ran past {RUN_LIMIT_S:.0f} s; logs under {out}")


def measure(framework: str, mode: str, args, out: Path) -> dict:
    epochs = args.lightning_epochs if framework == "lightning" else args.hf_epochs
    run = run_alone if mode == "alone" else run_peerd
    started = time.monotonic()
    times = step_times(run(framework, epochs, args.threads, out), args.warmup)
    print(f"  {framework} {mode}: {len(times) + args.warmup + 1} steps, median {statistics.median(times) * 1e3:.2f} ms"
          f" (run {time.monotonic() - started:.0f} s)", flush=True)
    return {"framework": framework, "mode": mode, "steps": len(times) + args.warmup + 1,
            "median_ms": statistics.median(times) * 1e3, "mean_ms": statistics.fmean(times) * 1e3}


def table(results: list[dict]) -> str:
    rows = []
    for framework in dict.fromkeys(r["framework"] for r in results):
        mine = [r for r in results if r["framework"] == framework]
        alone = statistics.median(r["median_ms"] for r in mine if r["mode"] == "alone")
        alone_mean = statistics.median(r["mean_ms"] for r in mine if r["mode"] == "alone")
        for r in mine:
            rows.append([LABELS[framework], r["mode"], r["steps"], f"{r['median_ms']:.2f}", f"{r['mean_ms']:.2f}",
                         f"{r['median_ms'] / alone:.3f}", f"{r['mean_ms'] / alone_mean:.3f}"])
    return md_table(["framework", "run", "steps", "median ms/step", "mean ms/step", "× alone (median)",
                     "× alone (mean)"], rows)


def parse_args(argv: list[str] | None = None):
    parser = arg_parser(__doc__, defaults=True)
    parser.add_argument("--frameworks", default="lightning,hf", help="which, in order: lightning, hf")
    parser.add_argument("--lightning-epochs", default="1", help="the Lightning example's epochs (125 steps each)")
    parser.add_argument("--hf-epochs", default="1", help="the HF example's epochs (128 steps each)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads, alone and the worker's")
    parser.add_argument("--warmup", type=int, default=5, help="first steps left out of the times")
    parser.add_argument("--repeats", type=int, default=1, help="alone then peerd, this many times per framework")
    parser.add_argument("--out", type=Path, default=None, help="run directory (default runs/frameworks-TIMESTAMP)")
    args = parser.parse_args(argv)
    args.frameworks = names(parser, args.frameworks, JOB_FILES, "--frameworks")
    if not args.lightning_epochs.isdigit() or int(args.lightning_epochs) < 1:
        parser.error("--lightning-epochs: a whole number ≥ 1 (the Trainer's max_epochs)")
    if args.threads < 1 or args.warmup < 0 or args.repeats < 1:
        parser.error("--threads and --repeats must be ≥ 1, --warmup ≥ 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = run_dir(args.out, "frameworks")
    results = []
    with load_logged() as load:
        for framework in args.frameworks:
            for k in range(args.repeats):
                for mode in ("alone", "peerd"):
                    results.append(measure(framework, mode, args, out / f"{framework}-{mode}-{k}"))
    print(table(results))
    write_json(out / "summary.json", {"results": results, "load": load, "args": vars(args) | {"out": str(out)}})
    return 0


if __name__ == "__main__":
    run_main(main)
