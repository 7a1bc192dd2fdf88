"""`python -m peerd.sim`: simulate peerd's averaging at scale on a virtual clock."""

from __future__ import annotations

import argparse
import math
import resource
import sys
import time
from pathlib import Path

from peerd.core.lr import DEFAULT_LAW, DEFAULT_MAX_SCALE, DEFAULT_RAMP_STEPS, LAWS
from peerd.sim.algorithms import ALGORITHMS
from peerd.sim.config import SimConfig
from peerd.sim.network import NetworkSpec, Tier
from peerd.sim.output import plot_runs, plot_sweep, sweep_table, write_csv, write_run
from peerd.sim.runner import simulate
from peerd.sim.schedule import parse_schedule
from peerd.sim.task import MODELS

EXAMPLES = """\
algorithms (one round each, after every peer's SGD step):
  allreduce              exact average of all peers (timed as a ring all-reduce)
  sgp                    push-sum to peer k + 2^(round mod log2 n), one peer a round
  gossip                 whole-model pairwise averaging over a random matching
  crossover              per segment, average with a partner from a derangement (peerd's flat round)
  crossover-whole        the same with one segment (no segmentation)
  crossover-unbalanced   segmented, every peer picks each partner independently (no fairness)
  random-pull            one segment and independent partners (neither)
  hierarchical           in-group average, crossover across groups, all-gather (peerd's groups core)

examples:
  python -m peerd.sim --peers 16 --algorithm crossover --epochs 5
  python -m peerd.sim --peers 8,16,32,64 --algorithm allreduce,sgp,crossover,hierarchical \\
      --groups 8 --global-batch 1024 --model mlp --out sim-out/paper
  python -m peerd.sim --peers 1024 --algorithm crossover --rounds 300 --global-batch 4096
  python -m peerd.sim --peers 64 --event fail:5@2.0 --event join:4@3.0 --event speed:7@1=0.25
  python -m peerd.sim --peers 4 --local-batch 32 --model mlp --hidden 64 --lr 0.2 --rounds 300 \\
      --event join:28@1.0 --scaling linear --max-scale inf --ramp-steps 32   # 4 -> 32 peers, LR x8
  python -m peerd.sim --peers 64 --local-batch 8 --rounds 512 --outer-every 8 --outer-lr 1 --outer-momentum 0.5
  python -m peerd.sim --peers 64 --algorithm hierarchical --group-size 4 --gpus-per-host 4 --local-batch 8 \
      --rounds 512 --outer-every 32 --group-every 1   # groups = hosts, averaged every step between rounds

Each run writes RUN/rounds.csv (one row per round), RUN/peers.csv (one row per
peer), RUN/summary.json and RUN/run.png under --out; a sweep adds sweep.csv,
sweep.png (accuracy against peers) and consensus-N.png per peer count.
"""


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _seeds(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v] or [0]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _algorithms(text: str) -> list[str]:
    names = [v for v in text.split(",") if v]
    bad = [n for n in names if n not in ALGORITHMS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown algorithm(s) {bad or text!r}; choose from {', '.join(ALGORITHMS)}")
    return names


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m peerd.sim",
        description="Discrete-event simulation of peerd's averaging algorithms with its own pure cores "
        "(topology, groups, segments, partition, lr, membership, deadline). Every simulated peer "
        "holds real parameters and takes real SGD steps on its share of the embedded MNIST digits; "
        "compute and transfer times come from a speed model and a network model.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _run_arguments(p.add_argument_group("what to run"))
    _training_arguments(p.add_argument_group("training"))
    _averaging_arguments(p.add_argument_group("averaging"))
    _machine_arguments(p.add_argument_group("machines and network"))
    _output_arguments(p.add_argument_group("output"))
    return p


def _run_arguments(run) -> None:
    run.add_argument("--peers", type=_ints, default=[16], help="peers at the start; a comma list runs a sweep (default 16)")
    run.add_argument("--algorithm", type=_algorithms, default=["crossover"],
                     help="comma list of: " + ", ".join(ALGORITHMS) + " (default crossover)")
    run.add_argument("--seeds", type=_seeds, default=[0],
                     help="comma list of seeds; each (algorithm, peers) runs once per seed (default 0)")
    run.add_argument("--rounds", type=int, default=0,
                     help="local steps to run (a round each with --period 1); 0 = as many as --epochs take (default 0)")
    run.add_argument("--epochs", type=float, default=10.0, help="passes over the 4,000 training digits when --rounds is 0 (default 10)")
    run.add_argument("--gossip-only", action="store_true", help="no SGD steps, only averaging (checks mass conservation)")


def _training_arguments(train) -> None:
    train.add_argument("--model", choices=MODELS, default="logreg", help="logreg (7,850 params) or mlp (default logreg)")
    train.add_argument("--hidden", type=int, default=32, help="hidden units of the mlp (default 32)")
    train.add_argument("--global-batch", type=int, default=512, help="samples per round over all peers, split equally (default 512)")
    train.add_argument("--local-batch", type=int, default=0,
                       help="samples per peer per round instead (peerd's way): the global batch follows the peers "
                       "and the LR follows it by --scaling, ramped over T·max(r, 1/r) steps for a multiplier ratio r (default 0 = off)")
    train.add_argument("--lr", type=float, default=0.1, help="learning rate at the starting global batch; cosine to 0 over the run (default 0.1)")
    train.add_argument("--momentum", type=float, default=0.9, help="SGD momentum, kept per peer (default 0.9)")
    train.add_argument("--weight-decay", type=float, default=1e-4, help="L2 penalty (default 1e-4)")
    train.add_argument("--warmup-rounds", type=int, default=0, help="linear LR warm-up rounds (default 0)")
    train.add_argument("--ramp-steps", type=int, default=DEFAULT_RAMP_STEPS,
                       help=f"T of the LR ramp on a global batch change (default {DEFAULT_RAMP_STEPS})")
    train.add_argument("--scaling", choices=LAWS, default=DEFAULT_LAW,
                       help=f"LR multiplier for a global batch k× the starting one: k, √k or 1 (default {DEFAULT_LAW})")
    train.add_argument("--max-scale", type=float, default=DEFAULT_MAX_SCALE,
                       help=f"cap on the LR multiplier, 1/cap its floor; inf = no cap (default {DEFAULT_MAX_SCALE:g})")


def _averaging_arguments(gossip) -> None:
    gossip.add_argument("--segments", type=int, default=8, help="segments of the model for crossover/hierarchical (default 8)")
    gossip.add_argument("--group-size", type=int, default=8, help="most members of a hierarchical group (default 8)")
    gossip.add_argument("--groups", type=int, default=0,
                        help="number of hierarchical groups instead: group size = ceil(peers / groups), as the paper's --groupnum (default off)")
    gossip.add_argument("--period", type=int, default=1,
                        help="local steps between rounds, no outer step (peerd's [gossip] period_steps; default 1)")
    gossip.add_argument("--outer-every", type=int, default=0, metavar="H",
                        help="a round every H local steps, then the outer step (peerd's [outer] every; default 0 = off)")
    gossip.add_argument("--outer-lr", type=float, default=0.7, help="the outer step's lr (default 0.7)")
    gossip.add_argument("--outer-momentum", type=float, default=0.5,
                        help="the outer step's momentum (default 0.5, as [outer] momentum)")
    gossip.add_argument("--outer-nesterov", action=argparse.BooleanOptionalAction, default=True,
                        help="Nesterov momentum for the outer step (default on)")
    gossip.add_argument("--group-every", type=int, default=0, metavar="K",
                        help="hierarchical only: between rounds, every K local steps each group takes its exact "
                        "mean, as an all-reduce on a host would (the inner tier; default 0 = off)")
    gossip.add_argument("--dbs-steps", action="store_true",
                        help="slow peers take fewer of a round's steps, as peerd's DBS plans them at equal batches")
    gossip.add_argument("--weigh-changes", action="store_true",
                        help="allreduce only: average weighted by the samples each peer trained since the last round")
    gossip.add_argument("--detect-s", type=float, default=5.0, help="a crashed peer stays in the view this long (default 5)")
    gossip.add_argument("--deadline-floor", type=float, default=0.05, help="least exchange deadline in s (default 0.05)")
    gossip.add_argument("--deadline-ceiling", type=float, default=10.0, help="most exchange deadline in s (default 10)")


def _machine_arguments(sys_) -> None:
    sys_.add_argument("--gpus-per-host", type=int, default=8, help="peers per host (default 8)")
    sys_.add_argument("--hosts-per-rack", type=int, default=4, help="hosts per rack (default 4)")
    tiers = (("host", "a same-host", 25e9, 5e-6), ("rack", "a same-rack", 1.25e9, 50e-6),
             ("cross", "an across-racks", 0.3125e9, 200e-6))
    for tier, what, bw, lat in tiers:
        sys_.add_argument(f"--bw-{tier}", type=float, default=bw, help=f"bandwidth of {what} link in bytes/s (default {bw:g})")
        sys_.add_argument(f"--lat-{tier}", type=float, default=lat, help=f"latency of {what} link in s (default {lat:g})")
    sys_.add_argument("--model-bytes", type=float, default=0,
                      help="time transfers as if the model had this many bytes (e.g. 1e8 for ResNet-50); 0 = real size")
    sys_.add_argument("--sample-time", type=float, default=2e-3, help="seconds per sample at speed 1 (default 0.002)")
    sys_.add_argument("--step-overhead", type=float, default=1e-3, help="fixed seconds per step (default 0.001)")
    sys_.add_argument("--speed-spread", type=float, default=0.0, help="σ of log peer speed; 0 = identical peers (default 0)")
    sys_.add_argument("--jitter-prob", type=float, default=0.0, help="chance a step is slowed (default 0)")
    sys_.add_argument("--jitter-factor", type=float, default=3.0, help="how much a slowed step is slowed (default 3)")
    sys_.add_argument("--event", action="append", default=[], metavar="KIND:WHO@TIME[=VALUE]",
                      help="schedule: fail:3@12.5, leave:3@12.5, join:4@30 (4 peers), speed:3@10=0.25; repeatable")


def _output_arguments(out) -> None:
    out.add_argument("--out", type=Path, default=Path("sim-out"), help="folder for the results (default sim-out)")
    out.add_argument("--eval-every", type=int, default=0, help="rounds between test evaluations of the mean model; 0 = end only")
    out.add_argument("--eval-peers", type=int, default=64, help="peers whose own model is tested at the end (default 64)")
    out.add_argument("--no-plot", action="store_true", help="write no PNG files")
    out.add_argument("--quiet", action="store_true", help="no progress lines")


def config_for(args: argparse.Namespace, algorithm: str, peers: int, seed: int) -> SimConfig:
    network = NetworkSpec(
        Tier(args.bw_host, args.lat_host), Tier(args.bw_rack, args.lat_rack), Tier(args.bw_cross, args.lat_cross),
        args.gpus_per_host, args.hosts_per_rack,
    )
    return SimConfig(
        peers=peers, algorithm=algorithm, rounds=args.rounds, epochs=args.epochs, global_batch=args.global_batch,
        local_batch=args.local_batch,
        lr=args.lr, momentum=args.momentum, warmup_rounds=args.warmup_rounds, ramp_steps=args.ramp_steps,
        scaling=args.scaling, max_scale=args.max_scale,
        segments=args.segments, group_size=math.ceil(peers / args.groups) if args.groups else args.group_size,
        model=args.model, hidden=args.hidden, weight_decay=args.weight_decay, model_bytes=args.model_bytes,
        seed=seed, network=network, sample_time=args.sample_time, step_overhead=args.step_overhead,
        speed_spread=args.speed_spread, jitter_prob=args.jitter_prob, jitter_factor=args.jitter_factor,
        schedule=parse_schedule(args.event), detect_s=args.detect_s, deadline_floor_s=args.deadline_floor,
        deadline_ceiling_s=args.deadline_ceiling, gossip_only=args.gossip_only, eval_every=args.eval_every,
        eval_peers=args.eval_peers, period=args.period, outer_every=args.outer_every, outer_lr=args.outer_lr,
        outer_momentum=args.outer_momentum, outer_nesterov=args.outer_nesterov, dbs_steps=args.dbs_steps,
        group_every=args.group_every,
        weigh_changes=args.weigh_changes,
    )


class Progress:
    """A progress line on stderr at most once a second, and at the end."""

    def __init__(self, label: str, quiet: bool) -> None:
        self.label, self.quiet = label, quiet
        self.start = self.last = time.monotonic()

    def __call__(self, done: int, total: int, sim_s: float) -> None:
        now = time.monotonic()
        if self.quiet or (now - self.last < 1.0 and done < total):
            return
        self.last = now
        rate = done / max(now - self.start, 1e-9)
        print(f"\r{self.label}: round {done}/{total}  simulated {sim_s:.1f} s  {rate:.1f} rounds/s ",
              end="\n" if done == total else "", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        configs = [config_for(args, a, n, s) for n in args.peers for a in args.algorithm for s in args.seeds]
    except ValueError as e:
        parser.error(str(e))
    rows, by_peers = [], {}
    for cfg in configs:
        label = f"{cfg.algorithm}-{cfg.peers}p-s{cfg.seed}"
        try:
            result = simulate(cfg, Progress(label, args.quiet))
        except ValueError as e:
            parser.exit(2, f"{parser.prog}: error: {label}: {e}\n")
        result.summary["seed"] = cfg.seed
        result.summary["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        write_run(result, args.out / label, plot=not args.no_plot)
        rows.append(result.summary)
        by_peers.setdefault(cfg.peers, {})[f"{cfg.algorithm} s{cfg.seed}"] = result
        s = result.summary
        print(f"{label}: accuracy {s['test_accuracy_mean_peer']:.4f} (mean model {s['test_accuracy_of_mean_model']:.4f})  "
              f"consensus {s['final_consensus_distance']:.2e}  {s['bytes_per_peer_per_round'] / 1e3:.1f} kB/peer/round  "
              f"simulated {s['sim_time_s']:.2f} s  idle {100 * s['idle_fraction']:.1f}%  "
              f"{s['rounds_per_s']:.1f} rounds/s  peak RSS {s['peak_rss_mib']:.0f} MiB")
    if len(configs) > 1:
        write_csv(args.out / "sweep.csv", rows)
        if not args.no_plot:
            plot_sweep(rows, args.out / "sweep.png")
            for peers, runs in by_peers.items():
                plot_runs(runs, args.out / f"consensus-{peers}.png")
        print("test accuracy of the peers' own models (%), mean ± std over seeds:")
        print(sweep_table(rows))
        print("consensus distance, mean over the rounds:")
        print(sweep_table(rows, "mean_consensus_distance", scale=1.0, digits=4))
        print("train loss, mean over the last 5 rounds:")
        print(sweep_table(rows, "final_train_loss", scale=1.0, digits=3))
        print(f"sweep: {args.out / 'sweep.csv'}")
    return 0
