"""peerd: the daemon, plus tools around it.

    peerd [--config FILE]              run the daemon (what systemd starts)
    peerd check-config [--config FILE] validate the config and exit
    peerd check-config JOB.toml        validate a job file, say the LR law it puts in force
    peerd cluster [--peers N]          run a local cluster of N daemons on 127.0.0.1
    peerd soak [--peers N ...]         soak a cluster in network namespaces with churn; report

Environment: PEERD_CONFIG (the config file when --config is not given), and
PEERD_PEER_ID, PEERD_HOST, PEERD_LOCALITY, PEERD_METRICS_PORT, PEERD_SEEDS
(comma-separated host:port) and PEERD_DATA_ROOT, which override the file.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import signal
import sys
from dataclasses import replace
from pathlib import Path

from peerd.settings.config import DEFAULT_PATH, config_path, load_config, resolve_host
from peerd.core.codes import ExitCode
from peerd.errors import ConfigError, PeerdError
from peerd.logs import setup_logging


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="peerd",
        description="peerd daemon: finds other peers on the LAN and trains the jobs this machine joined "
                    "(peerctl join JOB.toml). With no command, runs the daemon.",
        epilog="Environment: PEERD_CONFIG names the config file when --config is absent; PEERD_PEER_ID, "
               "PEERD_HOST, PEERD_LOCALITY, PEERD_METRICS_PORT, PEERD_SEEDS (comma-separated host:port) and "
               "PEERD_DATA_ROOT override the file's values.",
    )
    parser.add_argument("--config", type=Path, default=None,
                        help=f"daemon config (default: $PEERD_CONFIG, else {DEFAULT_PATH} if present, "
                             "else built-in defaults)")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    parser.add_argument("--log-format", default=None, choices=["text", "json"],
                        help="one-line log records as logfmt-like text or JSON (default: [log] format, text)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    check = sub.add_parser("check-config", help="validate the config file and exit (0: valid, 2: not)")
    # Also accepted after the command; SUPPRESS keeps a top-level --config when absent here.
    check.add_argument("--config", type=Path, default=argparse.SUPPRESS, help="config file to check")
    check.add_argument("job", type=Path, nargs="?", default=None,
                       help="a job file: check it and say the LR law it puts in force (the config too with --config)")
    cluster = sub.add_parser("cluster", help="run a local cluster of daemons on 127.0.0.1 training a job")
    from peerd.cli.cluster import add_arguments

    add_arguments(cluster)
    from peerd.soak.cli import DESCRIPTION
    from peerd.soak.cli import add_arguments as add_soak_arguments

    soak = sub.add_parser("soak", help="soak a cluster of daemons in network namespaces under churn; writes a report",
                          description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_soak_arguments(soak)
    return parser


async def _run_daemon(config) -> None:
    from peerd.daemon.app import serve

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await serve(config, stop)


def _check_files(config) -> None:
    """Read the secret and TLS files the config names, as the daemon will at start."""
    from peerd.security.auth import load_secret
    from peerd.security.tls import load_tls

    for path in (config.realm_secret_file, config.job_secret_file):
        if path is not None:
            load_secret(path)
    if config.tls is not None:
        load_tls(config.tls)


def _host_pick(config, path: Path | None) -> list[str]:
    """Lines saying what host = "auto" picks here now, and why (the daemon
    picks again when it starts); none for a configured address."""
    try:
        resolved, pick = resolve_host(config)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}" if path else str(exc)) from None
    if pick is None:
        return []
    lines = [f"host auto: {pick.describe()}"]
    if resolved.interfaces != config.interfaces:
        lines.append(f"zeroconf speaks on {resolved.host} only (discovery.interfaces follows host)")
    return lines


def _tensorboard_lines(config) -> list[str]:
    """Where [log] tensorboard sends the jobs' curves, or that the package to
    write them is missing here (the workers then train without them)."""
    if config.tensorboard is None:
        return []
    where = f"log.tensorboard = {config.tensorboard}"
    if importlib.util.find_spec("tensorboard") is None:  # found without importing it (or torch)
        return [f"{where}: the tensorboard package is not installed: the workers train without TensorBoard logs "
                "(pip install peerd[tensorboard])"]
    return [f"{where}: each job's curves in {config.tensorboard}/JOB/MEMBER (a job's own [log] tensorboard "
            f"wins); watch them with `tensorboard --logdir {config.tensorboard}`"]


def _availability_lines(config, gpus: int) -> list[str]:
    """What [availability] makes of this machine; a GPU machine without
    nvidia-ml-py is watched by its CPU, which check-config says."""
    a = config.availability
    windows = f" within {', '.join(w.text for w in a.windows)} (local time)" if a.windows else ""
    if a.mode == "always":
        return [f"availability: trains only{windows}"] if windows else []
    only = f" of {', '.join(a.commands)}" if a.commands else ""
    if gpus and importlib.util.find_spec("pynvml") is not None:
        watch = f"no other process{only} on its {gpus} GPU(s)"
    else:
        watch = f"no other process{only} above {a.cpu_share:g} cores"
        if gpus:
            watch += f" (nvidia-ml-py is not installed: its {gpus} GPU(s) are not watched; pip install nvidia-ml-py)"
    return [f"availability: trains{windows} while {watch}, after {a.hold_off_s:g}s free"]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level, args.log_format or "text")
    if args.command == "cluster":
        from peerd.cli.cluster import run_cluster

        return run_cluster(args)
    if args.command == "soak":
        from peerd.soak.cli import run as run_soak

        return run_soak(args)
    try:
        if args.command == "check-config" and args.job is not None:
            from peerd.cli.jobcheck import job_lines

            print("\n".join(job_lines(args.job)))
            if args.config is None:
                return 0
        config = load_config(args.config)
        if args.command == "check-config":
            _check_files(config)
            path = config_path(args.config)
            picked = _host_pick(config, path)  # before "valid": a host = "auto" with no answer is not
            if path is None:
                print(f"no config file ({DEFAULT_PATH} is absent): the built-in defaults apply")
            else:
                print(f"{path}: valid")
            from peerd.daemon.devices import local_gpus

            for line in (*picked, *_tensorboard_lines(config), *_availability_lines(config, local_gpus())):
                print(line)
            return 0
        if args.log_format is None and config.log_format != "text":
            setup_logging(args.log_level, config.log_format)
        if args.log_format is not None:
            config = replace(config, log_format=args.log_format)  # the workers log the same way
        import uvloop

        uvloop.run(_run_daemon(config))
    except ConfigError as exc:
        print(f"peerd: {exc}", file=sys.stderr)
        return ExitCode.CONFIG
    except PeerdError as exc:
        print(f"peerd: {exc}", file=sys.stderr)
        return ExitCode.ERROR
    return ExitCode.FINISHED


if __name__ == "__main__":
    sys.exit(main())
