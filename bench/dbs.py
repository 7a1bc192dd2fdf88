#!/usr/bin/env python
"""Dynamic batch size on heterogeneous peers: time to accuracy against the best
synchronous data-parallel setup.

One invocation trains the built-in MNIST example (peerd/examples/mnist.py) on 4
workers slowed by factors 1, 1, 2, 4, in several variants one after the other, with
the same model, initial weights, data, SGD (momentum 0.9, weight decay 1e-4),
global batch B and epochs; for each slowdown clock in --clocks, --repeats times:

  sync/SCHED    torch.distributed DDP-style (gloo on loopback, FileStore rendezvous):
                4 processes, equal local batches of B/4, DistributedSampler-style
                shards, gradients averaged by all-reduce after every step. Every step
                waits for the slowest rank. Several schedules are run and the best
                one (shortest time to the target) per clock is the baseline.
  fixed[@N]/SCHED  peerd: 4 real daemons (LocalCluster, one per slowdown), the job
                at a fixed local batch B/4 (global_batch = 0), a gossip round every
                N local steps (default --period-steps).
  dbs[@N]/SCHED the same with global_batch = B: each peer's batch follows its
                measured step model (peerd/core/shares.py: equal step times under
                t_i(b) = a_i + c_i·b), LR × b_i/mean(b), data split by the shares.
  prop[@N]/SCHED dbs with [job] step_model = "proportional": batches in proportion
                to the whole-step speed (b_i ∝ v_i), the plan before step costs were measured.

--overheads adds a fixed sleep to every step of each worker ([worker]
step_overhead_s, peerd/core/slowdown.py; the DDP ranks too): a step with a large
fixed cost, which the affine step model is for.

SCHED is constant, cosine or linear (decay to 0 over the epochs), then optionally
:LR (at the global batch; default --lr) and :WARMUP (linear warm-up steps), e.g.
sync/cosine:0.1:16 (the linear-scaling rule from LR 0.05 at B = 128, warmed up).

The slowdown knob ([worker] slowdown and slowdown_clock, peerd/core/slowdown.py):
after each step a worker sleeps (f − 1) × that step's time, on the wall clock (its
wall time, which on a busy shared CPU includes waiting for other processes, so a
slow worker is slowed by more than f) or on the cpu clock (the CPU time of the
step's thread; every worker here runs torch on one thread). The DDP ranks use the
same code (peerd/worker/train/slowdown.py) around their forward and backward.

Evaluation is out of band on both sides: DDP rank 0 snapshots its model after
every step (a copy of ~60k floats; --snapshot-every S: every S seconds), each
peerd peer every --eval-rounds gossip rounds (bench/_dbs_job.py: the job's
`evaluate` only saves the model, with the time it was taken); the bench scores every snapshot on the 1,000 test digits after the training, so no
variant spends training time on evaluation. A crossing of --target is timed at
the moment the model was taken: DDP, rank 0's model; peerd, the mean of the
peers' latest snapshots (each its own model), at each snapshot's time. Clocks start
at the first training step (DDP: after the process group is up; peerd: the first
peer's first step), so process start and torch import are not counted. Reported:
time to the target, × the best DDP setup of the same clock and run, the final
accuracy (the last snapshot, after the job's epochs or at --budget seconds) and
its difference to the best DDP setup's, each worker's utilisation = time in steps
(the slowdown's sleep included) / wall time, the median batches, and the 1-minute
load average at the start and end of each variant (the machine is shared).

    .venv/bin/python bench/dbs.py                          # both clocks, ~10 min per repeat on 2 busy cores
    .venv/bin/python bench/dbs.py --clocks cpu --variants sync/constant,dbs/cosine --out /tmp/dbs

Outputs under --out (default runs/dbs-TIMESTAMP): curves.csv, summary.json, one
folder per run with its logs and snapshots; the plot goes to --png (default
OUT/dbs.png). Every process is stopped by PID at the end of its variant, also
on errors and Ctrl+C.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from argparse import SUPPRESS
from dataclasses import dataclass
from pathlib import Path

from harness.cluster import job_status, join_all, wait_discovery
from harness.output import md_table, pyplot, save_figure, write_csv, write_json
from harness.ranks import gloo_group, kill_ranks, wait_ranks
from harness.script import arg_parser, run_dir, run_main
from harness.training import accuracy, allreduce_grads
from peerd.core.codes import ENDED_STATES, WorkerState
from peerd.core.schedule import SCHEDULES
from peerd.core.slowdown import CLOCKS

BENCH = Path(__file__).resolve().parent
JOB = "dbs-bench"

POLL_S = 0.5
SNAPSHOTS_ENV = "PEERD_BENCH_SNAPSHOTS"  # bench/_dbs_job.py saves the peers' snapshots there


@dataclass(frozen=True)
class Variant:
    """sync/fixed/dbs, peerd's gossip period, and the LR schedule: KIND[@N][/SCHED[:LR[:WARMUP]]]."""

    kind: str
    period: int
    schedule: str
    lr: float
    warmup: int

    @property
    def name(self) -> str:
        period = f"@{self.period}" if self.kind != "sync" else ""
        return f"{self.kind}{period}/{self.schedule}:{self.lr:g}" + (f":{self.warmup}" if self.warmup else "")


def parse_variant(text: str, lr: float, period: int) -> Variant:
    head, _, sched = text.partition("/")
    kind, _, n = head.partition("@")
    schedule, lr_text, warmup = (sched.split(":") + ["", "", ""])[:3] if sched else ("cosine", "", "")
    if kind not in ("sync", "fixed", "dbs", "prop") or (kind == "sync" and n) or schedule not in SCHEDULES:
        raise ValueError(f"variant {text!r}: sync, fixed[@N], dbs[@N] or prop[@N], "
                         f"then /{'|'.join(SCHEDULES)}[:LR[:WARMUP]]")
    return Variant(kind, int(n or period), schedule, float(lr_text or lr), int(warmup or 0))


def parse_args(argv: list[str] | None = None):
    p = arg_parser(__doc__)
    p.add_argument("--slowdowns", default="1,1,2,4", help="per-worker slowdown factors (default 1,1,2,4)")
    p.add_argument("--overheads", default="",
                   help="per-worker fixed seconds slept after every step ([worker] step_overhead_s; default none)")
    p.add_argument("--clocks", default="wall,cpu",
                   help="the slowdown's clock(s), each a run of every variant: wall, cpu (default wall,cpu)")
    p.add_argument("--global-batch", type=int, default=256, help="B: samples per step of all workers (default 256)")
    p.add_argument("--epochs", type=float, default=8.0, help="passes over the 4,000 training digits (default 8)")
    p.add_argument("--lr", type=float, default=0.05, help="SGD LR at the global batch where a variant gives none")
    p.add_argument("--target", type=float, default=0.95, help="test accuracy to reach (default 0.95)")
    p.add_argument("--snapshot-every", type=float, default=0.0,
                   help="sync: rank 0 snapshots its model at the first step end this many seconds after the "
                        "last snapshot (default 0: after every step)")
    p.add_argument("--eval-rounds", type=int, default=1,
                   help="peerd: each peer snapshots its model every this many gossip rounds (default 1)")
    p.add_argument("--period-steps", type=int, default=4,
                   help="peerd: local steps between gossip rounds (default 4; a variant NAME@N overrides it)")
    p.add_argument("--rebalance-rounds", type=int, default=5, help="peerd DBS: re-plan every this many rounds")
    p.add_argument("--budget", type=float, default=150.0, help="seconds of training at most per variant (default 150)")
    p.add_argument("--variants", default="sync/constant,sync/cosine,sync/cosine:0.1:16,dbs/cosine",
                   help="which to run, in order: sync, fixed[@N] or dbs[@N], each with /SCHEDULE[:LR[:WARMUP]] "
                        "(default sync/constant,sync/cosine,sync/cosine:0.1:16,dbs/cosine)")
    p.add_argument("--repeats", type=int, default=1, help="runs of the whole set (default 1)")
    p.add_argument("--out", type=Path, default=None, help="results folder (default runs/dbs-TIMESTAMP)")
    p.add_argument("--png", type=Path, default=None, help="where the plot goes (default OUT/dbs.png)")
    # Internal: one rank of the synchronous baseline.
    p.add_argument("--sync-rank", type=int, default=None, help=SUPPRESS)
    p.add_argument("--variant", default="sync", help=SUPPRESS)
    p.add_argument("--clock", default="wall", help=SUPPRESS)
    args = p.parse_args(argv)
    args.slowdown_list = tuple(float(v) for v in args.slowdowns.split(","))
    if any(f < 1 for f in args.slowdown_list) or args.global_batch % len(args.slowdown_list):
        p.error("slowdowns must be ≥ 1 and the global batch a multiple of the number of workers")
    args.overhead_list = tuple(float(v) for v in args.overheads.split(",")) if args.overheads else \
        (0.0,) * len(args.slowdown_list)
    if len(args.overhead_list) != len(args.slowdown_list) or any(o < 0 for o in args.overhead_list):
        p.error("overheads: one number ≥ 0 per worker")
    args.clock_list = args.clocks.split(",")
    if any(c not in CLOCKS for c in args.clock_list + [args.clock]):
        p.error(f"clocks: {', '.join(CLOCKS)}")
    try:
        args.variant_list = [parse_variant(v, args.lr, args.period_steps) for v in args.variants.split(",")]
    except ValueError as exc:
        p.error(str(exc))
    return args


# ---- synchronous baseline: torch.distributed, one process per rank ------------

def sync_rank(args) -> None:
    """One rank of the synchronous baseline: train until its epochs are done or
    rank 0's --budget is spent; rank 0 snapshots its model as it goes."""
    import torch

    from peerd.core.slowdown import Slowdown
    from peerd.examples.mnist import make_datasets, make_model
    from peerd.worker.train.slowdown import SlowedSteps

    rank, world = args.sync_rank, len(args.slowdown_list)
    torch.set_num_threads(1)  # as peerd's workers ([worker] threads = 1): the cpu clock is the thread's
    slowed = SlowedSteps(Slowdown(args.slowdown_list[rank], args.clock, args.overhead_list[rank]))
    with gloo_group(str(args.out.resolve() / "sync-rendezvous"), rank, world) as dist:
        torch.manual_seed(0)  # the job's seed: same initial model as peerd's init = "shared"
        model = make_model().float()
        train, _ = make_datasets()
        dist.barrier()
        t0 = time.monotonic()
        compute, steps, snapshots = _sync_train(args, model, train, slowed, t0)
        t1 = time.monotonic()
    (args.out / f"sync-{rank}.json").write_text(json.dumps({"t0": t0, "t": t1 - t0, "compute_s": compute,
                                                            "steps": steps}))
    if rank == 0:
        torch.save(snapshots, args.out / "sync-snapshots.pt")


def _sync_train(args, model, train, slowed, t0: float) -> tuple[float, int, list[dict]]:
    """The DDP-style steps: equal local batches, gradients averaged by all-reduce
    after every step (every step waits for the slowest rank); compute seconds
    (the slowdown's sleep included), steps, and rank 0's snapshots (time, state)
    every --snapshot-every s, scored by the bench afterwards."""
    import torch
    from torch import nn

    from peerd.core.schedule import schedule_factor

    rank, world = args.sync_rank, len(args.slowdown_list)
    v = parse_variant(args.variant, args.lr, args.period_steps)
    x, y = train.tensors
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=v.lr, momentum=0.9, weight_decay=0.0001)
    compute, snapshots = 0.0, []
    for step, total, batch in _sync_batches(len(y), rank, world, args.global_batch // world, args.epochs):
        slowed.start()
        for group in opt.param_groups:
            group["lr"] = v.lr * schedule_factor(v.schedule, step / total, step, v.warmup)
        idx = torch.as_tensor(batch)
        model.train()
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
        compute += slowed.finish()  # the same knob as peerd's workers, on the same clock
        stop = 1.0 if rank == 0 and time.monotonic() - t0 > args.budget else 0.0
        stopped = allreduce_grads(params, stop, world) > 0
        opt.step()
        done = step + 1 >= total or stopped
        if rank == 0 and (done or not snapshots or time.monotonic() - snapshots[-1]["t"] >= args.snapshot_every):
            snapshots.append({"t": time.monotonic(),
                              "state": {k: t.detach().clone() for k, t in model.state_dict().items()}})
        if done:
            break
    return compute, step + 1, snapshots


def _sync_batches(n: int, rank: int, world: int, local: int, epochs: float):
    """(step, total steps, this rank's sample indices) of each step, shards as
    DistributedSampler's: a seeded permutation per epoch, padded to equal shards."""
    import torch

    per_rank = math.ceil(n / world)
    steps_per_epoch = math.ceil(per_rank / local)
    total, step = math.ceil(epochs * steps_per_epoch), 0
    while step < total:
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(1000 + step // steps_per_epoch)).tolist()
        perm += perm[: per_rank * world - len(perm)]
        shard = perm[rank::world]
        for start in range(0, per_rank, local):
            if step >= total:
                return
            yield step, total, shard[start : start + local]
            step += 1


def _score(snapshots: list[dict], t0: float) -> list[tuple[float, float]]:
    """(time since t0, test accuracy) of each snapshot, scored now, after the training."""
    import torch

    from peerd.examples.mnist import make_datasets, make_model

    torch.set_num_threads(1)  # a second thread only fights the other processes on a busy machine
    _, test = make_datasets()
    model = make_model().float()
    curve = []
    for snap in snapshots:
        model.load_state_dict(snap["state"])
        curve.append((snap["t"] - t0, accuracy(model, *test.tensors)))
    return curve


def run_sync(args, v: Variant, clock: str, out: Path) -> dict:
    import torch

    (out / "sync-rendezvous").unlink(missing_ok=True)
    procs = []
    try:
        for rank in range(len(args.slowdown_list)):
            cmd = [sys.executable, __file__, "--sync-rank", str(rank), "--variant", v.name, "--clock", clock,
                   "--out", str(out), "--slowdowns", args.slowdowns, "--global-batch", str(args.global_batch),
                   "--overheads", args.overheads,
                   "--epochs", str(args.epochs), "--snapshot-every", str(args.snapshot_every),
                   "--budget", str(args.budget)]
            with open(out / f"sync-{rank}.log", "wb") as log:
                procs.append(subprocess.Popen(cmd, stdout=log, stderr=log, start_new_session=True))
        wait_ranks(procs, args.budget + 120, f"a sync rank failed; see {out}/sync-*.log")
    finally:
        kill_ranks(procs)
    ranks = [json.loads((out / f"sync-{r}.json").read_text()) for r in range(len(procs))]
    curve = _score(torch.load(out / "sync-snapshots.pt"), ranks[0]["t0"])
    return _result(v, clock, curve, [r["compute_s"] / r["t"] for r in ranks], ranks[0]["t"], args,
                   batches=[args.global_batch // len(procs)] * len(procs),
                   step_s=[r["compute_s"] / max(r["steps"], 1) for r in ranks], steps=[r["steps"] for r in ranks])


# ---- peerd variants: real daemons ------------------------------------------------

def job_text(args, v: Variant) -> str:
    from peerd.cli.localcluster import default_job, job_with

    n = len(args.slowdown_list)
    return job_with(
        default_job(),
        job={"name": JOB, "module": "_dbs_job", "local_batch": args.global_batch // n, "epochs": args.epochs,
             "eval_every_rounds": args.eval_rounds,
             "global_batch": args.global_batch if v.kind in ("dbs", "prop") else 0,
             "min_local_batch": 4, "rebalance_rounds": args.rebalance_rounds, "rebalance_threshold": 0.1,
             "step_model": "proportional" if v.kind == "prop" else "affine"},
        optimizer={"lr": v.lr, "reference_batch": args.global_batch, "schedule": v.schedule,
                   "warmup_steps": v.warmup},
        gossip={"period_steps": v.period})


def run_peerd(args, v: Variant, clock: str, out: Path) -> dict:
    """`fixed` or `dbs` on real daemons; the peers' models are snapshotted by
    bench/_dbs_job.py and scored afterwards."""
    from peerd.cli.localcluster import LocalCluster

    snaps = out / "snapshots"
    os.environ[SNAPSHOTS_ENV] = str(snaps)  # the daemons, and so their workers, inherit it
    # No standby workers (LocalCluster's default): a daemon refills its spare 20 s
    # after a join, and 4 torch imports then would land in the middle of the run.
    # The workers import torch after the join, so they start up to a few seconds
    # apart; the clock starts at the first one's first step (start_spread_s).
    settings = lambda peer: {"worker": {"slowdown_clock": clock,  # noqa: E731
                                        "step_overhead_s": args.overhead_list[peer.index]}}
    with LocalCluster(len(args.slowdown_list), out, slowdowns=args.slowdown_list, settings=settings) as cluster:
        cluster.wait_ready()
        wait_discovery(cluster, 30)
        join_all(cluster, job_text(args, v), str(BENCH))
        rows = _follow(cluster, args, f"{v.name}: a worker failed or never stepped; see {out}")
    curve, started, ended, spread = _peer_curve(snaps, [p.peer_id for p in cluster.peers])
    rows = [[(t - started, s, p) for t, s, p in row] for row in rows]  # from the first peer's first step
    last = _last_training(rows)
    utilisation = [p.compute_s / max(t, 1e-9) for t, _, p in last]
    step_s = [p.compute_s / max(p.step, 1) for _, _, p in last]  # mean step, sleeps included
    _write_history(rows, out / "history.csv")
    # Each peer's typical batch: the median over its training statuses (the last
    # step of an epoch is short, so its last batch says little).
    batches = [statistics.median_low([row[k][2].local_batch for row in rows if row[k][2].phase == "training"] or [0])
               for k in range(len(last))]
    return _result(v, clock, curve, utilisation, ended - started, args, batches=batches, start_spread_s=spread,
                   step_s=step_s, steps=[p.step for _, _, p in last])


def _follow(cluster, args, failed: str) -> list[list[tuple]]:
    """Every poll's (time, state, progress) per peer, from the first step on, until
    every worker has ended or --budget is spent; RuntimeError(`failed`) when one failed."""
    rows, t0 = [], None
    deadline = time.monotonic() + args.budget + 90
    while time.monotonic() < deadline:
        now = time.monotonic()
        progress = [job_status(cluster, p, JOB) for p in cluster.peers]
        if t0 is None and any(j.progress.step > 0 for j in progress):
            t0 = now
        if t0 is not None:
            rows.append([(now, j.state, j.progress) for j in progress])  # absolute: see run_peerd
            if now - t0 > args.budget or all(j.state in ENDED_STATES for j in progress):
                break
        time.sleep(POLL_S)
    if not rows or any(j.state == WorkerState.FAILED for j in progress):
        raise RuntimeError(failed)
    return rows


def _peer_curve(snaps: Path, peers: list[str]) -> tuple[list[tuple[float, float]], float, float, float]:
    """The mean of the peers' latest scored snapshots at each snapshot's time, from
    the first step of the first peer; that start, the last snapshot's time and
    how long after the first peer the last one took its first step."""
    import torch

    starts = [json.loads((snaps / p / "first-step.json").read_text())["t"] for p in peers]
    started = min(starts)
    events = []
    for k, peer in enumerate(peers):
        files = sorted((snaps / peer).glob("snap-*.pt"))
        taken = [torch.load(f) for f in files]
        events += [(t, k, a) for t, a in _score(taken, 0.0)]
    events.sort()
    latest: dict[int, float] = {}
    curve = []
    for t, k, accuracy in events:
        latest[k] = accuracy
        if len(latest) == len(peers):
            curve.append((t - started, sum(latest.values()) / len(peers)))
    return curve, started, events[-1][0], max(starts) - started


def _write_history(rows: list[list[tuple]], path: Path) -> None:
    write_csv(path, [{"t": round(t, 2), "peer": k, "state": s, "phase": p.phase, "round": p.round, "epoch": p.epoch,
                      "local_batch": p.local_batch, "share": p.share, "samples_per_s": p.samples_per_s,
                      "compute_s": p.compute_s} for row in rows for k, (t, s, p) in enumerate(row)])


def _last_training(rows: list[list[tuple]]) -> list[tuple]:
    """Each peer's last status while it still trained (not finished)."""
    last = list(rows[0])
    for row in rows:
        for k, (t, state, p) in enumerate(row):
            if state == WorkerState.RUNNING and p.phase == "training":
                last[k] = (t, state, p)
    return last


# ---- report ------------------------------------------------------------------

def _result(v: Variant, clock: str, curve: list[tuple[float, float]], utilisation: list[float], wall: float,
            args, **extra) -> dict:
    reached = next((t for t, a in curve if a >= args.target), math.nan)
    return {"variant": v.name, "kind": v.kind, "clock": clock, "time_to_target_s": reached,
            "final_accuracy": curve[-1][1] if curve else math.nan, "wall_s": wall, "utilisation": utilisation,
            "curve": curve, **extra}


def best_sync(results: list[dict]) -> dict | None:
    """The DDP setup with the shortest time to the target (then the best final accuracy)."""
    sync = [r for r in results if r["kind"] == "sync" and not math.isnan(r["time_to_target_s"])]
    return min(sync, key=lambda r: (r["time_to_target_s"], -r["final_accuracy"]), default=None)


def plot(results: list[dict], args) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, len(args.clock_list), figsize=(6.5 * len(args.clock_list), 4.2), squeeze=False)
    for ax, clock in zip(axes[0], args.clock_list):
        for r in results:
            if r["clock"] == clock and r["repeat"] == 0:
                ax.plot([t for t, _ in r["curve"]], [a for _, a in r["curve"]], marker=".", markersize=3,
                        label=r["variant"])
        ax.axhline(args.target, color="grey", linestyle=":", label=f"target {args.target}")
        ax.set(xlabel="wall time (s)", ylabel="test accuracy", ylim=(0.8, 1.0), title=f"slowdown on the {clock} clock")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"MNIST-5k, 4 workers slowed {args.slowdowns}, global batch {args.global_batch}")
    fig.tight_layout()
    save_figure(fig, [args.png])


def report(results: list[dict], args) -> None:
    """The table (each run's variants against its clock's best DDP setup), curves.csv and summary.json."""
    print()
    print(md_table(["run", "clock", "variant", f"time to {args.target} (s)", "× best DDP", "final accuracy",
                    "Δ final vs best DDP (pt)", "wall (s)", "utilisation per worker", "batches",
                    "mean step (ms) per worker", "load 1 min (start → end)"], _rows(results, args)))
    write_csv(args.out / "curves.csv", [{"repeat": r["repeat"], "clock": r["clock"], "variant": r["variant"],
                                         "t": round(t, 3), "accuracy": a} for r in results for t, a in r["curve"]],
              ["repeat", "clock", "variant", "t", "accuracy"])
    summary = [{k: v for k, v in r.items() if k != "curve"} for r in results]
    settings = {k: v for k, v in vars(args).items() if k != "variant_list"} | {"out": str(args.out), "png": str(args.png)}
    write_json(args.out / "summary.json", {"args": settings, "results": summary}, indent=2)
    print(f"\nresults in {args.out}; plot {args.png}")


def _rows(results: list[dict], args):
    for repeat in range(args.repeats):
        for clock in args.clock_list:
            group = [r for r in results if r["repeat"] == repeat and r["clock"] == clock]
            base = best_sync(group)
            for r in group:
                r["best_ddp"] = base["variant"] if base else None
                r["x_best_ddp"] = r["time_to_target_s"] / base["time_to_target_s"] if base else math.nan
                r["final_vs_best_ddp_pt"] = 100 * (r["final_accuracy"] - base["final_accuracy"]) if base else math.nan
                mark = "**" if r is base else ""
                yield [repeat + 1, clock, f"{mark}{r['variant']}{mark}", f"{r['time_to_target_s']:.1f}",
                       f"{r['x_best_ddp']:.2f}", f"{r['final_accuracy']:.4f}", f"{r['final_vs_best_ddp_pt']:+.1f}",
                       f"{r['wall_s']:.1f}", " / ".join(f"{u:.2f}" for u in r["utilisation"]),
                       " / ".join(str(b) for b in r.get("batches", [])),
                       " / ".join(f"{1000 * s:.0f}" for s in r.get("step_s", [])),
                       f"{r['load'][0]:.1f} → {r['load'][1]:.1f}"]


def run_one(args, v: Variant, clock: str, repeat: int) -> dict:
    out = args.out / f"{repeat + 1}-{clock}-{v.name.replace('/', '-').replace(':', '_')}"
    out.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0]
    r = run_sync(args, v, clock, out) if v.kind == "sync" else run_peerd(args, v, clock, out)
    r.update(repeat=repeat, load=(load, os.getloadavg()[0]))
    return r


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.sync_rank is not None:
        sync_rank(args)
        return 0
    args.out = run_dir(args.out, "dbs")
    args.png = args.png or args.out / "dbs.png"  # a run never overwrites the docs' figures unless asked
    results = []
    for repeat in range(args.repeats):
        for clock in args.clock_list:
            for v in args.variant_list:
                started = time.monotonic()
                print(f"run {repeat + 1}, {clock} clock, {v.name}: training ...", flush=True)
                r = run_one(args, v, clock, repeat)
                results.append(r)
                print(f"  target at {r['time_to_target_s']:.1f}s, final {r['final_accuracy']:.4f}, "
                      f"utilisation {[round(u, 2) for u in r['utilisation']]}, batches {r.get('batches')}, "
                      f"step ms {[round(1000 * s) for s in r.get('step_s', [])]}, "
                      f"load {r['load'][0]:.1f} → {r['load'][1]:.1f} ({time.monotonic() - started:.0f}s in all)",
                      flush=True)
    plot(results, args)
    report(results, args)
    return 0


if __name__ == "__main__":
    run_main(main)
