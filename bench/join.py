#!/usr/bin/env python
"""Join latency: from `peerctl join NAME` to the newcomer's first training step on
verified state, for a ~10M-parameter model, with 1 and with 3 donors.

Each case starts its own local cluster (real daemons on 127.0.0.1, zeroconf on
loopback): the donors join the job and train; once they are past round 20 one
more daemon joins by name, exactly as `peerctl join NAME` does. The newcomer's
worker log gives the breakdown: process start to serving (python, torch, data,
model), the parallel state pull (verified: checksums, finite values), and the
first step. Every daemon is stopped by PID at the end, also on errors.

    .venv/bin/python bench/join.py                 # donors 1 and 3, 2 repeats each
    .venv/bin/python bench/join.py --donors 3 --repeats 1
"""

from __future__ import annotations

import os
import statistics
import tempfile
from pathlib import Path

from harness.cluster import (
    join_all, join_by_name, job_status, poll_until, pulled, stamp_of, wait_discovery, wait_job_seen,
)
from harness.script import arg_parser, run_main
from peerd.cli.localcluster import LocalCluster
from peerd.errors import PeerdError

JOBS = Path(__file__).resolve().parent / "jobs"

JOB = """\
[job]
name = "join-bench"
model = "wide_mlp:make_model"
data = "wide_mlp:make_datasets"
local_batch = 32
epochs = 1000
eval_every_rounds = 1000000

[optimizer]
lr = 0.01
"""
NAME = "join-bench"


def one_case(donors: int, standby: bool, out: Path) -> dict[str, float]:
    # Only the newcomer may keep a standby worker: the donors' would only load the machine.
    settings = lambda peer: {"worker": {"standby": standby and peer.index == donors}}  # noqa: E731
    with LocalCluster(donors + 1, out, settings=settings) as cluster:
        cluster.wait_ready()
        *givers, newcomer = cluster.peers
        if standby:
            daemon_log = newcomer.dir / "daemon.log"
            poll_until(lambda: "standby worker pid" in daemon_log.read_text(), 30, "the newcomer's standby")
        wait_discovery(cluster)
        join_all(cluster, JOB, peers=givers)
        poll_until(lambda: all((j := job_status(cluster, p, NAME)) and j.progress.round >= 20 for p in givers), 180,
                   "the donors to pass round 20")
        wait_job_seen(lambda: cluster.client(newcomer), NAME)
        started, log = join_by_name(lambda: cluster.client(newcomer), newcomer.dir, NAME, 120)
    return breakdown(log, started, donors)


def breakdown(log: str, started: float, donors: int) -> dict[str, float]:
    """From the newcomer's log: join to first step, and of it the worker process
    up, the job loaded and the state pulled."""
    took = pulled(log)
    if took is None or len(took[0].split(", ")) != donors:
        raise PeerdError(f"the newcomer did not take the state from {donors} donors:\n{log}")
    loading = stamp_of(log, "loading job")
    serving = stamp_of(log, "serving exchange on")
    training = stamp_of(log, "training from round")
    return {"total_s": training - started, "process_s": loading - started, "load_s": serving - loading,
            "pull_s": took[1]}


def parse_args(argv: list[str] | None = None):
    parser = arg_parser(__doc__, defaults=True)
    parser.add_argument("--donors", type=int, nargs="+", default=[1, 3], help="donor counts to measure")
    parser.add_argument("--repeats", type=int, default=2, help="clusters per donor count and variant")
    parser.add_argument("--standby", choices=["both", "on", "off"], default="both",
                        help="the newcomer's daemon keeps a standby worker ([worker] standby), or not, or both in turn")
    return parser.parse_args(argv)


def measure(args, tmp: Path) -> dict[tuple[int, bool], list[dict[str, float]]]:
    variants = {"both": (False, True), "on": (True,), "off": (False,)}[args.standby]
    results: dict[tuple[int, bool], list[dict[str, float]]] = {}
    for donors in args.donors:
        for k in range(args.repeats):
            for standby in variants:  # interleaved, so load drifts hit both alike
                case = one_case(donors, standby, tmp / f"d{donors}-{k}-{int(standby)}")
                print(f"donors {donors} standby {'on' if standby else 'off'} run {k}: "
                      + ", ".join(f"{n} {v:.2f}" for n, v in case.items()), flush=True)
                results.setdefault((donors, standby), []).append(case)
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # The job's model code must be importable on every machine, the newcomer's
    # included (it joins by name, without a job file next to the code).
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(JOBS), os.environ.get("PYTHONPATH", "")]))
    with tempfile.TemporaryDirectory(prefix="peerd-join-") as tmp:
        results = measure(args, Path(tmp))
    print("\nmedians, s: join→first step; of which the worker process up (spawn, imports), job loaded"
          " (data, model, servers), state pulled")
    print("donors  standby    total  process     load     pull")
    for (donors, standby), cases in results.items():
        med = {n: statistics.median(c[n] for c in cases) for n in cases[0]}
        print(f"{donors:>6}  {'on' if standby else 'off':>7} {med['total_s']:>8.2f} {med['process_s']:>8.2f}"
              f" {med['load_s']:>8.2f} {med['pull_s']:>8.2f}")
    return 0


if __name__ == "__main__":
    run_main(main)
