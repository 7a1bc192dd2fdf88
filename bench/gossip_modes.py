#!/usr/bin/env python
"""Gossip modes on the example job: whole-model gossip, flat crossover,
hierarchical crossover, and hierarchical with bf16 on the wire.

One invocation trains the built-in MNIST example job (peerd/examples/mnist.toml)
once per variant, each on a fresh local cluster of real `peerd` daemons on
127.0.0.1 (default 4, with rack labels rack-a, rack-a, rack-b, rack-b), with
`init = "per-peer"` so that every peer starts from its own model and consensus
has to be reached by gossip:

  whole          gossip.mode = "whole": the whole model from one partner per round
  crossover      gossip.mode = "crossover": every segment from its own partner
  hierarchical   gossip.mode = "hierarchical", group_size 2: with these racks the
                 groups are the racks (reduce-scatter, cross-group mix, all-gather)
  hier-bf16      the same with gossip.wire = "bf16"

Same seeds for all: one job name (the data order, the per-peer initial models and
the gossip partners all derive from it and from job.seed), the same job apart
from the [gossip] keys above.

Fixed work, not fixed time: every variant trains the same number of epochs, so
every peer makes the same number of local steps and gossip rounds (period_steps
= 1). On a shared 2-core machine the wall time of a run depends as much on what
else runs as on the algorithm, so a time budget would compare machine load; the
same rounds compare the algorithms, and wall time is still recorded (curves
against seconds, and the accuracy every variant had reached when the fastest
one finished). It also lets every worker finish and write its model.pt, from
which the final consensus distance is computed exactly.

Recorded, per poll (--poll s) and peer: round, loss EMA, test accuracy (every
--eval-every rounds), the worker's own disagreement metric (Progress.disagreement,
a sampled relative gap ||own − received|| / ||own|| of the round's segments; in
flat modes "received" is the partner's snapshot, in hierarchical mode the
group's mixed value, so it reads about √2 lower there for the same spread), and
misses. At the end, from every peer's model.pt:

  consensus distance = mean_i ||θ_i − θ̄|| / ||θ̄||,  θ̄ the mean of the peers' θ

Bytes per round are measured by bench/traffic.py's counting transport in real
in-process rounds of the example model's size (payload only).

Outputs under --out: history.csv, summary.json, gossip_modes.png and each
cluster's logs; --png also writes the figure elsewhere (docs/img/gossip_modes.png).

    .venv/bin/python bench/gossip_modes.py --png docs/img/gossip_modes.png
    .venv/bin/python bench/gossip_modes.py --variants crossover,hierarchical --epochs 4
    .venv/bin/python bench/gossip_modes.py --from runs/gossip-modes-X        # figure and table again

Every daemon is stopped by PID (LocalCluster.close) at the end of each run,
also on errors, Ctrl+C and SIGTERM; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import sys
import time
import tomllib
from pathlib import Path

from harness.cluster import (
    DOWN, Watch, job_dir, job_statuses, join_all, took_state, wait_discovery,
)
from harness.output import pyplot, read_csv, save_figure, write_csv, write_json
from harness.script import arg_parser, names, run_dir, run_main
from peerd.cli.localcluster import LocalCluster, default_job, job_with

JOB = "gossip-modes"
# name -> [gossip] keys that differ from the example job's
VARIANTS: dict[str, dict[str, object]] = {
    "whole": {"mode": "whole"},
    "crossover": {"mode": "crossover"},
    "hierarchical": {"mode": "hierarchical"},
    "hier-bf16": {"mode": "hierarchical", "wire": "bf16"},
}
DONE_STATES = {"finished", "failed", "stopped"}
DISCOVERY_S = 30.0
FIELDS = ["variant", "t", "peer", "state", "step", "round", "epoch", "loss", "accuracy", "disagreement", "exchange_s",
          "misses", "partners"]


def parse_args(argv: list[str] | None = None):
    p = arg_parser(__doc__, defaults=True,
                   epilog="The module docstring (bench/gossip_modes.py) explains the method; docs/benchmarks.md has a run.")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, run in this order; from: "
                   + ", ".join(VARIANTS))
    p.add_argument("--localities", default="rack-a,rack-a,rack-b,rack-b",
                   help="one rack label per daemon (their number is the number of peers)")
    p.add_argument("--group-size", type=int, default=2, help="gossip.group_size of the hierarchical variants")
    p.add_argument("--epochs", type=float, default=12,
                   help="job.epochs, the fixed work per variant (the example's 12: with per-peer init the first "
                        "50-110 steps sit on a plateau, and 6 epochs leave too little after it)")
    p.add_argument("--init", choices=("per-peer", "shared"), default="per-peer",
                   help="job.init: per-peer makes consensus matter; peers whose worker starts after others serve "
                        "take the running state instead (peerd's joining rule)")
    p.add_argument("--eval-every", type=int, default=10, help="job.eval_every_rounds")
    p.add_argument("--seed", type=int, default=0, help="job.seed (per-peer initial models derive from it)")
    p.add_argument("--poll", type=float, default=0.5, help="seconds between status polls")
    p.add_argument("--time-limit", type=float, default=300.0, help="seconds one variant may train before it is stopped")
    p.add_argument("--out", type=Path, default=None, help="output folder (default runs/gossip-modes-TIMESTAMP)")
    p.add_argument("--png", type=Path, default=None, help="also write the figure here")
    p.add_argument("--from", dest="source", type=Path, default=None,
                   help="start nothing: read history.csv and summary.json of an earlier --out and redo figure and table")
    args = p.parse_args(argv)
    args.variants = names(p, args.variants, VARIANTS, "--variants")
    args.localities = [x.strip() for x in args.localities.split(",")]
    if len(args.localities) < 2:
        p.error("--localities: at least two daemons")
    if args.group_size < 1 or args.eval_every < 1 or args.epochs <= 0 or args.poll <= 0:
        p.error("--group-size and --eval-every must be ≥ 1, --epochs and --poll > 0")
    return args


def job_text(args, variant: str) -> str:
    """The example job with this benchmark's values."""
    return job_with(default_job(), job={"name": JOB, "seed": args.seed, "init": args.init,
                                        "epochs": float(args.epochs), "eval_every_rounds": args.eval_every},
                    gossip={"group_size": args.group_size, **VARIANTS[variant]})


# ---------------------------------------------------------------- one run


def run_variant(args, variant: str, out: Path) -> tuple[list[dict], dict]:
    """Train the job on a fresh cluster; returns the polled rows and the run's summary."""
    text = job_text(args, variant)
    out.mkdir(parents=True, exist_ok=True)
    (out / "job.toml").write_text(text)
    rows: list[dict] = []
    with LocalCluster(len(args.localities), out, localities=args.localities) as cluster:
        cluster.wait_ready()
        wait_discovery(cluster, DISCOVERY_S)
        started = time.monotonic()
        join_all(cluster, text)

        def polled() -> list[dict]:
            got = poll(cluster, variant, round(time.monotonic() - started, 3))
            rows.extend(got)
            return got

        Watch(variant, out, args.time_limit, args.poll).run(
            cluster, polled, lambda got: all(r["state"] in DONE_STATES for r in got), lambda got: " | ".join(
                f"{r['peer']} {r['state']} r{r['round']} loss {r['loss']:.3f} acc {r['accuracy']:.3f}" for r in got))
    return rows, summarise(variant, rows, cluster)


def summarise(variant: str, rows: list[dict], cluster: LocalCluster) -> dict:
    """A run's figures from its rows and the peers' model.pt; the rows' t moved so
    that t = 0 is the first poll at which a worker had trained (the time the
    daemons take to start their workers, 10-20 s on a loaded 2-core machine and
    varying, does not count against a variant)."""
    train_t0 = min((r["t"] for r in rows if r["step"] > 0), default=0.0)
    for r in rows:
        r["t"] = round(r["t"] - train_t0, 3)
    models = [job_dir(p.dir, JOB) / "model.pt" for p in cluster.peers]
    last = rows[-len(cluster.peers):]
    return {
        "variant": variant, "gossip": VARIANTS[variant], "complete": all(r["state"] == "finished" for r in last),
        "finished": [r["peer"] for r in last if r["state"] == "finished"],
        "train_t0": train_t0, "finish_t": max((r["t"] for r in rows if r["state"] != "finished"), default=0.0),
        "steps": [r["step"] for r in last], "rounds": [r["round"] for r in last],
        "misses": [r["misses"] for r in last],
        "took_state": [p.peer_id for p in cluster.peers if took_state(p.dir, JOB)],
        "final_accuracy": [r["accuracy"] for r in last if r["state"] == "finished"],
        **consensus([m for m in models if m.exists()]),
    }


def poll(cluster: LocalCluster, variant: str, t: float) -> list[dict]:
    rows = []
    for i, j in enumerate(job_statuses(cluster, JOB)):
        row = {"variant": variant, "t": t, "peer": f"peer-{i}", "state": "down", "step": 0, "round": 0, "epoch": 0,
               "loss": math.nan, "accuracy": math.nan, "disagreement": math.nan, "exchange_s": math.nan,
               "misses": 0, "partners": ""}
        if j is not None and j is not DOWN:
            p = j.progress
            row.update(state=j.state, step=p.step, round=p.round, epoch=p.epoch, loss=p.loss, accuracy=p.metric,
                       disagreement=p.disagreement, exchange_s=p.exchange_s, misses=p.segment_misses,
                       partners=f"{p.partners_reached}/{p.partners_planned}")
        rows.append(row)
    return rows


def consensus(paths: list[Path]) -> dict:
    """Mean distance of the peers' final parameters from their average, relative to its norm."""
    import torch

    if len(paths) < 2:
        return {"consensus_distance": math.nan, "numel": 0, "saved_rounds": []}

    vectors = []
    for path in paths:
        saved = torch.load(path, map_location="cpu", weights_only=True)
        vectors.append(torch.cat([v.flatten().float() for v in saved.values()]))
    stack = torch.stack(vectors)
    mean = stack.mean(0)
    distances = torch.linalg.vector_norm(stack - mean, dim=1) / torch.linalg.vector_norm(mean)
    # model.pt is a plain state_dict; its round is in model.json beside it
    return {"consensus_distance": float(distances.mean()), "numel": int(mean.numel()),
            "saved_rounds": [int(json.loads(p.with_suffix(".json").read_text())["round"]) for p in paths]}


# ---------------------------------------------------------------- traffic


def bytes_per_round(args, numel: int) -> dict[str, dict]:
    """Payload bytes received per peer per round, counted in 2 real in-process rounds
    of each variant's gossip at the example model's size (bench/traffic.py)."""
    from traffic import Setup, measure

    data = tomllib.loads(default_job().read_text())
    segments = data["gossip"]["segments"]
    n = len(args.localities)
    out = {}
    for variant in args.variants:
        g = VARIANTS[variant]
        setup = Setup(g["mode"], n, numel, segments, args.group_size, g.get("wire", "fp32"), tuple(args.localities))
        t = asyncio.run(measure(setup, rounds=2))
        received = [b for rnd in t.received for b in rnd.values()]
        out[variant] = {"mean": statistics.fmean(received), "min": min(received), "max": max(received)}
    return out


# ---------------------------------------------------------------- figures and table


def mean_series(rows: list[dict], key: str, x: str = "t") -> list[tuple[float, float]]:
    """(x, mean of `key` over the peers that have trained) at every poll; x is the
    poll's time, or with x = "step" the mean step of those peers."""
    by_t: dict[float, list[dict]] = {}
    for r in rows:
        if r["state"] in ("running", "finished") and r["step"] > 0 and not math.isnan(r[key]):
            by_t.setdefault(r["t"], []).append(r)
    return [(t if x == "t" else statistics.fmean(r["step"] for r in rs), statistics.fmean(r[key] for r in rs))
            for t, rs in sorted(by_t.items())]


def accuracy_at(rows: list[dict], t: float) -> float:
    """Mean over peers of the last test accuracy each had reported by time t."""
    last: dict[str, float] = {}
    for r in rows:
        if r["t"] <= t and not math.isnan(r["accuracy"]):
            last[r["peer"]] = r["accuracy"]
    return statistics.fmean(last.values()) if last else math.nan


def plot(history: list[dict], summaries: list[dict], settings: dict, paths: list[Path]) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    for s in summaries:
        rows = [r for r in history if r["variant"] == s["variant"]]
        label = f"{s['variant']} (final consensus {s['consensus_distance']:.1e})"
        for row, x in zip(axes, ("t", "step")):
            for ax, key in zip(row, ("accuracy", "disagreement", "loss")):
                series = mean_series(rows, key, x)
                ax.plot([p for p, _ in series], [q for _, q in series], label=label,
                        marker="." if key == "accuracy" else None, markersize=3)
    for row, xlabel in zip(axes, ("seconds since the first worker trained", "local steps (= rounds), mean of peers")):
        ax_acc, ax_dis, ax_loss = row
        ax_acc.set(xlabel=xlabel, ylabel="test accuracy (mean of peers)", title="accuracy", ylim=(0.5, 1.0))
        ax_dis.set(xlabel=xlabel, ylabel="Progress.disagreement (mean of peers)",
                   title="per-round gap to what was received", yscale="log")
        ax_loss.set(xlabel=xlabel, ylabel="training loss EMA (mean of peers)", title="loss", yscale="log")
        for ax in row:
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"example job, {len(summaries[0]['rounds'])} peers on racks {settings.get('localities', '?')}, "
                 f"init {settings.get('init', 'per-peer')}, {settings.get('epochs', '?')} epochs, "
                 "same seeds and steps", fontsize=10)
    fig.tight_layout()
    save_figure(fig, paths)


def table(history: list[dict], summaries: list[dict], traffic: dict[str, dict]) -> str:
    t_common = min(s["finish_t"] for s in summaries if s.get("complete", True))
    base = next((s for s in summaries if s["variant"] == "crossover"), summaries[0])
    lines = [
        f"| variant | steps (per peer) | rounds | trained s | final accuracy, mean (min–max) | accuracy at {t_common:.0f} s "
        f"| consensus distance (model.pt) | × {base['variant']} | mean disagreement, last 20 rounds "
        "| received per peer per round | misses | started from own init |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        rows = [r for r in history if r["variant"] == s["variant"]]
        acc = s["final_accuracy"]
        late = [r["disagreement"] for r in rows if r["round"] >= min(s["rounds"]) - 20
                and not math.isnan(r["disagreement"]) and r["state"] == "running"]
        tr = traffic.get(s["variant"])
        tr_text = "-" if tr is None else (f"{tr['mean'] / 1024:.0f} KiB" + (
            "" if tr["min"] == tr["max"] else f" ({tr['min'] / 1024:.0f}–{tr['max'] / 1024:.0f})"))
        name = s["variant"] if s.get("complete", True) else (
            f"{s['variant']} (**incomplete**: finished {', '.join(s['finished']) or 'none'})")
        lines.append(
            f"| {name} | {min(s['steps'])}–{max(s['steps'])} | {min(s['rounds'])}–{max(s['rounds'])} "
            f"| {s['finish_t']:.0f} "
            f"| {_mean_range(acc)} | {accuracy_at(rows, t_common):.4f} "
            f"| {s['consensus_distance']:.2e} | {_times(s['consensus_distance'], base['consensus_distance'])} "
            f"| {statistics.fmean(late) if late else math.nan:.2e} | {tr_text} | {sum(s['misses'])} "
            f"| {len(s['rounds']) - len(s['took_state'])} of {len(s['rounds'])} |")
    return "\n".join(lines)


def _times(x: float, base: float) -> str:
    """x / base; "-" when base is 0 (every peer's model.pt is the one consensus model)."""
    return f"{x / base:.2f}" if base else "-"


def _mean_range(xs: list[float]) -> str:
    return f"{statistics.fmean(xs):.4f} ({min(xs):.4f}–{max(xs):.4f})" if xs else "-"


def read_history(path: Path) -> list[dict]:
    return read_csv(path, ints=("step", "round", "misses"),
                    floats=("t", "loss", "accuracy", "disagreement", "exchange_s", "epoch"))


def report(args, out: Path, history: list[dict], summary: dict) -> None:
    pngs = [out / "gossip_modes.png"] + ([args.png] if args.png else [])
    plot(history, summary["runs"], summary.get("args", {}), pngs)
    text = table(history, summary["runs"], summary.get("traffic", {}))
    (out / "table.md").write_text(text + "\n")
    print("\n" + text)
    print(f"\nfigure: {', '.join(map(str, pngs))}; history: {out / 'history.csv'}")


def run_all(args, out: Path, summary: dict) -> list[dict]:
    """Every variant in turn; the history, written with the summary also after an error."""
    history: list[dict] = []
    try:
        for variant in args.variants:
            print(f"{variant}: {VARIANTS[variant]} on {len(args.localities)} daemons", flush=True)
            rows, run = run_variant(args, variant, out / variant)
            history += rows
            summary["runs"].append(run)
            print(f"{variant}: {run['finish_t']:.0f}s, rounds {run['rounds']}, accuracy {run['final_accuracy']}, "
                  f"consensus distance {run['consensus_distance']:.3e}", flush=True)
    finally:
        write_csv(out / "history.csv", history, FIELDS)
        if history:
            write_json(out / "summary.json", summary)
    return history


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.source is not None:
        summary = read_summary(args.source)
        report(args, args.source, read_history(args.source / "history.csv"), summary)
        return 0
    out = run_dir(args.out, "gossip-modes")
    settings = {k: (",".join(v) if isinstance(v, list) else str(v)) for k, v in vars(args).items()}
    summary: dict = {"args": settings, "runs": []}
    started = time.monotonic()
    history = run_all(args, out, summary)
    from peerd.examples.mnist import make_model

    summary["traffic"] = bytes_per_round(args, sum(t.numel() for t in make_model().parameters()))
    summary["seconds"] = time.monotonic() - started
    write_json(out / "summary.json", summary)
    report(args, out, history, summary)
    incomplete = [r["variant"] for r in summary["runs"] if not r["complete"]]
    if incomplete:
        print(f"incomplete (some worker did not finish): {', '.join(incomplete)}; see their logs", file=sys.stderr)
        return 1
    return 0


def read_summary(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


if __name__ == "__main__":
    run_main(main)
