#!/usr/bin/env python
"""Capped links: time to target of peerd against DDP, per-peer utilisation, bytes
per peer per round and a newcomer's join time, through real network namespaces
shaped by tc tbf.

One invocation builds a bridge and one namespace per peer (peerd.soak.netns: veth
pairs, a tbf cap on each peer's link, both ways) and starts 5 real daemons in them
(peerd.soak.peers; zeroconf bound to the namespaces' addresses only). Four of them
train, slowed 1, 1, 2, 4 (a peer with F sleeps (F − 1) × each step's compute); the
fifth is the newcomer. For each cap in --caps (default 1000 and 100 Mbit/s; 20 works
too: tbf's burst and 200 ms queue are set per rate, and where a whole model takes
more than the exchange deadline's default ceiling of 10 s the jobs raise it to 1.5×
that link time), the
links are reshaped and each variant trains the same job, from the same seed, at
global batch 4 × 32. --job picks it:

  digits        (the default) a ~12M-parameter MLP (bench/jobs/bw_mlp.py, 784 →
                3072 → 3072 → 10) on the bundled MNIST digits, SGD lr 0.05 momentum
                0.9, constant LR; metric: test accuracy, --target 0.9
  charlm        the language-model example (peerd/examples/charlm.toml: a 0.64M-
                parameter character-level transformer, AdamW lr 3e-3, 20 warm-up
                steps then cosine over --epochs, clipping at 1.0), with
                reference_batch = 128 (the job's lr at the bench's global batch, no
                scaling) and fp32 (bf16 autocast is 4-10× slower on a CPU without
                bf16 instructions); metric: validation loss, lower is better.
                Without --target the target at each cap is the baseline's final
                validation loss + 1 % (with --epochs; read off the curves after the
                run, so nothing stops at it). Every model and DDP evaluate every 8
                steps (all 547 validation windows).

Variants:

  ddp           torch.distributed, gloo through the same namespaces and caps (each
                rank runs under `ip netns exec`, GLOO_SOCKET_IFNAME = its veth,
                FileStore rendezvous): after every step the flat gradient is
                all-reduced, as DDP does (one all-reduce, 48 MB for digits, instead
                of DDP's 25 MB buckets overlapped with the backward), then clipped
                if the job clips, and stepped; every step waits for the slowest
                rank. The ranks train the job the peers get, as peerd parses it
                (model, data, loss, evaluation, optimizer, LR schedule, precision).
                Rank 0 evaluates every 8 steps.
  peerd         peerd's crossover gossip every 8 local steps, fp32 wire, no overlap,
                dynamic batches (global_batch = 128: each peer's batch follows its
                speed, as bench/dbs.py's `dbs`; without them every round waits for
                the 4× slower peer)
  overlap       the same with [gossip] overlap = true
  overlap-bf16  the same with a bf16 wire as well
  peerd-p4, overlap-p4, overlap-bf16-p4   (not run by default) the three above
                with a round every 4 local steps: overlapped, the exchange is
                hidden and the one-round delay of the mixing costs half as many
                steps of drift (docs/algorithms.md, "Overlapped rounds")
  peerd-bf16, peerd-int8, overlap-int8   (not run by default) `peerd` with a bf16
                or an int8 wire (error feedback, docs/algorithms.md), and
                `overlap` with an int8 wire
  peerd-p1, peerd-p32   (not run by default) `peerd` with a round every local step
                (the plain every-step baseline) and every 32
  outer-8, outer-32     (not run by default) the outer step, `[outer] every = 8`
                or 32 (docs/algorithms.md, "The outer step"): a round every H local
                steps, then outer SGD of the shared anchor by the averaged change;
                the pairs with plain averaging at the same period are `peerd` and
                `peerd-p32`. Outer lr 0.7, Nesterov momentum 0.5 (--outer-lr,
                --outer-momentum): DiLoCo's momentum 0.9 makes the anchor's steady
                step 7× the averaged change, which falls apart over 8 steps of this
                kind of SGD inner loop (algorithms.md's figures), while 0.5 (1.4×)
                held; lr 1.0 with momentum 0 would be `peerd` again.
  outer-8-int8, outer-32-int8   the two with the changes on an int8 wire
                (docs/algorithms.md, "The outer step on the int8 wire")
  outer-8-overlap-int8   outer-8-int8 with the outer exchange behind the next 8
                steps ("The outer step overlapped")
  A variant this build's job parser refuses is skipped with its message (the
  rest of the run goes on).

peerd variants evaluate every 16 local steps (charlm: 8; each peer its own model; the curve is the
mean of the peers' latest values; the best peer's is printed and kept beside it). Every variant stops when the target is
reached or after --budget seconds of training; with --epochs E every variant
trains E epochs to its end instead (the same samples for every variant, DDP too),
and the table adds the final metric: the peers' own models' mean and the end
consensus's (for a loss also the own models' ÷ the baseline's; bytes per round are then counted until the last poll where every
trainer was still training, leaving out the end consensus's fp32 models). --baseline names the variant the ratios are taken against (DDP by
default). Reported per variant and cap: time
to --target, its ratio to DDP's, each peer's utilisation = time in steps (the
slowdown's sleep included) / wall time, over the window from its first to its last
sample (evaluations and exchanges that block count as idle), and the bytes each
peer sent plus received per round (DDP: per step), counted at its bridge port, so
the headers of every protocol and zeroconf's few packets are in, and all peers'
bytes together per sample they trained, from the first step to the end (with
--epochs the end consensus's included; a transfer counts at both ends; DDP: per
step ÷ the global batch). DDP stops at the target, at the end of
--epochs or at the budget (checked every step); a variant stopped by the budget
gets its last metric in the final column, marked unfinished.

After the `overlap` variant at the first cap of --join-cap (default 1000), the
newcomer joins the running job by name; its join time (join → first step on the
pulled state, with a standby worker) is set against the bytes it received
meanwhile divided by its link's rate; goal ≤ 1.2 × that + 1 s.

    sudo .venv/bin/python bench/bandwidth.py --out /tmp/bw --png docs/img/bandwidth.png
    sudo .venv/bin/python bench/bandwidth.py --slowdowns 1,1,1,1 --budget 90 --join-cap 0
    sudo .venv/bin/python bench/bandwidth.py --caps 1000 --variants ddp,overlap --budget 90
    sudo .venv/bin/python bench/bandwidth.py --join-only --budget 30 --joins 3   # the join alone: ~2 min
    sudo .venv/bin/python bench/bandwidth.py --caps 100 --variants peerd,peerd-bf16,peerd-int8 \
        --baseline peerd --epochs 3 --together --budget 300 --join-cap 0   # the wires against each other
    sudo .venv/bin/python bench/bandwidth.py --caps 100,20 --variants ddp,peerd-p1,peerd,outer-8,outer-32 \
        --epochs 2 --together --budget 120 --join-cap 0   # the outer step on capped links
    sudo .venv/bin/python bench/bandwidth.py --job charlm --caps 20 \
        --variants ddp,peerd-p1,outer-8,outer-32,outer-8-int8 --epochs 1 --together --budget 480 \
        --join-cap 0   # the language-model job: time to DDP's final validation loss + 1 %
    .venv/bin/python bench/bandwidth.py --replot /tmp/bw/summary.json --png /tmp/bw.png

The first took 20 min on 2 vCPUs at load 9-23 (8 runs of at most --budget = 120 s
of training, each with ~30-60 s of worker start and leave; DDP at 100 Mbit/s and the
variants that miss the target use the whole budget); the second 11 min. A run
leaves ~2.3 GB under --out (summary.json, table.md, logs, and the 95 MB checkpoint
each worker keeps when it leaves a job): delete it when done.

Needs root (network namespaces, tc); on the host nothing but the namespaces' own
names is touched. Every daemon, worker and rank is stopped by PID and every
namespace removed at the end, also on errors, Ctrl+C and SIGTERM.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import subprocess
import sys
import tempfile
import time
import tomllib
from argparse import SUPPRESS
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import tomli_w

from harness import ROOT
from harness.cluster import (
    TOOK_STATE, job_of, join_by_name, peers_known, poll_until, pulled, stamp_of, wait_job_seen,
)
from harness.output import md_table, pyplot, save_figure, write_json
from harness.ranks import gloo_group, kill_ranks, wait_ranks
from harness.script import arg_parser, run_dir, run_main
from harness.training import allreduce_grads
from peerd.core.codes import ENDED_STATES, WorkerState
from peerd.core.slowdown import CLOCKS, Slowdown
from peerd.errors import ConfigError, PeerdError
from peerd.settings.jobspec import parse_job
from peerd.soak.netns import Namespaces, namespaces_unavailable
from peerd.soak.peers import STOP_TIMEOUT_S, SoakPeer, slowdown_table

JOBS = ROOT / "bench" / "jobs"


@dataclass(frozen=True)
class Variant:
    """A peerd variant's [gossip] and [outer] settings."""

    overlap: bool = False
    wire: str = "fp32"
    period: int = 8  # local steps per round ([gossip] period_steps), without an outer step
    outer: int = 0  # [outer] every = H: a round, then the outer step, every H local steps; 0: none

    @property
    def steps_per_round(self) -> int:
        return self.outer or self.period


VARIANTS = {"ddp": None, "peerd": Variant(), "overlap": Variant(True),
            "overlap-bf16": Variant(True, "bf16"), "peerd-p4": Variant(period=4), "overlap-p4": Variant(True, period=4),
            "overlap-bf16-p4": Variant(True, "bf16", 4), "peerd-bf16": Variant(wire="bf16"),
            "peerd-int8": Variant(wire="int8"), "overlap-int8": Variant(True, "int8"),
            "peerd-p1": Variant(period=1), "peerd-p32": Variant(period=32),
            "outer-8": Variant(outer=8), "outer-32": Variant(outer=32),
            "outer-8-int8": Variant(wire="int8", outer=8), "outer-32-int8": Variant(wire="int8", outer=32),
            "outer-8-overlap-int8": Variant(True, "int8", outer=8)}
GLOBAL_BATCH = 128
MODEL_BYTES = 11_885_578 * 4  # bw_mlp's fp32 parameters
DEADLINE_CEILING_S = 10.0  # [gossip] deadline_ceiling_s's default
LR = 0.05


@dataclass(frozen=True)
class Job:
    """What --job trains: the job file's [job], [optimizer] and [train] tables (the
    bench's own [job] keys, the variant's [gossip] and [outer] go on top), its fp32
    model's bytes, its default --target (None: the baseline's final metric at the
    same cap, 1 % worse) and the steps between evaluations (DDP's and each peer's)."""

    name: str
    tables: dict
    model_bytes: int
    target: float | None
    eval_steps: int

    @property
    def metric(self) -> str:
        return self.tables["job"]["metric"]

    @property
    def mode(self) -> str:  # "max" or "min" ([job] metric_mode)
        return self.tables["job"].get("metric_mode", "max")


def charlm_tables() -> dict:
    """peerd/examples/charlm.toml as the language-model job's tables, with two
    changes: reference_batch = the bench's global batch (lr 3e-3 at 128, so DDP and
    peerd step at the job's own lr, no scaling), and fp32: bf16 autocast on a CPU
    without bf16 instructions (this host's) makes a step 4-10× slower."""
    spec = tomllib.loads((ROOT / "peerd/examples/charlm.toml").read_text())
    job = {k: v for k, v in spec["job"].items() if k in ("module", "seed", "init", "data_mode", "metric",
                                                          "metric_mode", "chance")}
    return {"job": job, "optimizer": spec["optimizer"] | {"reference_batch": GLOBAL_BATCH},
            "train": spec["train"] | {"precision": "fp32"}}


JOB_KINDS = {
    "digits": Job("digits", {"job": {"module": "bw_mlp", "metric": "accuracy", "seed": 0, "init": "shared",
                                     "data_mode": "shared"},
                             "optimizer": {"name": "sgd", "lr": LR, "momentum": 0.9, "weight_decay": 0.0001,
                                           "schedule": "constant", "reference_batch": GLOBAL_BATCH}},
                  MODEL_BYTES, 0.9, 16),
    "charlm": Job("charlm", charlm_tables(), 636_032 * 4, None, 8),
}
DEFAULT_VARIANTS = "ddp,peerd,overlap,overlap-bf16"
DDP_EVAL_EVERY = 8  # steps
# The outer step's lr and momentum (Nesterov): docs/algorithms.md, "The outer step":
# DiLoCo's 0.7 / 0.9 make the anchor's steady step 7× the averaged change and fall
# apart over 8 SGD steps; momentum 0.5 (1.4×) held there.
OUTER_LR, OUTER_MOMENTUM = 0.7, 0.5
POLL_S = 0.5
START_S = 150.0  # a variant's workers/ranks to start training
JOIN_S = 120.0
STANDBY_WARM_S = 15.0

# ---------------------------------------------------------------- pure parts


def utilisation(points: list[tuple[float, float]]) -> float:
    """Compute share of the wall time between a peer's first and last (t, compute_s)
    samples; NaN with fewer than two samples or no time between them."""
    if len(points) < 2 or points[-1][0] <= points[0][0]:
        return math.nan
    (t0, c0), (t1, c1) = points[0], points[-1]
    return (c1 - c0) / (t1 - t0)


def at_target(metric: float, target: float | None, mode: str = "max") -> bool:
    """Whether a metric has reached the target: ≥ it, or ≤ it for a loss (mode "min")."""
    if target is None:
        return False
    return metric <= target if mode == "min" else metric >= target


def time_to_target(curve: list[tuple[float, float]], target: float | None, mode: str = "max") -> float:
    """The first time the metric reaches the target; NaN if it never does."""
    return next((t for t, m in curve if at_target(m, target, mode)), math.nan)


def targets(results: list, target: float | None, baseline: str, slack: float = 0.01) -> dict[float, float]:
    """The target at each cap: --target, or (None) the baseline's final metric at that
    cap worsened by `slack` (a loss × 1.01, an accuracy × 0.99); NaN where it has none."""
    caps = {r.cap for r in results}
    if target is not None:
        return dict.fromkeys(caps, target)
    base = {r.cap: r for r in results if r.variant == baseline}
    return {c: (base[c].final * (1 + slack if base[c].mode == "min" else 1 - slack) if c in base else math.nan)
            for c in caps}


def bytes_per_round(before: tuple[int, int], after: tuple[int, int], rounds: int) -> float:
    """(sent + received) bytes between two (sent, received) counter readings, per round."""
    if rounds <= 0:
        return math.nan
    return ((after[0] - before[0]) + (after[1] - before[1])) / rounds


def bytes_per_sample(before: dict, after: dict, samples: float) -> float:
    """(sent + received) bytes of every peer between two counters() readings, per
    sample the peers trained meanwhile (a transfer counts at both its ends)."""
    if samples <= 0:
        return math.nan
    return sum((after[i][0] - before[i][0]) + (after[i][1] - before[i][1]) for i in before) / samples


def host_cpu() -> tuple[int, int]:
    """(busy, total) jiffies of every CPU of this host, from /proc/stat."""
    fields = [int(v) for v in open("/proc/stat").readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def busy_share(before: tuple[int, int], after: tuple[int, int]) -> float:
    """The share of the host's CPU time that was busy between two host_cpu() readings."""
    total = after[1] - before[1]
    return (after[0] - before[0]) / total if total > 0 else math.nan


def link_seconds(nbytes: float, mbit: float) -> float:
    return nbytes * 8 / (mbit * 1e6)


def join_goal_s(state_bytes: float, mbit: float) -> float:
    """The goal for a join: 1.2 × the state's bytes / the link's rate, + 1 s."""
    return 1.2 * link_seconds(state_bytes, mbit) + 1.0


@dataclass
class Result:
    variant: str
    cap: float
    curve: list[tuple[float, float]]
    utilisation: list[float]
    bytes_per_round: list[float]
    steps_per_round: int
    wall_s: float
    rounds: list[int] = field(default_factory=list)
    best: list[tuple[float, float]] = field(default_factory=list)  # peerd: the best peer's latest metric
    host_busy: float = math.nan  # share of the host's CPUs busy while it trained (every process, not only peerd's)
    # peerd: each peer's own account at the end, as shares of its training time:
    # {"compute": c, "round": r, "evaluate": e, "checkpoint": k} (Progress.waited_s), and
    # the mean seconds of an exchange and of a round
    breakdown: list[dict[str, float]] = field(default_factory=list)
    final: float = math.nan  # --epochs: the mean of the peers' own final metric
    consensus: float = math.nan  # --epochs: the end consensus's metric
    bytes_per_sample: float = math.nan  # every peer's bytes in + out, per sample trained
    mode: str = "max"  # the metric's: "min" for a loss

    def time_to(self, target: float | None) -> float:
        return time_to_target(self.curve, target, self.mode)


def fmt_time(seconds: float, budget: float) -> str:
    return f"{seconds:.0f}" if seconds == seconds else f"> {budget:.0f} (not reached)"


def table(results: list[Result], target: float | None, budget: float, baseline: str = "ddp",
          finals: bool = False) -> str:
    """The markdown table: variant × cap, ratios to the same cap's baseline; the
    final metrics with `finals` (--epochs) or when a variant has one, and for a loss
    (mode "min") the own models' final ÷ the baseline's. A target of None: the
    baseline's final at the same cap, 1 % worse (targets())."""
    finals = finals or any(r.final == r.final for r in results)
    loss = any(r.mode == "min" for r in results)
    by_cap = targets(results, target, baseline)
    name = f"{target}" if target is not None else f"{baseline}'s final + 1 %"
    return md_table(["cap (Mbit/s)", "variant", f"time to {name} (s)", f"× {baseline}", "utilisation min / mean",
                     "MB per peer per round (in + out)", "kB per sample", "steps per round", "host CPU busy",
                     *(["final: own / consensus", "wall (s)"] if finals else []),
                     *([f"final ÷ {baseline}'s"] if finals and loss else [])],
                    (_table_row(r, results, by_cap[r.cap], budget, baseline, finals, loss) for r in results))


def _table_row(r: Result, results: list[Result], target: float, budget: float, baseline: str,
               finals: bool, loss: bool = False) -> list[str]:
    base = next((b for b in results if b.cap == r.cap and b.variant == baseline), None)
    t, tb = r.time_to(target), base.time_to(target) if base else math.nan
    if r.final == r.final:
        final = f"{r.final:.4f} / {r.consensus:.4f}"
    else:  # stopped by --budget: the last value of its curve
        final = f"unfinished: {r.curve[-1][1]:.4f} at the stop" if r.curve else "unfinished"
    extra = [final, f"{r.wall_s:.0f}"] if finals else []
    if finals and loss:
        extra.append(f"{r.final / base.final:.3f}" if base is not None and r.final == r.final
                     and base.final == base.final else "n/a")
    if r.variant == baseline or base is None:
        ratio = "—"
    elif t == t and tb == tb:
        ratio = f"{t / tb:.2f}"
    elif t == t:  # DDP did not reach it within the budget
        ratio = f"< {t / budget:.2f}"
    else:
        ratio = "n/a"
    us = [u for u in r.utilisation if u == u]
    util = f"{min(us):.2f} / {sum(us) / len(us):.2f}" if us else "n/a"
    mb = [b / 1e6 for b in r.bytes_per_round if b == b]
    traffic = f"{sum(mb) / len(mb):.1f}" if mb else "n/a"
    per_sample = f"{r.bytes_per_sample / 1e3:.0f}" if r.bytes_per_sample == r.bytes_per_sample else "n/a"
    reached = fmt_time(t, budget) if t == t or r.final != r.final else f"not reached (ended at {r.wall_s:.0f})"
    return [f"{r.cap:g}", r.variant, reached, ratio, util, traffic, per_sample, str(r.steps_per_round),
            f"{r.host_busy:.2f}", *extra]


# ---------------------------------------------------------------- arguments


def parse_args(argv: list[str] | None = None):
    p = arg_parser(__doc__)
    p.add_argument("--caps", default="1000,100", help="link caps in Mbit/s, in turn (default 1000,100)")
    p.add_argument("--variants", default=DEFAULT_VARIANTS,
                   help=f"which to run at each cap, in order, of {', '.join(VARIANTS)} (default {DEFAULT_VARIANTS})")
    p.add_argument("--budget", type=float, default=120.0,
                   help="seconds of training at most per variant and cap (default 120)")
    p.add_argument("--job", choices=JOB_KINDS, default="digits",
                   help="what the variants train: digits (bench/jobs/bw_mlp.py; metric test accuracy) or charlm "
                        "(peerd/examples/charlm.toml's language model in fp32, reference_batch 128; metric "
                        "validation loss, lower is better) (default digits)")
    p.add_argument("--target", type=float, default=None,
                   help="the metric to reach (digits: accuracy, default 0.9; charlm: validation loss, default "
                        "none: the time to reach the baseline's final validation loss at the same cap + 1 %%, "
                        "read off the curves after the run)")
    p.add_argument("--baseline", default="ddp", help="the variant the ratios are taken against (default ddp)")
    p.add_argument("--epochs", type=float, default=0.0,
                   help="peerd variants train a job of this many epochs to its end, not to the target (default 0: "
                        "until the target)")
    p.add_argument("--outer-lr", type=float, default=OUTER_LR,
                   help=f"the outer-* variants' [outer] lr (default {OUTER_LR})")
    p.add_argument("--outer-momentum", type=float, default=OUTER_MOMENTUM,
                   help=f"the outer-* variants' [outer] momentum, Nesterov (default {OUTER_MOMENTUM})")
    p.add_argument("--together", action="store_true",
                   help="peerd variants: the trainers start together ([job] min_peers = their number), none "
                        "joins another that trains alone first (a join's state pull costs ~5 s a donor range "
                        "at 100 Mbit/s)")
    p.add_argument("--slowdowns", default="1,1,2,4", help="per-peer slowdown factors (default 1,1,2,4)")
    p.add_argument("--clock", choices=CLOCKS, default="wall",
                   help="the slowdown's clock, for DDP's ranks and peerd's workers alike: wall (a step's wall "
                        "time, which on a busy host includes waiting for the CPU, so a slow peer is slowed by "
                        "more than its factor) or cpu (its thread's CPU time) (default wall)")
    p.add_argument("--join-cap", type=float, default=1000.0,
                   help="measure the newcomer's join at this cap, after `overlap` (0: no join; default 1000)")
    p.add_argument("--join-only", action="store_true",
                   help="only the join: the overlap variant at --join-cap, trained --budget s, then --joins joins")
    p.add_argument("--joins", type=int, default=1,
                   help="joins of the newcomer in a row (it leaves and its checkpoint is removed in between)")
    p.add_argument("--out", type=Path, default=None, help="results folder (default runs/bandwidth-TIMESTAMP)")
    p.add_argument("--png", type=Path, default=None, help="where the plot goes (default OUT/bandwidth.png)")
    p.add_argument("--replot", type=Path, default=None, metavar="SUMMARY",
                   help="only redraw the plot and the table from a run's summary.json")
    # Internal: one DDP rank.
    p.add_argument("--ddp-rank", type=int, default=None, help=SUPPRESS)
    p.add_argument("--ddp-store", default="", help=SUPPRESS)
    args = p.parse_args(argv)
    args.kind = JOB_KINDS[args.job]
    if args.target is None:
        args.target = args.kind.target
    args.cap_list = [float(c) for c in args.caps.split(",")]
    args.variant_list = args.variants.split(",")
    if args.join_only:
        if args.join_cap <= 0:
            p.error("--join-only needs a --join-cap")
        args.cap_list, args.variant_list = [args.join_cap], ["overlap"]
    if args.joins < 1:
        p.error("--joins must be ≥ 1")
    args.slowdown_list = [float(f) for f in args.slowdowns.split(",")]
    if unknown := [v for v in args.variant_list if v not in VARIANTS]:
        p.error(f"unknown variants {unknown}: choose from {', '.join(VARIANTS)}")
    if any(c <= 0 for c in args.cap_list) or any(f < 1 for f in args.slowdown_list):
        p.error("caps must be > 0 and slowdowns ≥ 1")
    return args


# ---------------------------------------------------------------- the testbed


class Testbed:
    """The namespaces and the daemons (trainers, then the newcomer); close() removes all."""

    def __init__(self, args, out: Path) -> None:
        self.args = args
        self.out = out
        self.net = Namespaces(secrets.token_hex(2))
        self._sockets = Path(tempfile.mkdtemp(prefix="peerd-bw-"))
        self.peers: list[SoakPeer] = []

    @property
    def trainers(self) -> list[SoakPeer]:
        return self.peers[: len(self.args.slowdown_list)]

    @property
    def newcomer(self) -> SoakPeer:
        return self.peers[-1]

    def open(self) -> None:
        if slowdown_table() != "worker":
            raise PeerdError("this build's daemon takes no [worker] slowdown setting")
        self.net.open()
        realm = f"bw-{self.net.tag}"
        factors = [*self.args.slowdown_list, 1.0]  # the newcomer last, at full speed
        for i, factor in enumerate(factors):
            net = self.net.add_peer(i, 0.0)
            peer = SoakPeer(i, self.out / "peers" / f"peer-{i}", self._sockets / f"p{i}.sock", net, slowdown=factor)
            peer.dir.mkdir(parents=True, exist_ok=True)
            # Only the newcomer keeps a standby worker: the trainers' would only load the CPUs.
            trainer = i < len(factors) - 1
            peer.write_config(realm, None, worker={"slowdown": factor, "slowdown_clock": f'"{self.args.clock}"',
                                                   "standby": str(not trainer).lower()})
            self.peers.append(peer)
        if not self.net.multicast_crosses(0, 1):
            raise PeerdError("multicast does not cross the bridge: zeroconf could not work")
        for peer in self.peers:
            peer.start()
        for peer in self.peers:
            peer.wait_ready()
        n = len(self.peers) - 1
        poll_until(lambda: all(peers_known(p.client()) >= n for p in self.peers), 60, "every daemon to see the others")

    def shape(self, mbit: float) -> None:
        for i in self.net.peers:
            self.net.shape(i, mbit, both_ways=True)

    def close(self) -> None:
        for peer in self.peers:
            peer.terminate()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for peer in self.peers:
            peer.reap(deadline)
        errors = self.net.close()
        for sock in self._sockets.glob("*"):
            sock.unlink(missing_ok=True)
        self._sockets.rmdir()
        if errors:
            print("teardown: " + "; ".join(errors), file=sys.stderr)


def _job(peer: SoakPeer, name: str):
    return job_of(peer.client(), name)


# ---------------------------------------------------------------- DDP


def ddp_rank(args) -> None:
    """One rank, inside its namespace: train until rank 0 says stop (target or budget).
    It trains the job the peerd variants train (the same job text, parsed by peerd:
    model and seed, data, loss, evaluation, optimizer, LR schedule, precision and
    clipping), with the gradients all-reduced after each backward."""
    import torch
    from torch.utils.data import DataLoader, default_collate

    from peerd.core.schedule import schedule_factor
    from peerd.worker.train.jobmodule import JobCode
    from peerd.worker.train.optim import build_optimizer
    from peerd.worker.train.precision import Precision
    from peerd.worker.train.slowdown import SlowedSteps

    rank, world, kind = args.ddp_rank, len(args.slowdown_list), args.kind
    torch.set_num_threads(1)  # before SlowedSteps: its cpu clock is then the thread's
    slowed = SlowedSteps(Slowdown(args.slowdown_list[rank], args.clock))
    spec = parse_job(job_text("ddp", Variant(), args.epochs, job=kind), "ddp")
    log = open(args.out / f"ddp-{rank}.jsonl", "w", buffering=1)
    with gloo_group(args.ddp_store, rank, world, iface=None) as dist, log:  # GLOO_SOCKET_IFNAME: its veth
        code = JobCode(spec, str(JOBS))
        torch.manual_seed(spec.seed)
        model = code.make_model()
        train, test = code.datasets(None)
        params = list(model.parameters())
        opt = build_optimizer(params, spec.optimizer)
        precision = Precision(spec.train.precision, torch.device("cpu"), spec.train.grad_clip_norm)
        total = ddp_steps(len(train), world, args.epochs)  # 0: until the target
        o = spec.optimizer
        dist.barrier()
        t0, compute = time.perf_counter(), 0.0
        for step, idx in enumerate(_ddp_batches(len(train), rank, world)):
            slowed.start()
            model.train()
            opt.zero_grad(set_to_none=True)
            with precision.autocast():
                value, _ = code.loss(model, default_collate([train[i] for i in idx.tolist()]))
            precision.backward(value)
            compute += slowed.finish()  # the slowdown's sleep included, as peerd's workers
            row = {"t": time.perf_counter() - t0, "step": step, "compute_s": compute}
            flag = 0.0
            # The budget is checked every step: at 20 Mbit/s one step is ~30 s.
            row["finished"] = bool(total and step + 1 >= total)
            end = row["finished"] or row["t"] > args.budget
            if rank == 0 and (step % DDP_EVAL_EVERY == 0 and step or end):
                model.eval()
                with torch.no_grad():
                    row["metric"] = code.evaluate(model, DataLoader(test, batch_size=GLOBAL_BATCH))[kind.metric]
                flag = float(end or (not total and at_target(row["metric"], args.target, kind.mode)))
            stop = allreduce_grads(params, flag, world) > 0  # waits for the slowest rank
            # peerd's LR: the schedule over the job's samples (epochs or the bench's 1000), warm-up by steps.
            done = step * GLOBAL_BATCH / (len(train) * (spec.epochs or 1000.0))
            for group in opt.param_groups:
                group["lr"] = o.lr * schedule_factor(o.schedule, done, step, o.warmup_steps)
            precision.step(opt, params)  # clips the averaged gradient, as DDP with clipping does
            log.write(json.dumps(row) + "\n")
            if stop:
                break


def ddp_steps(n: int, world: int, epochs: float) -> int:
    """The steps of `epochs` epochs of n samples at the global batch (0: no end)."""
    return math.ceil(epochs * ((n // world) // (GLOBAL_BATCH // world))) if epochs else 0


def _ddp_batches(n: int, rank: int, world: int):
    """This rank's sample indices, step after step: a seeded permutation per epoch, in equal shards."""
    import torch

    local, per_rank, epoch = GLOBAL_BATCH // world, n // world, 0
    while True:
        shard = torch.randperm(n, generator=torch.Generator().manual_seed(1000 + epoch))[rank::world]
        for start in range(0, per_rank - local + 1, local):
            yield shard[start : start + local]
        epoch += 1


def run_ddp(bed: Testbed, cap: float, out: Path) -> Result:
    out.mkdir(parents=True, exist_ok=True)
    store = out / "rendezvous"
    args = bed.args
    procs = []
    env = dict(os.environ)
    before, cpu = bed.net.counters(), host_cpu()
    try:
        for rank, peer in enumerate(bed.trainers):
            cmd = peer.net.command([sys.executable, __file__, "--ddp-rank", str(rank), "--ddp-store", str(store),
                                    "--out", str(out), "--slowdowns", args.slowdowns, "--clock", args.clock,
                                    "--job", args.job, "--epochs", str(args.epochs), "--budget", str(args.budget),
                                    *(["--target", str(args.target)] if args.target is not None else [])])
            with open(out / f"ddp-{rank}.log", "wb") as log:
                procs.append(subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                              start_new_session=True,
                                              env=env | {"GLOO_SOCKET_IFNAME": peer.net.veth, "OMP_NUM_THREADS": "1"}))
        wait_ranks(procs, args.budget + START_S, f"a DDP rank failed; see {out}/ddp-*.log")
    finally:
        kill_ranks(procs)
    after, busy = bed.net.counters(), busy_share(cpu, host_cpu())
    ranks = [[json.loads(line) for line in open(out / f"ddp-{r}.jsonl")] for r in range(len(procs))]
    steps = len(ranks[0])
    result = Result("ddp", cap, curve=[(row["t"], row["metric"]) for row in ranks[0] if "metric" in row],
                    utilisation=[utilisation([(row["t"], row["compute_s"]) for row in r]) for r in ranks],
                    bytes_per_round=[bytes_per_round(before[i], after[i], steps) for i in range(len(procs))],
                    steps_per_round=1, wall_s=ranks[0][-1]["t"], rounds=[steps] * len(procs), host_busy=busy,
                    bytes_per_sample=bytes_per_sample(before, after, steps * GLOBAL_BATCH), mode=args.kind.mode)
    if ranks[0][-1].get("finished") and result.curve:
        result.final = result.consensus = result.curve[-1][1]  # one model: its own is the consensus
    return result


# ---------------------------------------------------------------- peerd


def deadline_ceiling_s(mbit: float, model_bytes: int = MODEL_BYTES) -> float:
    """The exchange deadline's ceiling for a cap: the default, or 1.5 × a whole
    fp32 model's link time where that is longer (20 Mbit/s: 19 s a model, so 10 s
    would leave half the segments of every round unfetched)."""
    return max(DEADLINE_CEILING_S, round(1.5 * link_seconds(model_bytes, mbit), 1))


def job_text(name: str, v: Variant, epochs: float = 0.0, min_peers: int = 1,
             outer: tuple[float, float] = (OUTER_LR, OUTER_MOMENTUM), cap: float = 1000.0,
             job: Job = JOB_KINDS["digits"]) -> str:
    """The job a peerd variant trains at a cap; `outer`: the outer step's (lr, momentum)."""
    gossip = {"segments": 8, "overlap": v.overlap, "wire": v.wire,
              "deadline_ceiling_s": deadline_ceiling_s(cap, job.model_bytes)}
    tables = {}
    if v.outer:  # [outer] every sets the rounds' period: no period_steps with it
        tables["outer"] = {"every": v.outer, "lr": outer[0], "momentum": outer[1], "nesterov": True}
    else:
        gossip["period_steps"] = v.period
    every = max(1, job.eval_steps // v.steps_per_round)
    return tomli_w.dumps({
        **job.tables,
        "job": {**job.tables["job"], "name": name, "local_batch": GLOBAL_BATCH // 4, "epochs": epochs or 1000.0,
                "min_peers": min_peers,
                "eval_every_rounds": every,
                # Batches that follow each peer's speed (bench/dbs.py), so no one waits for the slowest.
                "global_batch": GLOBAL_BATCH, "min_local_batch": 4,
                "rebalance_rounds": every,  # as often as evaluations
                "rebalance_threshold": 0.1},
        "gossip": gossip,
        **tables,
        "checkpoint": {"every_rounds": 0, "every_s": 0.0},
    })


def refused(variant: str, outer: tuple[float, float] = (OUTER_LR, OUTER_MOMENTUM),
            job: Job = JOB_KINDS["digits"]) -> str:
    """Why this build's job parser refuses the variant's job ("" if it takes it),
    so that a run of many variants skips it with peerd's own reason."""
    if VARIANTS[variant] is None:
        return ""
    try:
        parse_job(job_text(f"bw-{variant}", VARIANTS[variant], outer=outer, job=job), variant)
    except ConfigError as exc:
        return str(exc)
    return ""


def run_peerd(bed: Testbed, variant: str, cap: float, out: Path, join: bool) -> tuple[Result, list[dict]]:
    args = bed.args
    v = VARIANTS[variant]
    name = f"bw-{variant}-{cap:g}"
    text = job_text(name, v, args.epochs, len(bed.trainers) if args.together else 1,
                    (args.outer_lr, args.outer_momentum), cap, args.kind)
    out.mkdir(parents=True, exist_ok=True)
    (out / "job.toml").write_text(text)
    for peer in bed.trainers:
        with peer.client(timeout_s=30.0) as c:
            c.join(text, str(JOBS))
    joined = []
    try:
        trace = _follow(bed, name, f"{variant} at {cap:g} Mbit/s")
        after, busy = bed.net.counters(), busy_share(trace.cpu, host_cpu())
        end, samples = after, _samples(trace.jobs) - trace.samples0
        for k in range(args.joins if join else 0):
            if k:
                rejoin_reset(bed, name)
            joined.append(measure_join(bed, name, cap))
            print(f"  join {k}: {joined[-1]['total_s']:.2f}s (pull {joined[-1]['pull_s']:.2f}s)", flush=True)
    finally:
        _leave(bed, name)
    rounds = [j.progress.round if j is not None else 0 for j in trace.jobs]
    if args.epochs and trace.training:
        after, counted = trace.training, trace.training_rounds
    else:
        counted = rounds
    result = Result(variant, cap, curve=trace.curve, utilisation=[utilisation(p) for p in trace.points],
                    bytes_per_round=[bytes_per_round(trace.before[i], after[i], r) for i, r in enumerate(counted)],
                    steps_per_round=v.steps_per_round, wall_s=trace.t, rounds=rounds, best=trace.best, host_busy=busy,
                    breakdown=[time_shares(j.progress) if j is not None else {} for j in trace.jobs],
                    # The whole run's bytes (with --epochs the end consensus's too): a
                    # window cut at a poll splits a round of 32 steps and says little.
                    bytes_per_sample=bytes_per_sample(trace.before, end, samples), mode=args.kind.mode)
    if args.epochs:
        result.final, result.consensus = final_metrics(trace.jobs, args.kind.metric)
    return result, joined


def final_metrics(jobs: list, metric: str = "accuracy") -> tuple[float, float]:
    """The mean of the peers' own final metric and the end consensus's (NaN
    where a job did not finish)."""
    metrics = [dict(j.progress.metrics) if j is not None and j.state == WorkerState.FINISHED else {} for j in jobs]
    own = [m.get(metric, math.nan) for m in metrics]
    agreed = [m.get(f"consensus_{metric}", math.nan) for m in metrics]
    return sum(own) / len(own), sum(agreed) / len(agreed)


@dataclass
class Trace:
    """What the trainers report while they train: each one's (t, compute_s), the
    mean and the best peer's metric over time, from the first step (t0, when the
    link and CPU counters were read), and their last statuses."""

    points: list[list[tuple[float, float]]]
    curve: list[tuple[float, float]] = field(default_factory=list)
    best: list[tuple[float, float]] = field(default_factory=list)
    t0: float | None = None
    t: float = 0.0
    before: dict = field(default_factory=dict)
    cpu: tuple[int, int] = (0, 0)
    jobs: list = field(default_factory=list)
    # The link counters and rounds at the last poll where every trainer was training:
    # bytes per round leave out the end consensus's fp32 models (--epochs).
    training: dict = field(default_factory=dict)
    training_rounds: list = field(default_factory=list)
    samples0: int = 0  # the samples the trainers had trained (all together) at t0

    def sample(self, t: float, jobs: list) -> None:
        self.t = t
        for k, j in enumerate(jobs):
            if j is not None and j.progress.step > 0 and j.state == WorkerState.RUNNING:
                self.points[k].append((t, j.progress.compute_s))
        metrics = [j.progress.metric if j is not None else math.nan for j in jobs]
        if all(m == m for m in metrics):
            self.curve.append((t, sum(metrics) / len(metrics)))
        if any(m == m for m in metrics):
            self.best.append((t, max(m for m in metrics if m == m)))


def _follow(bed: Testbed, name: str, label: str) -> Trace:
    """Poll the trainers until the mean metric reaches --target, --budget is spent
    or every worker has ended."""
    args = bed.args
    trace = Trace([[] for _ in bed.trainers])
    deadline = time.monotonic() + args.budget + START_S
    while time.monotonic() < deadline:
        now = time.monotonic()
        trace.jobs = jobs = [_job(p, name) for p in bed.trainers]
        if any(j is not None and j.state == WorkerState.FAILED for j in jobs):
            raise PeerdError(f"{label}: a worker failed; see {bed.out / 'peers'}")
        if trace.t0 is None and any(j is not None and j.progress.step > 0 for j in jobs):
            trace.t0, trace.before, trace.cpu = now, bed.net.counters(), host_cpu()
            trace.samples0 = _samples(jobs)
        if trace.t0 is not None:
            trace.sample(now - trace.t0, jobs)
            if all(j is not None and j.progress.phase == "training" for j in jobs):
                trace.training, trace.training_rounds = bed.net.counters(), [j.progress.round for j in jobs]
            reached = not args.epochs and trace.curve and at_target(trace.curve[-1][1], args.target, args.kind.mode)
            if (reached or trace.t > args.budget
                    or all(j is not None and j.state in ENDED_STATES for j in jobs)):
                return trace
        time.sleep(POLL_S)
    if trace.t0 is None:
        raise PeerdError(f"{label}: no worker trained within {START_S:.0f}s")
    return trace


def _samples(jobs: list) -> int:
    return sum(j.progress.samples for j in jobs if j is not None)


def time_shares(progress) -> dict[str, float]:
    """A worker's own account of its training time (at its last round's report):
    the shares spent computing and waiting, by cause."""
    if progress.training_s <= 0:
        return {}
    mean_exchange = progress.exchange_sum_s / progress.exchange_count if progress.exchange_count else math.nan
    return {"compute": progress.compute_s / progress.training_s,
            **{cause: s / progress.training_s for cause, s in sorted(progress.waited_s.items())},
            "exchange_mean_s": mean_exchange, "round_mean_s": progress.training_s / max(1, progress.rounds_done)}


def measure_join(bed: Testbed, name: str, cap: float) -> dict:
    """The newcomer joins `name` by name; from then to its first step on the pulled state."""
    newcomer = bed.newcomer
    wait_job_seen(newcomer.client, name)
    before = bed.net.counters()[newcomer.index]
    started, log = join_by_name(lambda: newcomer.client(timeout_s=30.0), newcomer.dir, name, JOIN_S)
    received = bed.net.counters()[newcomer.index][1] - before[1]
    took = pulled(log)
    if took is None or TOOK_STATE not in log:
        raise PeerdError(f"the newcomer did not take the state from its peers:\n{log}")
    total = stamp_of(log, "training from round") - started
    return {"cap_mbit": cap, "total_s": total, "pull_s": took[1], "donors": took[0],
            "received_bytes": received, "link_s": link_seconds(received, cap),
            "goal_s": join_goal_s(received, cap)}


def rejoin_reset(bed: Testbed, name: str) -> None:
    """The newcomer leaves `name` and becomes a newcomer again: its worker stopped,
    its log set aside and its checkpoint removed (a checkpoint is loaded before
    the pull), a fresh standby worker up."""
    newcomer = bed.newcomer
    daemon_log = newcomer.dir / "daemon.log"
    standbys = daemon_log.read_text().count("standby worker pid")
    with newcomer.client(timeout_s=60.0) as c:
        c.leave(name)
    job_dir = newcomer.dir / "state" / "jobs" / name
    log_path = job_dir / "worker.log"
    log_path.rename(job_dir / f"worker-{time.time():.0f}.log")
    for path in (job_dir / "checkpoints").glob("*"):
        path.unlink()
    poll_until(lambda: daemon_log.read_text().count("standby worker pid") > standbys, 60,
               "the newcomer's next standby worker")
    # The standby says nothing when its imports are done (~4 s on a busy host):
    # give it the time, or the join measures them.
    time.sleep(STANDBY_WARM_S)


def _leave(bed: Testbed, name: str) -> None:
    """Every daemon leaves the job, all at once; wait (bounded) until none runs a worker of it."""
    def leave(peer: SoakPeer) -> None:
        try:
            with peer.client(timeout_s=30.0) as c:
                if any(j.name == name for j in c.status().jobs):
                    c.leave(name)
        except PeerdError as exc:
            print(f"{peer.peer_id}: leaving {name}: {exc}", file=sys.stderr)

    with ThreadPoolExecutor(len(bed.peers)) as pool:
        list(pool.map(leave, bed.peers))

    def gone() -> bool:
        return all((j := _job(p, name)) is None or j.state in ENDED_STATES or not j.worker_pid for p in bed.peers)

    poll_until(gone, 60, f"every worker of {name} to stop")


# ---------------------------------------------------------------- report


def plot(results: list[Result], args) -> None:
    plt = pyplot()
    caps = sorted({r.cap for r in results}, reverse=True)
    fig, axes = plt.subplots(1, len(caps) + 2, figsize=(4.5 * (len(caps) + 2), 4))
    colour = {v: plt.get_cmap("tab20")(k) for k, v in enumerate(VARIANTS)}  # 17 variants: C0-C9 would repeat
    for ax, cap in zip(axes, caps):
        for r in (r for r in results if r.cap == cap):
            ax.plot([t for t, _ in r.curve], [m for _, m in r.curve], color=colour[r.variant], marker=".", markersize=3, label=r.variant)
        target = targets(results, args.target, args.baseline)[cap]
        if target == target:
            ax.axhline(target, color="grey", linestyle=":", label=f"target {target:.4g}")
        ax.set(xlabel="wall time (s)", ylabel=args.kind.metric, title=f"{cap:g} Mbit/s links",
               **({"ylim": (0.5, 1.0)} if args.job == "digits" else {}))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    labels = [f"{r.variant}\n{r.cap:g}" for r in results]
    util, traffic = axes[-2], axes[-1]
    for k, r in enumerate(results):
        us = [u for u in r.utilisation if u == u]
        util.scatter([k] * len(us), us, color=colour[r.variant], s=14)
        mb = [b / 1e6 for b in r.bytes_per_round if b == b]
        traffic.bar(k, sum(mb) / max(1, len(mb)), color=colour[r.variant])
    util.axhline(0.85, color="grey", linestyle=":", label="goal 0.85")
    util.set(ylabel="compute / wall, per peer", ylim=(0, 1.05), title="utilisation")
    util.legend(fontsize=8)
    traffic.set(ylabel="MB per peer per round (in + out)", title="traffic (DDP: a round = a step)")
    for ax in (util, traffic):
        ax.set_xticks(range(len(results)), labels, fontsize=7)
    what = "12M-parameter MLP, MNIST-5k" if args.job == "digits" else "0.64M-parameter char-level LM"
    fig.suptitle(f"{what}, 4 peers slowed {args.slowdowns} ({args.clock} clock)")
    fig.tight_layout()
    save_figure(fig, [args.png])


def load_results(summary: Path, args) -> tuple[list[Result], list[dict]]:
    """The results and joins a run wrote to its summary.json; its target, budget
    and slowdowns onto args."""
    data = json.loads(summary.read_text())
    target = data["args"]["target"]
    args.target, args.budget = None if target == "None" else float(target), float(data["args"]["budget"])
    args.job = data["args"].get("job", "digits")
    args.kind = JOB_KINDS[args.job]
    args.slowdowns, args.clock = data["args"]["slowdowns"], data["args"].get("clock", "wall")
    args.baseline = data["args"].get("baseline", "ddp")
    args.epochs = float(data["args"].get("epochs", 0))
    return [Result(**r) for r in data["results"]], data["joins"]


def report(results: list[Result], joins: list[dict], args) -> str:
    lines = [table(results, args.target, args.budget, args.baseline, bool(args.epochs)), ""]
    if args.target is None:
        lines += [f"Target at {cap:g} Mbit/s: {args.kind.metric} {t:.4f} ({args.baseline}'s final + 1 %)"
                  for cap, t in sorted(targets(results, None, args.baseline).items(), reverse=True)] + [""]
    for j in joins:
        ok = "meets" if j["total_s"] <= j["goal_s"] else "misses"
        lines.append(f"Join at {j['cap_mbit']:g} Mbit/s: {j['total_s']:.2f} s from join to the first step "
                     f"(state pull {j['pull_s']:.2f} s from {j['donors']}); {j['received_bytes'] / 1e6:.1f} MB "
                     f"received = {j['link_s']:.2f} s of link; goal ≤ {j['goal_s']:.2f} s: {ok} it")
    return "\n".join(lines)


def save(results: list[Result], joins: list[dict], args) -> None:
    write_json(args.out / "summary.json", {"args": {k: str(v) for k, v in vars(args).items()},
                                           "results": [vars(r) for r in results], "joins": joins}, indent=2)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.ddp_rank is not None:
        sys.path.insert(0, str(JOBS))
        ddp_rank(args)
        return 0
    if args.replot is not None:
        results, joins = load_results(args.replot, args)
        args.out = args.replot.parent
        args.png = args.png or args.out / "bandwidth.png"
        plot(results, args)
        print(report(results, joins, args))
        return 0
    if why := namespaces_unavailable():
        print(f"bench/bandwidth.py needs network namespaces: {why}", file=sys.stderr)
        return 2
    for variant in list(args.variant_list):
        if why := refused(variant, (args.outer_lr, args.outer_momentum), args.kind):
            print(f"skipping {variant}: this build refuses its job: {why}", file=sys.stderr)
            args.variant_list.remove(variant)
    if not args.variant_list:
        return 2
    args.out = run_dir(args.out, "bandwidth").resolve()
    args.png = args.png or args.out / "bandwidth.png"  # the docs' figure only when asked
    # The job's module must be importable by every worker (and the DDP ranks).
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(JOBS), str(ROOT), os.environ.get("PYTHONPATH")]))
    results, joins = [], []
    bed = Testbed(args, args.out)
    try:
        bed.open()
        for cap in args.cap_list:
            bed.shape(cap)
            for variant in args.variant_list:
                started = time.monotonic()
                print(f"{cap:g} Mbit/s, {variant}: training ...", flush=True)
                where = args.out / f"{variant}-{cap:g}"
                if variant == "ddp":
                    result = run_ddp(bed, cap, where)
                else:
                    join = variant == "overlap" and cap == args.join_cap and not joins
                    result, joined = run_peerd(bed, variant, cap, where, join)
                    joins += joined
                results.append(result)
                reached = "" if args.target is None else (
                    f"target at {result.time_to(args.target):.1f}s (best peer: "
                    f"{time_to_target(result.best, args.target, result.mode):.1f}s), ")
                print(f"  {reached}final {result.final:.4f} / {result.consensus:.4f}, utilisation "
                      f"{[round(u, 2) for u in result.utilisation]}, MB/round "
                      f"{[round(b / 1e6, 1) for b in result.bytes_per_round]}, kB/sample "
                      f"{result.bytes_per_sample / 1e3:.0f}, rounds {result.rounds}, host CPU busy "
                      f"{result.host_busy:.2f}, time shares "
                      f"{[{k: round(v, 2) for k, v in b.items()} for b in result.breakdown]} "
                      f"({time.monotonic() - started:.0f}s in all)", flush=True)
    finally:
        bed.close()
    save(results, joins, args)
    if not args.join_only:
        plot(results, args)
    text = report(results, joins, args)
    (args.out / "table.md").write_text(text + "\n")
    print(text)
    print(f"\nresults in {args.out}" + ("" if args.join_only else f"; plot {args.png}"))
    return 0


if __name__ == "__main__":
    run_main(main)
