"""`peerd soak` / `python -m peerd.soak`: the command line of the soak harness."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from peerd.core.codes import ExitCode
from peerd.errors import ConfigError
from peerd.cli.interrupts import sigterm_interrupts
from peerd.soak.schedule import KINDS, SEEDED_KINDS, kinds_from

DESCRIPTION = """\
Soak a heterogeneous peerd cluster: N real peerd daemons (each with its worker),
each in its own network namespace on one bridge with a bandwidth cap (tc tbf) and,
if this build supports it, a compute slowdown; discovery by zeroconf across the
namespaces. A churn schedule kills workers and daemons, partitions and heals
links, drains peers out, adds new peers, changes slowdowns, pauses peers for their
owner and (when asked for) freezes daemons or workers, while every peer is
sampled. At the end: pass/fail checks with evidence, and a report directory
(report.md, PNG plots, samples.csv, events.csv). Needs root for namespaces;
without it every peer runs on 127.0.0.1 (no caps, no partitions) and it says so.
Everything it starts or creates is removed at the end, also on Ctrl-C/SIGTERM.
Exit status: 0 every check passed (or was skipped), 1 a check failed or the run
stopped early, 2 bad arguments."""


def _floats(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected numbers separated by commas") from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: expected non-negative numbers separated by commas")
    return values


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--peers", type=int, default=8, help="peers at the start (default 8; joins add more)")
    p.add_argument("--duration", type=float, default=600.0,
                   help="seconds of churn, counted once every peer trains (default 600)")
    p.add_argument("--interval", type=float, default=20.0, help="seconds between seeded events (default 20)")
    p.add_argument("--settle", type=float, default=60.0,
                   help="no seeded event in the last SETTLE seconds, so peers can recover before the checks (default 60)")
    p.add_argument("--down", type=float, default=10.0,
                   help="seconds a killed daemon stays down, a partitioned link stays cut and a frozen "
                        "process stays stopped (default 10)")
    p.add_argument("--seed", type=int, default=0, help="seed of the generated schedule (default 0)")
    p.add_argument("--schedule", type=Path, default=None,
                   help="churn schedule file instead of a seeded one: TOML with [[event]] tables or JSON "
                        '{"events": [...]}; each event has at (s), kind (' + ", ".join(KINDS) +
                        "), peer (index; omit for a join of a new peer), down_s, factor (slowdown), "
                        "process (freeze: daemon or worker)")
    p.add_argument("--kinds", default=",".join(SEEDED_KINDS), metavar="KIND,...",
                   help="event kinds a seeded schedule draws from (default: " + ",".join(SEEDED_KINDS) +
                        "; freeze, SIGSTOP of a peer's daemon or worker for --down seconds, only when named)")
    p.add_argument("--job", type=Path, default=None, help="job file (default: the built-in MNIST example)")
    p.add_argument("--epochs", type=float, default=1000.0,
                   help="the job's epochs are set to this, so it trains through the whole soak (default 1000)")
    p.add_argument("--bandwidth", type=_floats, default=(100.0, 50.0, 20.0), metavar="MBIT,...",
                   help="egress caps in Mbit/s, given to peers by index in turn; 0: no cap (default 100,50,20)")
    p.add_argument("--slowdowns", type=_floats, default=(1.0, 1.0, 1.5, 2.0), metavar="F,...",
                   help="compute slowdown factors given to peers by index in turn, when the daemon config "
                        "supports `slowdown` (default 1,1,1.5,2)")
    p.add_argument("--poll", type=float, default=1.0, help="seconds between samples of every peer (default 1)")
    p.add_argument("--converge-bound", type=float, default=60.0,
                   help="check: membership views agree within this many seconds after each event (default 60)")
    p.add_argument("--stall-bound", type=float, default=60.0,
                   help="check: no connected, training peer stays in one round longer than this (default 60)")
    p.add_argument("--target", "--target-accuracy", dest="target", type=float, default=None, metavar="VALUE",
                   help="check: the mean of the job's metric (its `metric`: accuracy, val_loss, ...) at the last "
                        "evaluation of the peers in the job at the end reaches VALUE, in the job's direction: "
                        '>= VALUE for metric_mode = "max", <= for "min" (default 0.9 for accuracy; none for '
                        "another metric: the check then only reports the values); --target-accuracy is its old name")
    p.add_argument("--loopback", action="store_true",
                   help="run every peer on 127.0.0.1 even where namespaces work (no caps, no partitions)")
    p.add_argument("--full-mesh-max", type=int, default=0, metavar="N",
                   help="[discovery] full_mesh_max of every daemon: a realm larger than N relays "
                        "(default: the daemon's, 8)")
    p.add_argument("--fanout", type=int, default=0, metavar="K",
                   help="[discovery] fanout of every daemon: peers each Hellos a round when relaying (default: the daemon's, 3)")
    p.add_argument("--out", type=Path, default=None, help="report directory (default runs/soak-TIMESTAMP)")


def settings_from(args: argparse.Namespace):
    from peerd.soak.runner import SoakSettings

    if args.peers < 2:
        raise ConfigError("--peers must be at least 2")
    for name in ("duration", "interval", "poll", "converge_bound", "stall_bound"):
        if getattr(args, name) <= 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be > 0")
    if args.settle < 0 or args.down < 0:
        raise ConfigError("--settle and --down must be ≥ 0")
    if not args.schedule and args.down >= args.interval:
        raise ConfigError("--down must be shorter than --interval")
    if any(f < 1 for f in args.slowdowns):
        raise ConfigError("--slowdowns factors must be ≥ 1")
    if args.full_mesh_max < 0 or args.fanout < 0:
        raise ConfigError("--full-mesh-max and --fanout must be ≥ 0 (0: the daemon's default)")
    kinds = kinds_from(args.kinds)
    return SoakSettings(
        peers=args.peers, duration_s=args.duration, interval_s=args.interval, settle_s=args.settle,
        down_s=args.down, seed=args.seed, schedule=args.schedule, job=args.job, epochs=args.epochs,
        bandwidth_mbit=args.bandwidth, slowdowns=args.slowdowns, poll_s=args.poll,
        converge_s=args.converge_bound, stall_s=args.stall_bound, target=args.target,
        loopback=args.loopback, out=args.out or Path("runs") / time.strftime("soak-%Y%m%d-%H%M%S"),
        full_mesh_max=args.full_mesh_max, fanout=args.fanout, kinds=kinds,
    )


def run(args: argparse.Namespace) -> int:
    from peerd.cli.localcluster import default_job
    from peerd.soak.checks import FAIL, Goal, run_checks
    from peerd.soak.report import summary, write_report
    from peerd.soak.runner import run_soak
    from peerd.soak.schedule import load_schedule

    try:
        settings = settings_from(args)
        if settings.schedule:
            load_schedule(settings.schedule)  # bad files fail here, before anything starts
    except ConfigError as exc:
        print(f"peerd soak: {exc}", file=sys.stderr)
        return ExitCode.CONFIG
    with sigterm_interrupts():
        result = run_soak(settings, settings.job or default_job())
    checks = run_checks(result.samples, result.events, ceiling_s=result.spec.gossip.deadline_ceiling_s,
                        stall_s=settings.stall_s, converge_s=settings.converge_s,
                        goal=Goal(settings.target, result.spec.metric, result.spec.metric_mode),
                        checkpoints=result.checkpoints)
    report = write_report(result, checks, settings.out)
    print(summary(result, checks, report))
    return 1 if result.interrupted or any(c.verdict == FAIL for c in checks) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m peerd.soak", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))
