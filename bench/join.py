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

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from _harness import poll_until

from peerd.cluster import LocalCluster
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
STAMP = re.compile(r"^ts=(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})Z ")  # peerd.logs, text format, UTC


def stamp_of(log: str, needle: str) -> float:
    for line in log.splitlines():
        if needle in line and (m := STAMP.match(line)):
            return datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%f").replace(tzinfo=timezone.utc).timestamp()
    raise PeerdError(f"no {needle!r} in the newcomer's log")


def one_case(donors: int, standby: bool, out: Path) -> dict[str, float]:
    # Only the newcomer may keep a standby worker: the donors' would only load the machine.
    settings = lambda peer: {"worker": {"standby": standby and peer.index == donors}}  # noqa: E731
    with LocalCluster(donors + 1, out, settings=settings) as cluster:
        cluster.wait_ready()
        *givers, newcomer = cluster.peers
        if standby:
            daemon_log = newcomer.dir / "daemon.log"
            poll_until(lambda: "standby worker pid" in daemon_log.read_text(), 30, "the newcomer's standby")
        poll_until(lambda: all(cluster.client(p).status().peers_known == donors for p in cluster.peers), 30, "discovery")
        for peer in givers:
            cluster.client(peer).join(JOB)

        def rounds() -> int:
            return min((cluster.client(p).status().jobs or [None])[0].progress.round for p in givers)

        poll_until(lambda: rounds() >= 20, 180, "the donors to pass round 20")
        poll_until(lambda: any(j.name == "join-bench" for j in cluster.client(newcomer).jobs().jobs), 30,
                 "the newcomer's daemon to see the job")
        started = time.time()
        cluster.client(newcomer).join_by_name("join-bench")
        log_path = newcomer.dir / "state" / "jobs" / "join-bench" / "worker.log"
        log = poll_until(lambda: log_path.exists() and "training from round" in (t := log_path.read_text()) and t,
                       120, "the newcomer's first step")
        pulled = re.search(r"took the state of round \d+ .* from (.*) in ([\d.]+)s", log)
        if pulled is None or len(pulled.group(1).split(", ")) != donors:
            raise PeerdError(f"the newcomer did not take the state from {donors} donors:\n{log}")
        loading = stamp_of(log, "loading job")
        serving = stamp_of(log, "serving exchange on")
        training = stamp_of(log, "training from round")
        return {
            "total_s": training - started,
            "process_s": loading - started,
            "load_s": serving - loading,
            "pull_s": float(pulled.group(2)),
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--donors", type=int, nargs="+", default=[1, 3], help="donor counts to measure")
    parser.add_argument("--repeats", type=int, default=2, help="clusters per donor count and variant")
    parser.add_argument("--standby", choices=["both", "on", "off"], default="both",
                        help="the newcomer's daemon keeps a standby worker ([worker] standby), or not, or both in turn")
    args = parser.parse_args(argv)
    # The job's model code must be importable on every machine, the newcomer's
    # included (it joins by name, without a job file next to the code).
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(JOBS), os.environ.get("PYTHONPATH", "")]))
    variants = {"both": (False, True), "on": (True,), "off": (False,)}[args.standby]
    results: dict[tuple[int, bool], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="peerd-join-") as tmp:
        for donors in args.donors:
            for k in range(args.repeats):
                for standby in variants:  # interleaved, so load drifts hit both alike
                    case = one_case(donors, standby, Path(tmp) / f"d{donors}-{k}-{int(standby)}")
                    print(f"donors {donors} standby {'on' if standby else 'off'} run {k}: "
                          + ", ".join(f"{n} {v:.2f}" for n, v in case.items()), flush=True)
                    results.setdefault((donors, standby), []).append(case)
    print("\nmedians, s: join→first step; of which the worker process up (spawn, imports), job loaded"
          " (data, model, servers), state pulled")
    print("donors  standby    total  process     load     pull")
    for (donors, standby), cases in results.items():
        med = {n: statistics.median(c[n] for c in cases) for n in cases[0]}
        print(f"{donors:>6}  {'on' if standby else 'off':>7} {med['total_s']:>8.2f} {med['process_s']:>8.2f}"
              f" {med['load_s']:>8.2f} {med['pull_s']:>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
