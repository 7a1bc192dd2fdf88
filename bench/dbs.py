#!/usr/bin/env python
"""Dynamic batch size on heterogeneous peers: time to accuracy against synchronous
data-parallel training (issue 5).

One invocation trains the built-in MNIST example (peerd/examples/mnist.py) on 4
workers slowed by factors 1, 1, 2, 4 (after each step a worker sleeps (f − 1) × that
step's compute time: a slower device that uses no extra CPU), in three variants,
one after the other, with the same model, data, seed, optimizer, LR schedule,
global batch and epochs:

  sync   torch.distributed (gloo on loopback, FileStore rendezvous): 4 processes, equal local batches of
         B/4, DistributedSampler-style shards (a seeded permutation per epoch, rank r
         reads every 4th index), gradients averaged by all-reduce after every step —
         what a user picks today. Every step waits for the slowest worker.
  fixed  peerd: 4 real daemons (LocalCluster, one per slowdown), the job at a fixed
         local batch B/4 (global_batch = 0), gossip every round.
  dbs    the same with global_batch = B: each peer's batch follows its measured
         speed (peerd/core/shares.py), LR × b_i/mean(b), data split by the shares.

Reported per variant: wall time until the test accuracy first reaches --target
(sync: rank 0's model; peerd: the mean of the peers' latest evaluations, each peer
evaluates its own model every --eval-every rounds = steps of the global batch);
the final accuracy when the job's epochs are done (or at --budget seconds); and each
worker's utilisation = time in steps (the slowdown's sleep included) / wall time.
Clocks start when the first worker takes its first step (sync: after the process
group is up), so process start and torch import are not counted.

    .venv/bin/python bench/dbs.py                       # ~5-8 min on 2 cores
    .venv/bin/python bench/dbs.py --variants sync --out /tmp/dbs   # one variant

Outputs under --out (default runs/dbs-TIMESTAMP): curves.csv, summary.json, each
variant's logs; the plot goes to --png (default docs/img/dbs.png). Every process is
stopped by PID at the end of its variant, also on errors and Ctrl+C.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import tomli_w
from _harness import poll_until

from peerd.core.codes import ENDED_STATES, WorkerState
from peerd.interrupts import raise_interrupt

REPO = Path(__file__).resolve().parents[1]

POLL_S = 0.5


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--slowdowns", default="1,1,2,4", help="per-worker slowdown factors (default 1,1,2,4)")
    p.add_argument("--global-batch", type=int, default=128, help="B: samples per step of all workers (default 128)")
    p.add_argument("--epochs", type=float, default=8.0, help="passes over the 4,000 training digits (default 8)")
    p.add_argument("--lr", type=float, default=0.05, help="SGD LR at the global batch (default 0.05, cosine to 0)")
    p.add_argument("--target", type=float, default=0.94, help="test accuracy to reach (default 0.94)")
    p.add_argument("--eval-every", type=int, default=16,
                   help="evaluate every this many global steps (default 16; each peerd peer evaluates its own model)")
    p.add_argument("--period-steps", type=int, default=4,
                   help="peerd: local steps between gossip rounds (default 4; a variant NAME@N overrides it)")
    p.add_argument("--rebalance-rounds", type=int, default=5, help="peerd DBS: re-plan every this many rounds")
    p.add_argument("--budget", type=float, default=150.0, help="seconds of training at most per variant (default 150)")
    p.add_argument("--variants", default="sync,fixed,dbs,dbs@1",
                   help="which to run, in order: sync, fixed[@N], dbs[@N] (default sync,fixed,dbs,dbs@1)")
    p.add_argument("--out", type=Path, default=None, help="results folder (default runs/dbs-TIMESTAMP)")
    p.add_argument("--png", type=Path, default=REPO / "docs" / "img" / "dbs.png", help="where the plot goes")
    # Internal: one rank of the synchronous baseline.
    p.add_argument("--sync-rank", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.slowdown_list = tuple(float(v) for v in args.slowdowns.split(","))
    if any(f < 1 for f in args.slowdown_list) or args.global_batch % len(args.slowdown_list):
        p.error("slowdowns must be ≥ 1 and the global batch a multiple of the number of workers")
    return args


# ---- synchronous baseline: torch.distributed, one process per rank ------------

def sync_rank(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    from peerd.core.lr import cosine
    from peerd.examples.mnist import make_datasets, make_model

    rank, world = args.sync_rank, len(args.slowdown_list)
    slowdown = args.slowdown_list[rank]
    torch.set_num_threads(1)
    # Only loopback: a FileStore for the rendezvous (torch's TCPStore would listen on
    # every interface) and gloo's pair sockets pinned to lo.
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    dist.init_process_group("gloo", init_method=f"file://{args.out.resolve() / 'sync-rendezvous'}",
                            rank=rank, world_size=world)
    torch.manual_seed(0)  # the job's seed: same initial model as peerd's init = "shared"
    model = make_model().float()
    train, test = make_datasets()
    x, y = train.tensors
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=args.lr, momentum=0.9, weight_decay=0.0001)
    local = args.global_batch // world
    per_rank = math.ceil(len(y) / world)
    steps_per_epoch = math.ceil(per_rank / local)
    total_steps = math.ceil(args.epochs * steps_per_epoch)
    log = open(args.out / f"sync-{rank}.jsonl", "w", buffering=1)
    dist.barrier()
    t0 = time.perf_counter()
    compute, step = 0.0, 0
    while step < total_steps:
        epoch = step // steps_per_epoch
        gen = torch.Generator().manual_seed(1000 + epoch)
        perm = torch.randperm(len(y), generator=gen).tolist()
        perm += perm[: per_rank * world - len(perm)]  # DistributedSampler pads to equal shards
        shard = perm[rank::world]
        for start in range(0, per_rank, local):
            if step >= total_steps:
                break
            began = time.perf_counter()
            for group in opt.param_groups:
                group["lr"] = args.lr * cosine(step / total_steps)
            idx = torch.as_tensor(shard[start : start + local])
            model.train()
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            spent = time.perf_counter() - began
            time.sleep((slowdown - 1.0) * spent)
            compute += time.perf_counter() - began
            stop = 1.0 if rank == 0 and time.perf_counter() - t0 > args.budget else 0.0
            flat = torch.cat([p.grad.reshape(-1) for p in params] + [torch.tensor([stop])])
            dist.all_reduce(flat)  # waits for the slowest rank
            flat /= world
            offset = 0
            for p in params:
                p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
                offset += p.numel()
            opt.step()
            step += 1
            done = step >= total_steps or flat[-1] > 0
            if rank == 0 and (step % args.eval_every == 0 or done):
                accuracy = _evaluate(model, test)
                log.write(json.dumps({"t": time.perf_counter() - t0, "step": step, "accuracy": accuracy,
                                      "compute_s": compute}) + "\n")
            elif step % args.eval_every == 0 or done:
                log.write(json.dumps({"t": time.perf_counter() - t0, "step": step, "compute_s": compute}) + "\n")
            if done:
                step = total_steps
                break
    log.close()
    dist.destroy_process_group()


def _evaluate(model, test) -> float:
    import torch

    model.eval()
    x, y = test.tensors
    with torch.no_grad():
        correct = sum(int((model(x[i : i + 500]).argmax(1) == y[i : i + 500]).sum()) for i in range(0, len(y), 500))
    return correct / len(y)


def run_sync(args: argparse.Namespace) -> dict:
    (args.out / "sync-rendezvous").unlink(missing_ok=True)
    procs = []
    try:
        for rank in range(len(args.slowdown_list)):
            cmd = [sys.executable, __file__, "--sync-rank", str(rank),
                   "--out", str(args.out), "--slowdowns", args.slowdowns, "--global-batch", str(args.global_batch),
                   "--epochs", str(args.epochs), "--lr", str(args.lr), "--eval-every", str(args.eval_every),
                   "--budget", str(args.budget)]
            with open(args.out / f"sync-{rank}.log", "wb") as out:
                procs.append(subprocess.Popen(cmd, stdout=out, stderr=out, start_new_session=True))
        deadline = time.monotonic() + args.budget + 120
        for proc in procs:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        if any(p.returncode for p in procs):
            raise RuntimeError(f"a sync rank failed; see {args.out}/sync-*.log")
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    ranks = [[json.loads(line) for line in open(args.out / f"sync-{r}.jsonl")] for r in range(len(procs))]
    curve = [(row["t"], row["accuracy"]) for row in ranks[0] if "accuracy" in row]
    wall = ranks[0][-1]["t"]
    return _result("sync", curve, [r[-1]["compute_s"] / r[-1]["t"] for r in ranks], wall, args,
                   batches=[args.global_batch // len(procs)] * len(procs))


# ---- peerd variants: real daemons ------------------------------------------------

def job_text(args: argparse.Namespace, dbs: bool, period: int) -> str:
    from peerd.cluster import default_job

    data = tomllib.loads(default_job().read_text())
    n = len(args.slowdown_list)
    # Evaluations at the same numbers of global steps as the sync baseline's.
    data["job"].update(name="dbs-bench", local_batch=args.global_batch // n, epochs=args.epochs,
                       eval_every_rounds=max(1, args.eval_every // period),
                       global_batch=args.global_batch if dbs else 0,
                       min_local_batch=4, rebalance_rounds=args.rebalance_rounds, rebalance_threshold=0.1)
    data["optimizer"].update(lr=args.lr, reference_batch=args.global_batch, schedule="cosine")
    data["gossip"].update(period_steps=period)
    return tomli_w.dumps(data)


def run_peerd(args: argparse.Namespace, variant: str) -> dict:
    """`fixed` or `dbs`, with `@N` for N local steps between gossip rounds (default --period-steps)."""
    from peerd.cluster import LocalCluster

    kind, _, period = variant.partition("@")
    if kind not in ("fixed", "dbs"):
        raise SystemExit(f"unknown variant {variant!r}: sync, fixed[@N] or dbs[@N]")
    text = job_text(args, dbs=kind == "dbs", period=int(period or args.period_steps))
    with LocalCluster(len(args.slowdown_list), args.out / variant, slowdowns=args.slowdown_list) as cluster:
        cluster.wait_ready()
        poll_until(lambda: all(cluster.client(p).status().peers_known == len(cluster.peers) - 1 for p in cluster.peers),
               30, "discovery")
        for peer in cluster.peers:
            with cluster.client(peer) as c:
                c.join(text, "")
        rows, t0, curve = [], None, []
        deadline = time.monotonic() + args.budget + 90
        while time.monotonic() < deadline:
            now = time.monotonic()
            progress = [cluster.client(p).status().jobs[0] for p in cluster.peers]
            if t0 is None and any(j.progress.step > 0 for j in progress):
                t0 = now
            if t0 is not None:
                t = now - t0
                rows.append([(t, j.state, j.progress) for j in progress])
                accs = [j.progress.metric for j in progress]
                if all(a == a for a in accs):
                    curve.append((t, sum(accs) / len(accs)))
                if t > args.budget or all(j.state in ENDED_STATES for j in progress):
                    break
            time.sleep(POLL_S)
        if any(j.state == WorkerState.FAILED for j in progress):
            raise RuntimeError(f"{variant}: a worker failed; see {args.out / variant}")
    wall = rows[-1][0][0]
    last = _last_training(rows)
    utilisation = [p.compute_s / max(t, 1e-9) for t, _, p in last]
    with open(args.out / variant / "history.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["t", "peer", "state", "phase", "round", "epoch", "local_batch", "share", "samples_per_s",
                    "compute_s", "metric"])
        w.writerows([round(t, 2), k, s, p.phase, p.round, p.epoch, p.local_batch, p.share, p.samples_per_s,
                     p.compute_s, p.metric] for row in rows for k, (t, s, p) in enumerate(row))
    # Each peer's typical batch: the median over its training statuses (the last
    # step of an epoch is short, so its last batch says little).
    batches = [statistics.median_low([row[k][2].local_batch for row in rows if row[k][2].phase == "training"] or [0])
               for k in range(len(last))]
    return _result(variant, curve, utilisation, wall, args, batches=batches)


def _last_training(rows: list[list[tuple]]) -> list[tuple]:
    """Each peer's last status while it still trained (not finished)."""
    last = list(rows[0])
    for row in rows:
        for k, (t, state, p) in enumerate(row):
            if state == WorkerState.RUNNING and p.phase == "training":
                last[k] = (t, state, p)
    return last


# ---- report ------------------------------------------------------------------

def _result(variant: str, curve: list[tuple[float, float]], utilisation: list[float], wall: float,
            args: argparse.Namespace, **extra) -> dict:
    reached = next((t for t, a in curve if a >= args.target), math.nan)
    return {"variant": variant, "time_to_target_s": reached, "final_accuracy": curve[-1][1] if curve else math.nan,
            "wall_s": wall, "utilisation": utilisation, "curve": curve, **extra}


def plot(results: list[dict], args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in results:
        ax.plot([t for t, _ in r["curve"]], [a for _, a in r["curve"]], marker=".", label=r["variant"])
    ax.axhline(args.target, color="grey", linestyle=":", label=f"target {args.target}")
    ax.set(xlabel="wall time (s)", ylabel="test accuracy", ylim=(0.8, 1.0),
           title=f"MNIST-5k, 4 workers slowed {args.slowdowns}, global batch {args.global_batch}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    args.png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.png, dpi=100)
    plt.close(fig)


def report(results: list[dict], args: argparse.Namespace) -> None:
    base = next((r for r in results if r["variant"] == "sync"), None)
    print(f"\n| variant | time to {args.target} (s) | × sync | final accuracy | wall (s) | utilisation per worker | batches |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        ratio = r["time_to_target_s"] / base["time_to_target_s"] if base else math.nan
        print(f"| {r['variant']} | {r['time_to_target_s']:.1f} | {ratio:.2f} | {r['final_accuracy']:.4f} | "
              f"{r['wall_s']:.1f} | {' / '.join(f'{u:.2f}' for u in r['utilisation'])} | "
              f"{' / '.join(str(b) for b in r.get('batches', []))} |")
    with open(args.out / "curves.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["variant", "t", "accuracy"])
        for r in results:
            w.writerows([r["variant"], t, a] for t, a in r["curve"])
    summary = [{k: v for k, v in r.items() if k != "curve"} for r in results]
    (args.out / "summary.json").write_text(json.dumps({"args": vars(args) | {"out": str(args.out), "png": str(args.png)},
                                                       "results": summary}, indent=2, default=str))
    print(f"\nresults in {args.out}; plot {args.png}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.sync_rank is not None:
        sync_rank(args)
        return 0
    args.out = args.out or REPO / "runs" / time.strftime("dbs-%Y%m%d-%H%M%S")
    args.out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, raise_interrupt)
    results = []
    for variant in args.variants.split(","):
        started = time.monotonic()
        print(f"{variant}: training ...", flush=True)
        results.append(run_sync(args) if variant == "sync" else run_peerd(args, variant))
        r = results[-1]
        print(f"{variant}: target at {r['time_to_target_s']:.1f}s, final {r['final_accuracy']:.4f}, "
              f"utilisation {[round(u, 2) for u in r['utilisation']]}, batches {r.get('batches')} "
              f"({time.monotonic() - started:.0f}s in all)", flush=True)
    plot(results, args)
    report(results, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
