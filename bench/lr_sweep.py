"""LR scaling law × cap × ramp length T on joins and leaves of k = 2, 4, 8.

Every run is `python -m peerd.sim --algorithm crossover --model mlp --hidden 64
--local-batch 32 --lr 0.2 --rounds 300` with the membership change at t = 1.0 s
(round ~16 of 300): a join of 4(k−1) peers to 4 (4 → 4k) or the leave of 4(k−1)
of 4k peers (4k → 4). Baselines are the same runs with no change, at 4, 8, 16 and
32 peers. One row per run goes to --out/runs.csv; a finished row is not run again,
so the sweep can be stopped and resumed. `--report` prints the markdown table and
draws the PNG from that file.

    nice -n 10 env OMP_NUM_THREADS=1 .venv/bin/python bench/lr_sweep.py --out sim-out/lr-sweep
    .venv/bin/python bench/lr_sweep.py --out sim-out/lr-sweep --report --png docs/img/lr-sweep.png
"""

from __future__ import annotations

import csv
import math
import sys
import time
from pathlib import Path

import numpy as np

from harness.output import md_table, pyplot, save_figure
from harness.script import arg_parser, numbers, run_main
from peerd.sim import SimConfig, Simulation, parse_schedule
from peerd.sim.task import Task

BASE = dict(algorithm="crossover", model="mlp", hidden=64, local_batch=32, lr=0.2, rounds=300)
POLICIES = (("linear", math.inf), ("linear", 4.0), ("linear", 2.0), ("sqrt", math.inf), ("sqrt", 2.0), ("none", 1.0))
FIELDS = ("scenario", "start", "end", "law", "max_scale", "T", "seed", "accuracy", "min_peer", "final_loss", "max_lr", "cpu_s")


def scenario(name: str) -> tuple[int, int, tuple[str, ...]]:
    """'join8' → (4, 32, events); 'leave8' → (32, 4, events); 'base16' → (16, 16, ())."""
    kind, k = name.rstrip("0123456789"), int(name.lstrip("abcdefghijklmnopqrstuvwxyz"))
    if kind == "base":
        return k, k, ()
    if kind == "join":
        return 4, 4 * k, (f"join:{4 * (k - 1)}@1.0",)
    return 4 * k, 4, tuple(f"leave:{slot}@1.0" for slot in range(4, 4 * k))


def plan(seeds: list[int], ts: list[int], ks: list[int], kinds: tuple[str, ...] | list[str] = ("join", "leave"),
         policies=POLICIES) -> list[tuple[str, str, float, int, int]]:
    sizes = {4, *(4 * k for k in ks)} if "leave" in kinds else {4}  # the starting sizes
    runs = []
    for s in seeds:  # seed outermost: a sweep cut short by its budget still covers every cell once
        runs += [(f"base{n}", "none", 1.0, 0, s) for n in sorted(sizes)]
        for k in ks:
            for kind in kinds:
                for law, cap in policies:
                    runs += [(f"{kind}{k}", law, cap, t, s) for t in (ts if law != "none" else [0])]
    return runs


def run_one(task: Task, name: str, law: str, cap: float, t: int, seed: int) -> dict:
    start, end, events = scenario(name)
    cfg = SimConfig(peers=start, scaling=law, max_scale=cap, ramp_steps=t, seed=seed,
                    schedule=parse_schedule(list(events)), **BASE)
    cpu = time.process_time()
    result = Simulation(cfg, task).run()
    s = result.summary
    assert s["peers_end"] == end, (name, s["peers_end"])
    return dict(scenario=name, start=start, end=end, law=law, max_scale=cap, T=t, seed=seed,
                accuracy=s["test_accuracy_mean_peer"], min_peer=s["test_accuracy_min_peer"],
                final_loss=s["final_train_loss"], max_lr=max(r["lr"] for r in result.rounds),
                cpu_s=round(time.process_time() - cpu, 2))


def _key(row: dict) -> tuple:
    return row["scenario"], row["law"], float(row["max_scale"]), int(row["T"]), int(row["seed"])


def sweep(out: Path, runs: list[tuple], budget_s: float) -> None:
    path = out / "runs.csv"
    done = {_key(r) for r in csv.DictReader(path.open())} if path.exists() else set()
    todo = [r for r in runs if (r[0], r[1], float(r[2]), r[3], r[4]) not in done]
    print(f"{len(runs)} runs, {len(todo)} to do", file=sys.stderr)
    task, started = Task("mlp", 64, 1e-4), time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    with path.open("a", newline="") as f:
        writer = csv.DictWriter(f, FIELDS)
        if not done:
            writer.writeheader()
        for i, run in enumerate(todo):
            if time.monotonic() - started > budget_s:
                print(f"budget of {budget_s:.0f} s spent; {len(todo) - i} runs left", file=sys.stderr)
                return
            row = run_one(task, *run)
            writer.writerow(row)
            f.flush()
            print(f"[{i + 1}/{len(todo)}] {run}: {row['accuracy']:.4f} ({row['cpu_s']} s CPU)", file=sys.stderr)


def _cells(rows: list[dict]) -> dict[tuple, list[float]]:
    cells: dict[tuple, list[float]] = {}
    for r in rows:
        cells.setdefault((r["scenario"], r["law"], float(r["max_scale"]), int(r["T"])), []).append(float(r["accuracy"]))
    return cells


def _policy(law: str, cap: float) -> str:
    return "none" if law == "none" else f"{law}, cap {cap:g}" if math.isfinite(cap) else f"{law}, no cap"


def report(out: Path, png: Path | None) -> None:
    rows = list(csv.DictReader((out / "runs.csv").open()))
    cells = _cells(rows)
    base = {int(s[4:]): np.mean(v) for (s, *_), v in cells.items() if s.startswith("base")}
    scen = sorted({s for s, *_ in cells if not s.startswith("base")}, key=lambda s: (s[0] != "j", int(s.lstrip("joinleav"))))
    print("baselines (no change), mean ± std over seeds: " + ", ".join(
        f"{n} peers {100 * np.mean(v):.1f} ± {100 * np.std(v):.1f}" for n, v in
        sorted((int(s[4:]), v) for (s, *_), v in cells.items() if s.startswith("base"))))
    print()
    policies = sorted({(law, cap, t) for (s, law, cap, t) in cells if not s.startswith("base")},
                      key=lambda p: (p[0], -p[1], p[2]))
    print(md_table(["law", "T", *(f"{s[:-1]} {scenario(s)[0]}→{scenario(s)[1]}" for s in scen), "worst"],
                   (_policy_row(cells, base, scen, *policy) for policy in policies)))
    if png:
        plot(cells, base, scen, policies, png)


def _policy_row(cells, base, scen: list[str], law: str, cap: float, t: int) -> list[str]:
    """One policy's final accuracy per scenario, and its difference to the run at the starting size."""
    deltas, texts = [], []
    for s in scen:
        v = cells.get((s, law, cap, t))
        if not v:
            texts.append("–")
            continue
        d = 100 * (np.mean(v) - base[scenario(s)[0]])
        deltas.append(d)
        texts.append(f"{100 * np.mean(v):.1f} ({d:+.1f})" + (f" [{len(v)}]" if len(v) != 3 else ""))
    worst = f"{min(deltas):+.1f}" if deltas else "–"
    return [_policy(law, cap), str(t) if law != "none" else "–", *texts, worst]


def plot(cells, base, scen, policies, png: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(2, len(scen) // 2 or 1, figsize=(4 * max(1, len(scen) // 2), 6.5), sharey=True, squeeze=False)
    for ax, s in zip(axes.flat, scen):
        for law, cap in dict.fromkeys((p[0], p[1]) for p in policies):
            ts = sorted(t for (ss, l, c, t) in cells if (ss, l, c) == (s, law, cap))
            if not ts:
                continue
            d = [100 * (np.array(cells[(s, law, cap, t)]) - base[scenario(s)[0]]) for t in ts]
            xs = [max(t, 1) for t in ts] if law != "none" else [1, 32]
            ys = [v.mean() for v in d] if law != "none" else [d[0].mean()] * 2
            line, = ax.plot(xs, ys, marker="o" if law != "none" else None, ls="--" if law == "none" else "-",
                            label=_policy(law, cap))
            for x, y in zip(xs, ys):
                if y < -12:  # off the chart: say where it went
                    ax.annotate(f"{y:.0f}", (x, -11.5), color=line.get_color(), fontsize=8, ha="center")
        ax.axhspan(-1, 1, color="0.9")
        ax.set(xscale="log", title=f"{s[:-1]} {scenario(s)[0]} → {scenario(s)[1]}", xlabel="ramp T",
               ylim=(-12, 4))
        ax.set_xticks([1, 8, 32], labels=["0", "8", "32"])
        ax.minorticks_off()
        ax.set_ylabel("final accuracy − no change (points)")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle("crossover, mlp 64, local batch 32, LR 0.2, 300 rounds; mean of 3 seeds; grey band ±1 point; "
                 "a cap that does not bind draws under the uncapped line", fontsize=9)
    fig.tight_layout()
    save_figure(fig, [png])


def parse_args(argv: list[str] | None = None):
    p = arg_parser(__doc__, raw=True, description=__doc__)
    p.add_argument("--out", type=Path, default=Path("sim-out/lr-sweep"))
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--T", default="0,8,32", help="comma list of ramp lengths T")
    p.add_argument("--k", default="2,4,8", help="comma list of join/leave factors")
    p.add_argument("--kinds", default="join,leave", help="comma list: join, leave")
    p.add_argument("--policies", default=",".join(f"{law}:{cap:g}" for law, cap in POLICIES),
                   help="comma list of LAW:CAP (default %(default)s)")
    p.add_argument("--budget-s", type=float, default=1500, help="stop starting runs after this many seconds")
    p.add_argument("--report", action="store_true", help="print the table (and --png) from runs.csv instead")
    p.add_argument("--png", type=Path)
    args = p.parse_args(argv)
    args.seeds, args.T, args.k = (numbers(p, getattr(args, f), int, f"--{f}") for f in ("seeds", "T", "k"))
    args.policies = [(v.split(":")[0], float(v.split(":")[1])) for v in args.policies.split(",") if v]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report:
        report(args.out, args.png)
        return 0
    sweep(args.out, plan(args.seeds, args.T, args.k, args.kinds.split(","), args.policies), args.budget_s)
    return 0


if __name__ == "__main__":
    run_main(main)
