#!/usr/bin/env python
"""What an owner's pause costs a job: 3 peers train the MNIST example to its end,
once with no pause and once with peer-2 paused for its owner for a third of the
run (`peerctl pause --for`, through the control API), --repeats times each,
interleaved, every run on a fresh local cluster of real daemons on 127.0.0.1.

  none     the three train the whole job
  paused   at a third of the first `none` run's time, peer-2's owner pauses it for
           a third of that time; its worker leaves the graceful way and its daemon
           joins the job again by itself when the pause ends

Per run, from the moment the three train (they start together): the seconds
until the job reached --target accuracy (the first poll at
which a training peer's evaluation showed it), until every peer finished, the
saved model's accuracy (the end consensus), and for the paused run the seconds
from the pause asked to peer-2's worker gone and from the pause's end to
peer-2 training again. Ratios are paused ÷ none in the same invocation.

    .venv/bin/python bench/pause_cost.py                  # 1 pair, ~3 min on 2 cores
    .venv/bin/python bench/pause_cost.py --repeats 2 --epochs 4 --out /tmp/pause

Every daemon is stopped by PID (LocalCluster.close) at the end of each run, also
on errors and on Ctrl+C / SIGTERM; every wait is bounded (--time-limit).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from harness.cluster import job_status, join_all, poll_until, wait_discovery
from harness.output import md_table, write_json
from harness.script import arg_parser, run_dir, run_main

from peerd.cli.localcluster import LocalCluster, default_job, job_with

JOB = "pause-cost"
PAUSED = 2  # the peer whose owner comes


def parse_args(argv=None):
    p = arg_parser(__doc__, defaults=True)
    p.add_argument("--repeats", type=int, default=1, help="runs of each variant, interleaved")
    p.add_argument("--epochs", type=int, default=3, help="the job's epochs")
    p.add_argument("--target", type=float, default=0.93, help="the accuracy whose time is measured")
    p.add_argument("--time-limit", type=float, default=600.0, help="seconds a run may take")
    p.add_argument("--out", type=Path, default=None, help="run folder (default runs/pause-cost-TIMESTAMP)")
    return p.parse_args(argv)


def one_run(out: Path, text: str, pause: tuple[float, float] | None, limit_s: float, target: float) -> dict:
    """One run; `pause`: (seconds after the start, length) of peer-2's pause."""
    with LocalCluster(3, out) as cluster:
        cluster.wait_ready()
        wait_discovery(cluster, 60)
        join_all(cluster, text)
        # The clock starts when the three train (min_peers = 3: they start together),
        # not at the join: loading a job takes seconds, and a pause then would only
        # hold the start gate.
        poll_until(lambda: all((j := job_status(cluster, p, JOB)) is not None and j.progress.round >= 1
                               for p in cluster.peers), limit_s, "the three peers to train", interval_s=0.2)
        started, row = time.monotonic(), {"target": target, "target_s": None}
        if pause is not None:
            poll_until(lambda: time.monotonic() - started >= pause[0] or _finished(_poll(cluster, started, row)),
                       limit_s, "the pause")
            asked = time.monotonic()
            with cluster.client(cluster.peers[PAUSED]) as c:
                c.pause(for_s=pause[1])
            row["left_s"] = time.monotonic() - asked
            row["back_s"] = _back(cluster, asked + pause[1], started, limit_s, row)
        poll_until(lambda: _finished(_poll(cluster, started, row)), limit_s, "every peer to finish", interval_s=0.5)
        row["finish_s"] = time.monotonic() - started
        final = [job_status(cluster, p, JOB) for p in cluster.peers]
        row["consensus_accuracy"] = dict(final[0].progress.metrics).get("consensus_accuracy", float("nan"))
        return row


def _back(cluster, resumes_at: float, started: float, limit_s: float, row: dict) -> float:
    """Seconds from the pause's end to the paused peer training again."""

    def training() -> bool:
        job = _poll(cluster, started, row)[PAUSED]
        return time.monotonic() >= resumes_at and job is not None and job.state == "running" \
            and job.progress.phase == "training"

    poll_until(training, limit_s, "the paused peer to train again", interval_s=0.2)
    return time.monotonic() - resumes_at


def _poll(cluster, started: float, row: dict) -> list:
    """Each peer's job status, read once per poll; notes the first time a peer's
    evaluation reached the target and stops the run when a worker failed."""
    jobs = [job_status(cluster, p, JOB) for p in cluster.peers]
    if any(j is not None and j.state == "failed" for j in jobs):
        raise SystemExit(f"a worker failed; logs under {cluster.out}")
    if row["target_s"] is None and any(j is not None and j.progress.metric >= row["target"] for j in jobs):
        row["target_s"] = time.monotonic() - started
    return jobs


def _finished(jobs: list) -> bool:
    return all(j is not None and j.state == "finished" for j in jobs)


def main(argv=None) -> int:
    args = parse_args(argv)
    out = run_dir(args.out, "pause-cost")
    text = job_with(default_job(), job={"name": JOB, "epochs": args.epochs, "eval_every_rounds": 10,
                                        "min_peers": 3})
    rows = []
    length = None
    for k in range(args.repeats):
        for variant in ("none", "paused"):
            pause = None if variant == "none" else (length / 3, length / 3)
            print(f"{variant} {k + 1}/{args.repeats} ...", flush=True)
            row = {"variant": variant, **one_run(out / f"{variant}-{k + 1}", text, pause, args.time_limit,
                                                 args.target)}
            length = length or row["finish_s"]
            rows.append(row)
            print(f"  {row}", flush=True)
    write_json(out / "summary.json", rows)

    def median(variant: str, key: str) -> float:
        values = [r[key] for r in rows if r["variant"] == variant and r.get(key) is not None]
        return statistics.median(values) if values else float("nan")

    cells = []
    for key, label in (("target_s", f"seconds to accuracy {args.target}"), ("finish_s", "seconds to the job's end"),
                       ("consensus_accuracy", "saved model's accuracy")):
        a, b = median("none", key), median("paused", key)
        cells.append((label, f"{a:.3g}", f"{b:.3g}", f"{b / a:.2f}×" if key != "consensus_accuracy" else
                      f"{b - a:+.3f}"))
    cells.append(("pause asked → worker gone (s)", "", f"{median('paused', 'left_s'):.2f}", ""))
    cells.append(("pause over → training again (s)", "", f"{median('paused', 'back_s'):.2f}", ""))
    print(md_table(("", "none", "paused a third", "paused ÷ none"), cells), flush=True)
    print(f"runs and logs under {out}", flush=True)
    return 0


if __name__ == "__main__":
    run_main(main)
