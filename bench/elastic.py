#!/usr/bin/env python
"""Elastic membership, 2 → 4 → 3 peers: smoothed vs immediate LR change.

One invocation trains the built-in MNIST example job (peerd/examples/mnist.toml)
in two variants, --repeats times each (interleaved), every run on a fresh local
cluster of 4 real `peerd` daemons on 127.0.0.1 that find each other through zeroconf:

  smooth     optimizer.ramp_steps = 8: on a change of the global batch by k the LR
             multiplier moves linearly to its new target over 8·max(k, 1/k) steps
  immediate  optimizer.ramp_steps = 0: the multiplier jumps to its target at once

Everything else is equal: the job (name, seed, lr, schedule, epochs), the data
order and the gossip partners (both derive from the job's name and the round), and
the membership schedule. With optimizer.reference_batch = 64 (= 2 peers × 32) the
LR multiplier is ×1 with 2 peers, ×2 with 4 and ×1.5 with 3:

  1. peer-0 and peer-1 join the job (`join` with the job's text);
  2. when both have reached round --join-at-round, peer-2 and peer-3 join by name
     (`join_by_name`, as `peerctl join NAME` does); they take the running peers'
     state ("joining: took the state of round ..." in their worker logs);
  3. when all four train and have reached round --leave-at-round, peer-3 leaves
     with `leave(name, drain=True)` (`peerctl leave --drain`).

The changes fire on rounds read from the daemons' status, not on wall time, so both
variants change at comparable points of training although their speed differs.

Every daemon's status is polled every --poll seconds (the worker reports to its
daemon every 0.5 s, so that is the real resolution). Outputs under --out:

  history.csv   one row per poll and peer: loss EMA, lr, global batch, round, ...
  events.csv    every membership change: when it was asked, at which round, and
                when the running peers' global batch (hence their LR) changed
  summary.json  the figures printed at the end
  elastic.png   loss, LR and accuracy against the job's round, both variants
  smooth-1/, immediate-1/, ...   each cluster's daemon and worker logs

Each change is rated by its loss spike: the largest mean loss EMA of the peers that
were already training ("incumbents") after the change, divided by their mean loss
EMA at the last poll before it was asked (windows: see `spikes`). The leave lowers
the LR (×2 → ×1.5), so its "spike" is the noise floor of this measure.

Why these job settings (defaults): lr 0.05 with a constant schedule. Constant, so the
only LR changes are the membership's (a clean A/B, LR curves easy to read); 0.05 at
64 becomes 0.1 with four peers, at the edge of what this model takes with momentum
0.9 (lr 0.1 from the start diverges to chance with two peers), so a jump can hurt;
at lr 0.03 neither variant shows more than the noise. 14 epochs and the rounds of
the changes give each phase ~100-250 rounds; one run takes 30-60 s on 2 cores.

    .venv/bin/python bench/elastic.py                       # 4 pairs, 4.5-7 min on 2 cores
    .venv/bin/python bench/elastic.py --repeats 1 --lr 0.03 --out /tmp/el
    .venv/bin/python bench/elastic.py --from runs/elastic-A --window 30   # re-analyse only

Every daemon is stopped by PID (LocalCluster.close) at the end of each run,
also on errors and on Ctrl+C / SIGTERM; every wait is bounded.
"""

from __future__ import annotations

import json
import math
import shutil
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness.cluster import DOWN, Watch, job_statuses, join_all, took_state, wait_discovery, wait_job_seen
from harness.output import pyplot, read_csv, write_csv, write_json
from harness.script import arg_parser, names, run_dir, run_main
from peerd.control.client import ControlClient
from peerd.cli.localcluster import LocalCluster, default_job, job_with
from peerd.errors import PeerdError

# One job name for every variant: the data order (my_shard) and the gossip
# partners (plan_round) are seeded by the job's name, so equal names mean equal
# seeds. Each variant runs in its own cluster (its own zeroconf realm), so the two
# specs never meet.
JOB = "elastic"
VARIANTS = {"smooth": 8, "immediate": 0}  # name -> optimizer.ramp_steps
N_DAEMONS = 4
FIRST, NEWCOMERS, LEAVER = (0, 1), (2, 3), 3  # peer indices
DONE_STATES = {"finished", "failed", "stopped"}
ABSENT = {"idle", "left", "down"}  # no job on that daemon (not joined yet, or left)
DISCOVERY_S = 30.0
JOIN_VISIBLE_S = 30.0  # for a newcomer's daemon to hear of the running job
START_ATTEMPTS = 3


class StartupFailed(PeerdError):
    """The cluster did not come up (before any training): worth one more try.

    Seen when another local cluster (the e2e tests, `peerd cluster`) runs at the same
    time: every LocalCluster names its daemons peer-0, peer-1, ... and the zeroconf
    service name is the peer id alone, so a second daemon called peer-0 on this
    machine fails with NonUniqueNameException, whatever its realm."""


def parse_args(argv: list[str] | None = None):
    p = arg_parser(__doc__, defaults=True,
                   epilog="The module docstring (bench/elastic.py) explains the method; docs/benchmarks.md has a run.")
    p.add_argument("--out", type=Path, default=None, help="output folder (default runs/elastic-TIMESTAMP)")
    p.add_argument("--seed", type=int, default=0, help="job.seed: the shared initial model")
    p.add_argument("--epochs", type=float, default=14, help="job.epochs")
    p.add_argument("--lr", type=float, default=0.05, help="optimizer.lr, for the reference batch of 64 (2 peers)")
    p.add_argument("--schedule", choices=("constant", "cosine"), default="constant", help="optimizer.schedule")
    p.add_argument("--join-at-round", type=int, default=150, help="peer-2 and peer-3 join once peer-0 and peer-1 reach this round")
    p.add_argument("--leave-at-round", type=int, default=400, help="peer-3 leaves (drain) once all four reach this round")
    p.add_argument("--window", type=int, default=60, help="rounds after a change in which its loss spike is measured")
    p.add_argument("--eval-every", type=int, default=20, help="job.eval_every_rounds (test accuracy curve)")
    p.add_argument("--repeats", type=int, default=4, help="pairs of runs, interleaved smooth/immediate, to see the noise")
    p.add_argument("--variants", default="smooth,immediate", help="comma-separated subset of: " + ", ".join(VARIANTS))
    p.add_argument("--poll", type=float, default=0.25, help="seconds between status polls")
    p.add_argument("--time-limit", type=float, default=300.0, help="seconds one run may take before it is stopped")
    p.add_argument("--png", type=Path, default=None, help="also write the figure here (e.g. docs/img/elastic.png)")
    p.add_argument("--from", dest="source", type=Path, default=None,
                   help="start nothing: read history.csv and events.csv of an earlier --out DIR and write its "
                        "figure and summary again (e.g. with another --window)")
    args = p.parse_args(argv)
    args.variants = names(p, args.variants, VARIANTS, "--variants")
    if not 0 < args.join_at_round < args.leave_at_round:
        p.error("need 0 < --join-at-round < --leave-at-round")
    if args.repeats < 1 or args.poll <= 0 or args.window < 1:
        p.error("--repeats and --window must be ≥ 1, --poll > 0")
    return args


# ---------------------------------------------------------------- the job


def job_text(args, ramp_steps: int) -> str:
    """The built-in example job with this benchmark's values."""
    # reference_batch 64 = 2 peers × local batch 32: the LR is args.lr with the
    # first two peers, and the linear scaling rule doubles it with four.
    return job_with(default_job(), job={"name": JOB, "seed": args.seed, "epochs": float(args.epochs),
                                        "eval_every_rounds": args.eval_every},
                    optimizer={"lr": args.lr, "schedule": args.schedule, "reference_batch": 64,
                               "ramp_steps": ramp_steps})


# ---------------------------------------------------------------- one run


@dataclass
class Run:
    variant: str
    repeat: int
    started: float = field(default_factory=time.monotonic)
    rows: list[dict] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)
    finished_rows: list[dict] = field(default_factory=list)  # the last poll
    complete: bool = False

    @property
    def label(self) -> str:
        return f"{self.variant}-{self.repeat}"

    def t(self) -> float:
        return round(time.monotonic() - self.started, 3)


def poll(cluster: LocalCluster, run: Run, left: set[int]) -> list[dict]:
    """One status row per daemon; a daemon without the job is 'idle' (not joined yet) or 'left'."""
    t = run.t()
    rows = []
    for i, j in enumerate(job_statuses(cluster, JOB)):
        row = {"variant": run.variant, "repeat": run.repeat, "t": t, "peer": f"peer-{i}", "state": "down",
               "phase": "", "epoch": 0, "step": 0, "round": 0, "loss": math.nan, "lr": math.nan,
               "global_batch": 0, "accuracy": math.nan, "samples_per_s": math.nan, "view_size": 0}
        if j is None:
            row["state"] = "left" if i in left else "idle"
        elif j is not DOWN:
            p = j.progress
            row.update(state=j.state, phase=p.phase, epoch=p.epoch, step=p.step, round=p.round, loss=p.loss,
                       lr=p.lr, global_batch=p.global_batch, accuracy=p.metric,
                       samples_per_s=p.samples_per_s, view_size=j.view_size)
        rows.append(row)
    return rows


def training(row: dict) -> bool:
    """The worker trains (not joining, syncing, draining, finished) and has reported a step."""
    return row["state"] == "running" and row["phase"] == "training" and row["step"] > 0


def run_variant(args, run: Run, out: Path) -> None:
    """Train the job once on a fresh cluster, changing membership on the way; fills `run`."""
    text = job_text(args, VARIANTS[run.variant])
    out.mkdir(parents=True, exist_ok=True)
    (out / "job.toml").write_text(text)
    with LocalCluster(N_DAEMONS, out) as cluster:
        try:
            cluster.wait_ready()
            wait_discovery(cluster, DISCOVERY_S)
        except PeerdError as exc:
            raise StartupFailed(str(exc)) from None
        run.started = time.monotonic()  # t = 0: the first join
        join_all(cluster, text, peers=[cluster.peers[i] for i in FIRST])
        changes = Changes(args, run, cluster)
        Watch(run.label, out, args.time_limit, args.poll, say_every_s=5.0).run(
            cluster, changes.poll, changes.over, lambda rows: " | ".join(
                f"{r['peer']} {r['phase'] or r['state']} r{r['round']} loss {r['loss']:.3f} lr {r['lr']:.3f}"
                for r in rows if r["state"] not in ABSENT))
    # LocalCluster.close() has stopped the daemons (and with them a still draining
    # worker), so the leave call has returned or failed by now.
    changes.settle()
    for e in run.events:  # the newcomers' own logs confirm they continued from the job's state
        if e["kind"] == "join":
            e["took_state"] = [took_state(out / f"peer-{i}", JOB) for i in e["peers"]]


class Changes:
    """The membership schedule of one run, fired on the rounds the daemons report:
    before-join → (peer-2 and peer-3 join) → before-leave → (peer-3 drains) → after-leave."""

    def __init__(self, args, run: Run, cluster: LocalCluster) -> None:
        self.args, self.run, self.cluster = args, run, cluster
        self.stage = "before-join"
        self.left: set[int] = set()
        self.leave_thread: threading.Thread | None = None
        self.leave_result: dict = {}

    def poll(self) -> list[dict]:
        rows = poll(self.cluster, self.run, self.left)
        self.run.rows += rows
        self.run.finished_rows = rows
        return rows

    def over(self, rows: list[dict]) -> bool:
        """Fire the change due, note what took effect; True once every worker is done."""
        if self.stage == "before-join" and _all_reached(rows, FIRST, self.args.join_at_round):
            self._join_newcomers(rows)
            self.stage = "before-leave"
        elif self.stage == "before-leave" and _all_reached(rows, FIRST + NEWCOMERS, self.args.leave_at_round):
            self._leave(rows)
            self.stage = "after-leave"
        _track(self.run, rows)
        active = [r for r in rows if r["state"] not in ABSENT]
        if not active or any(r["state"] not in DONE_STATES for r in active) or (
                self.leave_thread and self.leave_thread.is_alive()):
            return False
        self.run.complete = self.stage == "after-leave" and all(r["state"] == "finished" for r in active)
        return True

    def _join_newcomers(self, rows: list[dict]) -> None:
        self.run.events.append(_event(self.run, "join", rows, list(NEWCOMERS), FIRST))
        for i in NEWCOMERS:
            peer = self.cluster.peers[i]
            wait_job_seen(lambda: self.cluster.client(peer), JOB, JOIN_VISIBLE_S)
            with self.cluster.client(peer) as c:
                c.join_by_name(JOB)

    def _leave(self, rows: list[dict]) -> None:
        self.run.events.append(_event(self.run, "leave", rows, [LEAVER], FIRST + tuple(set(NEWCOMERS) - {LEAVER})))
        # leave(drain) returns only once the worker has left, so it runs beside
        # the polling; the drained worker stops after its round.
        self.leave_thread = threading.Thread(target=_leave, args=(self.cluster.peers[LEAVER].socket,
                                                                  self.leave_result), daemon=True)
        self.leave_thread.start()
        self.left.add(LEAVER)

    def settle(self) -> None:
        """When the leave call returned (or its error), once the daemons are stopped."""
        if self.leave_thread is None:
            return
        self.leave_thread.join(timeout=10.0)
        for e in self.run.events:
            if e["kind"] == "leave":
                e["returned_t"] = self.leave_result["t"] - self.run.started if "t" in self.leave_result else math.nan
                e["error"] = self.leave_result.get("error", "")


def _all_reached(rows: list[dict], peers: tuple[int, ...], round_: int) -> bool:
    return all(training(rows[i]) and rows[i]["round"] >= round_ for i in peers)


def _event(run: Run, kind: str, rows: list[dict], peers: list[int], incumbents: tuple[int, ...]) -> dict:
    """A membership change, asked for now; incumbents are the peers training through it."""
    inc = [rows[i] for i in incumbents]
    return {"variant": run.variant, "repeat": run.repeat, "kind": kind, "peers": list(peers),
            "incumbents": list(incumbents), "asked_t": run.t(),
            "asked_round": min(r["round"] for r in inc),
            "batch_before": max(r["global_batch"] for r in inc),
            # filled in by _track as the change takes effect
            "lr_change_t": math.nan, "lr_change_round": math.nan, "batch_after": 0,
            "arrived_t": math.nan, "arrived_round": math.nan}


def _leave(socket: Path, result: dict) -> None:
    try:
        with ControlClient(socket) as c:
            c.leave(JOB, drain=True)
        result["t"] = time.monotonic()
    except PeerdError as exc:
        result["error"] = str(exc)


def _track(run: Run, rows: list[dict]) -> None:
    """Note when a change takes effect, in the incumbents' rounds:
    lr_change  an incumbent's global batch (what its LR is scaled for) moved: the
               daemons count a peer in the job as soon as its daemon advertises it,
               while its worker still loads, and drop it a Hello after it has left;
    arrived    (join) every newcomer trains: the extra gradients really arrive."""
    for e in run.events:
        inc = [rows[i] for i in e["incumbents"]]
        if math.isnan(e["lr_change_t"]):
            moved = [r for r in inc if r["global_batch"] and r["global_batch"] != e["batch_before"]]
            if moved:
                e["lr_change_t"], e["lr_change_round"] = run.t(), min(r["round"] for r in inc)
                e["batch_after"] = moved[0]["global_batch"]
        if e["kind"] == "join" and math.isnan(e["arrived_t"]) and all(training(rows[i]) for i in e["peers"]):
            e["arrived_t"], e["arrived_round"] = run.t(), min(r["round"] for r in inc)


# ---------------------------------------------------------------- figures


def incumbent_series(run: Run, incumbents: list[int]) -> list[tuple[float, float, float]]:
    """(t, mean round, mean loss EMA) of the incumbents at every poll where all of them train."""
    by_t: dict[float, list[dict]] = {}
    for r in run.rows:
        by_t.setdefault(r["t"], []).append(r)
    out = []
    for t in sorted(by_t):
        rows = by_t[t]
        inc = [rows[i] for i in incumbents]
        if all(training(r) and not math.isnan(r["loss"]) for r in inc):
            out.append((t, statistics.fmean(r["round"] for r in inc), statistics.fmean(r["loss"] for r in inc)))
    return out


def spikes(run: Run, window: int) -> list[dict]:
    """Per change, the incumbents' mean loss EMA at the last poll before it was asked,
    and its largest value in two windows after it (each stops at the next change):
      lr       from the ask to `window` rounds after the incumbents' LR moved: the
               transient the ramp is meant to smooth;
      arrival  (join) from the ask to `window` rounds after the newcomers train: also
               the rounds in which the LR is already scaled for 4 peers but only 2 train."""
    out = []
    events = sorted(run.events, key=lambda e: e["asked_t"])
    for k, e in enumerate(events):
        series = incumbent_series(run, e["incumbents"])
        before = [s for s in series if s[0] <= e["asked_t"]]
        loss_before = before[-1][2] if before else math.nan
        stop = events[k + 1]["asked_round"] if k + 1 < len(events) else math.inf
        result = {"kind": e["kind"], "loss_before": loss_before}
        for name, anchor in (("lr", e["lr_change_round"]), ("arrival", e["arrived_round"])):
            if e["kind"] != "join" and name == "arrival":
                continue
            end = min(stop, (anchor if not math.isnan(anchor) else e["asked_round"]) + window)
            after = [s for s in series if s[0] > e["asked_t"] and s[1] <= end]
            peak = max(after, key=lambda s: s[2]) if after else None
            result[f"max_{name}"] = peak[2] if peak else math.nan
            result[f"peak_round_{name}"] = peak[1] if peak else math.nan
            result[f"spike_{name}"] = peak[2] / loss_before if peak and loss_before > 0 else math.nan
        out.append(result)
    return out


def final_accuracy(run: Run) -> tuple[float, list[float]]:
    accs = [r["accuracy"] for r in run.finished_rows if r["state"] == "finished" and not math.isnan(r["accuracy"])]
    return (statistics.fmean(accs) if accs else math.nan), accs


COLORS = {"smooth": "tab:blue", "immediate": "tab:red"}
STYLES = ["-", "--", ":", "-."]


def plot(runs: list[Run], path: Path, args) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(3, 2, figsize=(12, 10))
    (ax_loss, ax_lr), (ax_zj, ax_zl), (ax_acc, ax_lrz) = axes
    for run in runs:
        color, style = COLORS[run.variant], STYLES[(run.repeat - 1) % len(STYLES)]
        label = run.label
        mean = _mean_curves(run)
        xs = [m["round"] for m in mean]
        for ax in (ax_loss, ax_zj, ax_zl):
            ax.plot(xs, [m["loss"] for m in mean], style, color=color, label=label, lw=1.3)
        for ax in (ax_lr, ax_lrz):
            ax.plot(xs, [m["lr"] for m in mean], style, color=color, label=label, lw=1.3, drawstyle="steps-post")
        acc = [m for m in mean if not math.isnan(m["accuracy"])]
        ax_acc.plot([m["round"] for m in acc], [m["accuracy"] for m in acc], style, color=color, label=label, lw=1.3)
        for e in run.events:  # membership changes: asked (solid), newcomers training (dotted)
            for ax in axes.flat:
                ax.axvline(e["asked_round"], color=color, ls="-", lw=0.7, alpha=0.5)
                if not math.isnan(e["arrived_round"]):
                    ax.axvline(e["arrived_round"], color=color, ls=":", lw=1.0, alpha=0.7)
    j, lv, w = args.join_at_round, args.leave_at_round, args.window
    arrived = [e["arrived_round"] for run in runs for e in run.events if not math.isnan(e["arrived_round"])]
    j_end = max(arrived, default=j + 2 * w) + 2 * w
    ax_loss.set(title="training loss EMA, mean over training peers", xlabel="round", ylabel="loss", yscale="log")
    ax_lr.set(title="LR, mean over training peers", xlabel="round", ylabel="lr")
    ax_zj.set(title=f"loss around the join (2 → 4 peers at round ≈{j})", xlabel="round", ylabel="loss",
              xlim=(j - w, j_end))
    ax_zl.set(title=f"loss around the leave (4 → 3 peers at round ≈{lv})", xlabel="round", ylabel="loss",
              xlim=(lv - w, lv + 3 * w))
    accs = [m["accuracy"] for run in runs for m in _mean_curves(run) if m["round"] > j and not math.isnan(m["accuracy"])]
    ax_acc.set(title="test accuracy, mean over peers that report one", xlabel="round", ylabel="accuracy",
               ylim=(min(0.8, min(accs, default=0.8) - 0.02), 1.0))
    ax_lrz.set(title="LR around the join", xlabel="round", ylabel="lr", xlim=(j - w, j_end))
    for ax, lo, hi in ((ax_zj, j - w, j_end), (ax_zl, lv - w, lv + 3 * w)):
        _fit_y(ax, runs, lo, hi)
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    ax_loss.legend(fontsize=8)
    fig.suptitle(f"2 → 4 → 3 peers, lr {args.lr:g} ({args.schedule}) at reference batch 64, "
                 "smooth (ramp_steps 8) vs immediate (0)\n"
                 "vertical lines: membership change asked (solid), newcomers training (dotted)", fontsize=10)
    fig.tight_layout()
    _save_small(fig, path)
    plt.close(fig)


def _save_small(fig, path: Path) -> None:
    """PNG with a 64-colour palette: a few lines on white lose nothing visible, and the
    file stays small enough to commit (docs/img)."""
    import io

    from PIL import Image

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=80)
    buffer.seek(0)
    with Image.open(buffer) as image:
        image.convert("RGB").quantize(colors=64).save(path, optimize=True)


def _mean_curves(run: Run) -> list[dict]:
    """Per poll, the mean over peers that train (x = their mean round); repeated reports dropped."""
    by_t: dict[float, list[dict]] = {}
    for r in run.rows:
        by_t.setdefault(r["t"], []).append(r)
    out, last = [], None
    for t in sorted(by_t):
        rows = [r for r in by_t[t] if training(r) and not math.isnan(r["loss"])]
        if not rows:
            continue
        accs = [r["accuracy"] for r in rows if not math.isnan(r["accuracy"])]
        point = {"t": t, "round": statistics.fmean(r["round"] for r in rows),
                 "loss": statistics.fmean(r["loss"] for r in rows), "lr": statistics.fmean(r["lr"] for r in rows),
                 "accuracy": statistics.fmean(accs) if accs else math.nan}
        key = (point["round"], point["loss"])
        if key != last:
            out.append(point)
            last = key
    return out


def _fit_y(ax, runs: list[Run], lo: float, hi: float) -> None:
    ys = [m["loss"] for run in runs for m in _mean_curves(run) if lo <= m["round"] <= hi]
    if ys:
        ax.set_ylim(0, max(ys) * 1.15)


# ---------------------------------------------------------------- output


def summarise(runs: list[Run], args) -> dict:
    changes = []
    for run in runs:
        acc, accs = final_accuracy(run)
        seconds = run.finished_rows[0]["t"] if run.finished_rows else math.nan
        for s, e in zip(spikes(run, args.window), sorted(run.events, key=lambda e: e["asked_t"])):
            changes.append({"run": run.label, "variant": run.variant, "complete": run.complete, **s,
                            **{k: e[k] for k in ("asked_t", "asked_round", "lr_change_t", "lr_change_round",
                                                 "arrived_t", "arrived_round")},
                            "batch": f"{e['batch_before']}→{e['batch_after']}",
                            "final_acc": acc, "final_accs": accs, "seconds": seconds,
                            "took_state": e.get("took_state", []), "leave_error": e.get("error", "")})
    return {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}, "changes": changes}


def print_summary(summary: dict) -> None:
    """The figures as a Markdown table, one row per run (what docs/benchmarks.md shows),
    then per variant: median (range) over its runs."""
    print("\n| run | join asked / LR moved / newcomers train (round) | loss before | spike, LR window "
          "| spike, to arrival + window | leave asked / LR moved (round) | spike at leave | final acc | s |")
    print("|---|---|---|---|---|---|---|---|---|")
    runs = dict.fromkeys(c["run"] for c in summary["changes"])
    for run in runs:
        mine = [c for c in summary["changes"] if c["run"] == run]
        j = next((c for c in mine if c["kind"] == "join"), None)
        lv = next((c for c in mine if c["kind"] == "leave"), None)
        first = mine[0]
        cells = [run + ("" if first["complete"] else " (incomplete)")]
        cells += ([f"{j['asked_round']} / {_f(j['lr_change_round'], 0)} / {_f(j['arrived_round'], 0)}",
                   f"{j['loss_before']:.3f}", _f(j["spike_lr"], 2), _f(j["spike_arrival"], 2)]
                  if j else ["-"] * 4)
        cells += [f"{lv['asked_round']} / {_f(lv['lr_change_round'], 0)}", _f(lv["spike_lr"], 2)] if lv else ["-"] * 2
        cells += [_f(first["final_acc"], 4), _f(first["seconds"], 0)]
        print("| " + " | ".join(cells) + " |")
    print()
    for variant in dict.fromkeys(c["variant"] for c in summary["changes"]):
        mine = [c for c in summary["changes"] if c["variant"] == variant]
        joins, leaves = [c for c in mine if c["kind"] == "join"], [c for c in mine if c["kind"] == "leave"]
        print(f"{variant:<10} join: spike LR window {_span([c['spike_lr'] for c in joins])}, "
              f"to arrival {_span([c['spike_arrival'] for c in joins])}; "
              f"leave: {_span([c['spike_lr'] for c in leaves])}; final accuracy {_span([c['final_acc'] for c in joins], 4)}")


def _f(value: float, digits: int) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def _span(values: list[float], digits: int = 2) -> str:
    """median (min–max, n) of the values that are numbers."""
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return (f"median {statistics.median(values):.{digits}f} "
            f"({min(values):.{digits}f}–{max(values):.{digits}f}, n={len(values)})")


def run_with_retries(args, variant: str, repeat: int, where: Path, runs: list[Run]) -> Run:
    """One run on a fresh cluster; a cluster that fails to start is set aside and started again."""
    for attempt in range(1, START_ATTEMPTS + 1):
        run = Run(variant, repeat)
        try:
            run_variant(args, run, where)
            return run
        except StartupFailed as exc:
            if attempt == START_ATTEMPTS:
                raise
            failed = where.with_name(f"{where.name}-failed{attempt}")
            where.rename(failed)
            print(f"  cluster did not start ({exc}); logs kept in {failed}; trying again", flush=True)
            time.sleep(5.0)
        except BaseException:
            runs.append(run)  # a run that failed while training: its history is still written
            raise
    raise AssertionError("unreachable")


def load_runs(folder: Path) -> list[Run]:
    """The runs recorded in folder/history.csv and folder/events.csv (for --from)."""
    ints = ("repeat", "epoch", "step", "round", "global_batch", "view_size", "asked_round", "batch_before",
            "batch_after")
    floats = ("t", "loss", "lr", "accuracy", "samples_per_s", "asked_t", "lr_change_t", "lr_change_round",
              "arrived_t", "arrived_round", "returned_t")
    lists = ("peers", "incumbents", "took_state")
    runs: dict[tuple[str, int], Run] = {}
    for row in read_csv(folder / "history.csv", ints, floats, lists):
        runs.setdefault((row["variant"], row["repeat"]), Run(row["variant"], row["repeat"])).rows.append(row)
    for e in read_csv(folder / "events.csv", ints, floats, lists):
        runs[(e["variant"], e["repeat"])].events.append(e)
    for run in runs.values():
        last = max(r["t"] for r in run.rows)
        run.finished_rows = [r for r in run.rows if r["t"] == last]
        active = [r for r in run.finished_rows if r["state"] not in ABSENT]
        run.complete = any(e["kind"] == "leave" for e in run.events) and bool(active) and all(
            r["state"] == "finished" for r in active)
    return list(runs.values())


def report(runs: list[Run], args, out: Path) -> None:
    """Figure, summary.json and the printed table."""
    if not runs:
        return
    plot(runs, out / "elastic.png", args)
    if args.png is not None:
        args.png.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out / "elastic.png", args.png)
    summary = summarise(runs, args)
    write_json(out / "summary.json", summary)
    print_summary(summary)
    print(f"\nhistory: {out / 'history.csv'}; events: {out / 'events.csv'}; figure: {out / 'elastic.png'}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.source is not None:
        out = run_dir(args.out or args.source, "elastic")
        runs = load_runs(args.source)
        report(runs, args, out)
        return 0 if runs and all(r.complete for r in runs) else 1
    out = run_dir(args.out, "elastic")
    print(f"elastic benchmark: {', '.join(args.variants)} × {args.repeats}; out {out}", flush=True)
    runs: list[Run] = []
    try:
        for repeat in range(1, args.repeats + 1):
            for variant in args.variants:  # interleaved, so slow phases of the machine hit both
                print(f"{variant} #{repeat}: ramp_steps {VARIANTS[variant]}", flush=True)
                runs.append(run_with_retries(args, variant, repeat, out / f"{variant}-{repeat}", runs))
    finally:  # whatever ran is written, also after an error
        write_csv(out / "history.csv", [r for run in runs for r in run.rows])
        write_csv(out / "events.csv", [{k: (json.dumps(v) if isinstance(v, list) else v) for k, v in e.items()}
                                       for run in runs for e in run.events])
    report(runs, args, out)
    return 0 if all(r.complete for r in runs) else 1


if __name__ == "__main__":
    run_main(main)
