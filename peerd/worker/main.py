"""Worker process: `python -m peerd.worker ...`, started by the daemon.

A job module's job runs peerd's own loop: the Trainer's local steps, then
`peer.step()` — the same Peer a user's script gets from `peerd.attach`, so both
kinds of job gossip, scale the LR, split the data, hand over their state and
checkpoint through one path. A script job runs the user's script in this
process, with `peerd.attach` pointed at the daemon.
"""

from __future__ import annotations

import argparse
import logging
import os
import runpy
import sys
import traceback
from dataclasses import replace
from pathlib import Path

import torch

from peerd.security.auth import Authenticator, load_secret
from peerd.core.codes import ExitCode
from peerd.core.lifecycle import Outcome
from peerd.core.slowdown import CLOCKS
from peerd.errors import ConfigError, PeerdError
from peerd.settings.jobspec import parse_job
from peerd.logs import setup_logging
from peerd.peer import Launch, Peer, last_attached, set_launch
from peerd.security.handover import Security
from peerd.security.tls import TlsSettings, load_tls
from peerd.worker.intrahost import group as intrahost
from peerd.worker.train.device import resolve_device
from peerd.worker.train.trainer import Trainer

log = logging.getLogger("peerd.worker")

# How the worker ended -> its exit code, which the daemon acts on (peerd.core.restarts).
EXITS = {Outcome.FINISHED: ExitCode.FINISHED, Outcome.LEFT: ExitCode.LEFT, Outcome.STOPPED: ExitCode.STOPPED}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m peerd.worker", description="peerd training worker (started by the daemon)")
    parser.add_argument("--control", required=True, help="daemon control address, e.g. unix:/run/peerd/control.sock")
    parser.add_argument("--spec", required=True, type=Path, help="the job file")
    parser.add_argument("--spec-dir", default="", help="directory to import the job's model/data code from")
    parser.add_argument("--peer-id", required=True)
    parser.add_argument("--host", default="127.0.0.1", help="address to serve the exchange on")
    parser.add_argument("--out-dir", type=Path, default=Path("."), help="where the trained model is written")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--device", default="cpu", help='torch device to train on: "auto", "cpu", "cuda", "cuda:N", "mps"')
    parser.add_argument("--secret-file", type=Path, default=None,
                        help="the job secret: every exchange request and reply carries proof of it")
    parser.add_argument("--data-root", default="",
                        help='data_mode = "local": the directory holding this peer\'s data (the job reads ctx.data_root)')
    parser.add_argument("--tensorboard", default="",
                        help="this worker's TensorBoard run directory ([log] tensorboard): each round's scalars "
                             "go there (needs the tensorboard package)")
    parser.add_argument("--tls-cert", type=Path, help="this peer's certificate (PEM), for mutual TLS")
    parser.add_argument("--tls-key", type=Path, help="its private key (PEM)")
    parser.add_argument("--tls-ca", type=Path, help="the CA that signed every peer's certificate (PEM)")
    parser.add_argument("--tls-server-name", default="", help="name to check peer certificates against")
    parser.add_argument("--slowdown", type=float, default=1.0,
                        help="testing knob: after each step sleep (SLOWDOWN − 1) × its time (default 1: none)")
    parser.add_argument("--slowdown-clock", default="wall", choices=CLOCKS,
                        help="the step's time for --slowdown: its wall time, or its CPU time (default wall)")
    parser.add_argument("--step-overhead-s", type=float, default=0.0,
                        help="testing knob: after each step also sleep this many seconds, whatever its batch "
                             "(a fixed per-step cost; default 0)")
    parser.add_argument("--log-format", default="text", choices=["text", "json"], help="log record format")
    intrahost.add_arguments(parser)
    return parser.parse_args(argv)


def load_security(args: argparse.Namespace) -> Security:
    auth = Authenticator(load_secret(args.secret_file)) if args.secret_file else None
    tls_files = (args.tls_cert, args.tls_key, args.tls_ca)
    if any(tls_files) and not all(tls_files):
        raise ConfigError("--tls-cert, --tls-key and --tls-ca go together")
    tls = load_tls(TlsSettings(*tls_files, args.tls_server_name)) if all(tls_files) else None
    return Security(auth, tls)


def run_declarative(launch: Launch) -> int:
    """peerd's own loop over a job module, as a client of the Peer API."""
    trainer = Trainer(launch.spec, launch.peer_id, launch.spec_dir, launch.slowdown, launch.device,
                      launch.data_root, launch.slowdown_clock, launch.step_overhead_s)
    peer = None
    try:
        peer = Peer(launch, trainer, evaluate=trainer.evaluate)
        while not peer.should_stop:
            plan = peer.plan
            trainer.set_data_sizes(plan.data_sizes, plan.terms)
            trainer.step(plan.members, plan.trainers, plan.plan)
            peer.step()
        outcome = peer.close(finished=trainer.done)
    except KeyboardInterrupt:
        log.info("stopped by signal%s", f" at round {peer.round}" if peer is not None else "")
        outcome = Outcome.STOPPED
    finally:
        if peer is not None and not peer.closed:
            peer.close(finished=False)
        trainer.close()
    return EXITS[outcome]


def run_script(launch: Launch) -> int:
    """The user's script, in this process, with peerd.attach pointed at the daemon.

    It runs in the worker's own directory (--out-dir: the job's per-worker
    directory, beside model.pt and worker.log), so that what it writes to a
    relative path stays apart from the other workers'; its own path, the job's
    directory and the daemon's paths were made absolute first."""
    path = launch.spec.script_path(launch.spec_dir).resolve()
    if not path.is_file():
        raise ConfigError(f"job.script = {launch.spec.script!r}: no such file {path}")
    launch = replace(launch, spec_dir=str(Path(launch.spec_dir).resolve()) if launch.spec_dir else "",
                     out_dir=launch.out_dir.resolve(),
                     data_root=str(Path(launch.data_root).resolve()) if launch.data_root else "")
    launch.out_dir.mkdir(parents=True, exist_ok=True)
    # An import path relative to the directory the worker started in stays so.
    started_in = os.getcwd()
    sys.path[:] = [str(Path(started_in, p)) if not os.path.isabs(p) else p for p in sys.path]
    os.chdir(launch.out_dir)
    set_launch(launch)
    sys.argv = [str(path), *launch.spec.args]
    sys.path.insert(0, str(path.parent))
    log.info("running %s %s in %s", path, " ".join(launch.spec.args), launch.out_dir)
    try:
        runpy.run_path(str(path), run_name="__main__")
    except KeyboardInterrupt:
        outcome = _close_attached(finished=False)
        return EXITS[outcome or Outcome.STOPPED]
    except (ConfigError, PeerdError):
        _close_attached(finished=False)
        raise
    except SystemExit as exc:
        if exc.code not in (0, None):
            _close_attached(finished=False)
            raise
    except BaseException as exc:
        log.warning("the script's traceback:\n%s", traceback.format_exc().rstrip())
        if last_attached() is None:  # its own code or setup is broken: a restart fails the same way
            raise ConfigError(f"the script {path.name} failed before peerd.attach(): "
                              f"{type(exc).__name__}: {exc}") from None
        log.error("the script %s failed: %s: %s", path.name, type(exc).__name__, exc)
        _close_attached(finished=False)
        return ExitCode.ERROR
    peer = last_attached()
    if peer is None:
        raise ConfigError(f"the script {path.name} ended without calling peerd.attach(): "
                          "a script job must attach its model and optimizer")
    if peer.local_steps == 0:
        log.warning("the script %s never called peer.step(): nothing was averaged", path.name)
    return EXITS[_close_attached(finished=True)]


def _close_attached(finished: bool) -> str:
    peer = last_attached()
    if peer is None:
        return ""
    return peer.outcome if peer.closed else peer.close(finished=finished)


def run(args: argparse.Namespace) -> int:
    spec = parse_job(args.spec.read_text(), str(args.spec))
    setup_logging("INFO", args.log_format, job=spec.name, peer=args.peer_id)
    log.info("loading job %s on %s", spec.name, args.device)
    if spec.data_mode == "local" and not args.secret_file:
        raise ConfigError(f"job {spec.name!r} keeps its data on each peer (data_mode = 'local'): "
                          "its workers run only with a job secret (--secret-file)")
    torch.set_num_threads(args.threads)
    group = intrahost.from_args(args, resolve_device(args.device), args.peer_id)
    launch = Launch(spec, args.spec_dir, args.control, args.peer_id, args.host, args.out_dir, args.device,
                    load_security(args), args.slowdown, group, data_root=args.data_root,
                    slowdown_clock=args.slowdown_clock, step_overhead_s=args.step_overhead_s,
                    tensorboard=args.tensorboard)
    return run_script(launch) if spec.script else run_declarative(launch)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging("INFO", args.log_format, peer=args.peer_id)
    if sys.byteorder != "little":
        print("peerd: big-endian hosts are not supported (segments travel as little-endian fp32)", file=sys.stderr)
        return ExitCode.CONFIG
    try:
        return run(args)
    except ConfigError as exc:
        log.error("%s", exc)
        return ExitCode.CONFIG
    except PeerdError as exc:
        log.error("%s", exc)
        return ExitCode.ERROR
