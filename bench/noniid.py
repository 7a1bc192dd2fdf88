#!/usr/bin/env python
"""Non-IID digits: each peer alone on its own classes against peerd's gossip.

The bundled digits are split by label among N peers (peerd.examples.noniid:
4/3/3 classes for 3 peers), each peer's part in its own data root, and the
built-in job digits-noniid (data_mode = "local") is trained twice, one variant
after the other, on real daemons on 127.0.0.1:

  alone   N clusters of one daemon each (each its own realm): every peer trains
          on its own classes only, for the job's epochs of its own data, so each
          trains on as many samples as in the gossip run.
  gossip  one cluster of N daemons: every peer still trains on its own classes
          only, and peerd averages the models (samples weighting).

Every peer evaluates its model on the package's 1,000 test digits of all 10
classes every 40 rounds. Alone, a peer cannot pass the fraction of the test set
its classes make up; the goal with gossip is ≥ 0.93 on every peer. Clocks start
at each variant's first step.

    .venv/bin/python bench/noniid.py                 # ~4 min on 2 cores
    .venv/bin/python bench/noniid.py --peers 5       # 2 classes each

Outputs under --out (default runs/noniid-TIMESTAMP): curves.csv, summary.json and
the daemons' logs; the plot goes to --png (default OUT/noniid.png). Every
daemon is stopped by PID at the end of its variant, also on errors and Ctrl+C.
"""

from __future__ import annotations

import json
import math
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from harness.cluster import job_status, join_all, wait_discovery
from harness.output import pyplot, save_figure, write_csv, write_json
from harness.script import arg_parser, run_dir, run_main
from peerd.security.auth import create_secret_file
from peerd.cli.localcluster import LocalCluster, builtin_job
from peerd.examples.noniid import TEST_SIZE, bundled, classes_of, write_split
from peerd.settings.jobspec import load_job

POLL_S = 0.5
GOAL = 0.93  # every peer's test accuracy with gossip


def parse_args(argv: list[str] | None = None):
    p = arg_parser(__doc__)
    p.add_argument("--peers", type=int, default=3, help="peers, each holding the digits of ~10/N classes (default 3)")
    p.add_argument("--out", type=Path, default=None, help="run directory (default runs/noniid-TIMESTAMP)")
    p.add_argument("--png", type=Path, default=None, help="where the plot goes (default OUT/noniid.png)")
    p.add_argument("--budget", type=float, default=600.0, help="give up on a variant after this many seconds")
    return p.parse_args(argv)


def ceilings(peers: int) -> list[float]:
    """The fraction of the test digits whose class peer k holds: the most it can score alone."""
    _, labels = bundled()
    test = labels[:TEST_SIZE]
    return [float(np.isin(test, classes_of(k, peers)).mean()) for k in range(peers)]


def run_variant(name: str, clusters: list[LocalCluster], job: str, text: str, budget: float,
                curves: list[dict]) -> dict:
    """Join every cluster's daemons to the job and poll until all finish (or
    `budget` s); every poll's progress goes to `curves`, each peer's last to the result."""
    for cluster in clusters:
        cluster.wait_ready()
    if len(clusters) == 1:  # discovery in the one shared realm
        wait_discovery(clusters[0], 60)
    for cluster in clusters:
        join_all(cluster, text)
    labelled = [(f"peer-{k}" if len(clusters) > 1 else p.peer_id, c, p) for k, c in enumerate(clusters) for p in c.peers]
    started, final = None, {}
    stop = time.monotonic() + budget
    while time.monotonic() < stop:
        polled = {label: j for label, c, p in labelled if (j := job_status(c, p, job)) is not None}
        if started is None and any(j.progress.step > 0 for j in polled.values()):
            started = time.monotonic()  # the clock starts at the variant's first step
        for label, j in polled.items():
            if started is not None and j.progress.step > 0:
                curves.append({"variant": name, "peer": label, "t": round(time.monotonic() - started, 2),
                               "step": j.progress.step, "samples": j.progress.samples, "accuracy": j.progress.metric})
            final[label] = {"state": j.state, "accuracy": j.progress.metric, "steps": j.progress.step,
                            "samples": j.progress.samples}
        if len(polled) == len(labelled) and all(j.state in ("finished", "failed") for j in polled.values()):
            break
        time.sleep(POLL_S)
    final["seconds"] = round(time.monotonic() - (started or time.monotonic()), 1)
    return final


def plot(curves: list[dict], summary: dict, path: Path, peers: int) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k in range(peers):
        peer, color = f"peer-{k}", colors[k % len(colors)]
        classes = "".join(map(str, classes_of(k, peers)))
        for variant, style in (("alone", "--"), ("gossip", "-")):
            rows = [r for r in curves if r["variant"] == variant and r["peer"] == peer and not math.isnan(r["accuracy"])]
            ax.plot([r["t"] for r in rows], [r["accuracy"] for r in rows], style, color=color,
                    label=f"{peer} (classes {classes}) {variant}")
        ax.axhline(summary["ceilings"][k], color=color, linestyle=":", linewidth=0.8)
    ax.axhline(GOAL, color="black", linestyle=":", linewidth=0.8)
    ax.set(xlabel="seconds since the first step", ylabel="test accuracy, all 10 classes", ylim=(0, 1),
           title=f"non-IID digits, {peers} peers: alone (dashed) vs peerd gossip (solid); dotted: alone's ceiling")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    save_figure(fig, [path], dpi=110)


def train_both(args, out: Path, roots: list[Path], summary: dict) -> list[dict]:
    """alone (one cluster per peer, all at once), then gossip (one cluster); the curves."""
    secret = out / "job.secret"
    create_secret_file(secret, overwrite=True)
    spec, text = load_job(builtin_job("digits-noniid"))
    summary.update(job=spec.name, epochs=spec.epochs)
    curves: list[dict] = []

    def settings_for(k: int):
        return lambda peer: {"data": {"root": str(roots[k if k >= 0 else peer.index])},  # k < 0: by peer
                             "auth": {"job_secret_file": str(secret)}}

    try:
        with ExitStack() as stack:
            clusters = [stack.enter_context(LocalCluster(1, out / "alone" / f"peer-{k}", settings=settings_for(k)))
                        for k in range(args.peers)]
            summary["alone"] = run_variant("alone", clusters, spec.name, text, args.budget, curves)
        print("alone:", json.dumps(summary["alone"]), flush=True)
        with LocalCluster(args.peers, out / "gossip", settings=settings_for(-1)) as cluster:
            summary["gossip"] = run_variant("gossip", [cluster], spec.name, text, args.budget, curves)
        print("gossip:", json.dumps(summary["gossip"]), flush=True)
    finally:
        write_csv(out / "curves.csv", curves)
    return curves


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = run_dir(args.out, "noniid")
    args.png = args.png or out / "noniid.png"  # the docs' figure only when asked
    roots = [out / "data" / f"peer-{k}" for k in range(args.peers)]
    counts = write_split(roots)
    summary: dict = {"peers": args.peers, "train_digits": counts, "ceilings": ceilings(args.peers)}
    curves = train_both(args, out, roots, summary)
    gossip = [summary["gossip"][f"peer-{k}"]["accuracy"] for k in range(args.peers)]
    alone = [summary["alone"][f"peer-{k}"]["accuracy"] for k in range(args.peers)]
    summary["goal_met"] = min(gossip) >= GOAL and all(a <= c + 1e-9 for a, c in zip(alone, summary["ceilings"]))
    write_json(out / "summary.json", summary)
    plot(curves, summary, args.png, args.peers)
    for k in range(args.peers):
        print(f"peer-{k} classes {classes_of(k, args.peers)} ({counts[k]} digits): alone {alone[k]:.4f} "
              f"(ceiling {summary['ceilings'][k]:.3f}), gossip {gossip[k]:.4f}")
    print(f"goal (gossip ≥ {GOAL} on every peer, alone ≤ its ceiling): {'met' if summary['goal_met'] else 'NOT met'}; "
          f"{out}/summary.json, plot {args.png}")
    return 0 if summary["goal_met"] else 1


if __name__ == "__main__":
    run_main(main)
