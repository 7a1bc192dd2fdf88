"""peerctl: talk to the local peerd daemon."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from peerd.security.auth import create_secret_file
from peerd.cli.table import render
from peerd.control.client import ControlClient
from peerd.core.availability import parse_duration
from peerd.errors import ConfigError, PeerdError
from peerd.settings.jobspec import load_job
from peerd.control.jsonform import message_json

DEFAULT_SOCKET = "/run/peerd/control.sock"


def _metric(p) -> str:
    """The job's metric, by name: "accuracy 0.9712", "val_loss 1.384"; at the end
    the consensus model's beside it: "accuracy 0.9712, consensus of 3 0.9740"."""
    if p.metric != p.metric:  # NaN: not evaluated yet
        return "-"
    text = f"{p.metric_name or 'metric'} {p.metric:.4f}"
    consensus = p.metrics.get(f"consensus_{p.metric_name}")
    if consensus is not None:
        text += f", consensus of {int(p.metrics.get('consensus_peers', 1))} {consensus:.4f}"
    return text


def _progress_rows(job) -> list[list[object]]:
    """One row per worker of the job (a daemon may run several)."""
    workers = job.workers or [None]
    rows = []
    for w in workers:
        p = w.progress if w else job.progress
        state = (w.state if w else job.state) + (", collapsed" if p.collapsed else "")  # the note says why
        head = [job.name, w.member if w else "-", w.device if w else "-", state]
        rows.append(head + [p.phase or "-", p.step, p.round, p.epoch, p.loss, p.lr, p.global_batch,
                            p.local_batch or "-", _percent(p.share), p.samples_per_s, _busy(p),
                            f"{p.partners_reached}/{p.partners_planned}", _metric(p),
                            w.restarts if w else job.restarts, w.pid if w else job.worker_pid])
    return rows


def cmd_status(client: ControlClient, args) -> tuple[object, str]:
    s = client.status()
    head = (f"peer {s.peer_id}  version {s.version}  up {s.uptime_s:.0f}s  "
            f"address {s.peer_address}  locality {s.locality or '-'}  peers known {s.peers_known}")
    if s.not_training:
        head += f"\nnot training: {s.not_training}"
    table = render(["job", "worker", "device", "state", "phase", "step", "round", "epoch", "loss", "lr",
                    "global batch", "batch", "share", "samples/s", "busy", "partners", "metric", "restarts", "pid"],
                   [row for j in s.jobs for row in _progress_rows(j)])
    # A message is the worker's last error line, then the last lines of its traceback.
    notes = [f"{j.name}/{w.member}: {w.state}: " + "\n    ".join(w.message.splitlines())
             for j in s.jobs for w in j.workers if w.message]
    notes += [f"{j.name}/{w.member}: intra-host group: {w.progress.intrahost}" for j in s.jobs for w in j.workers
              if w.progress.intrahost]
    notes += [f"{j.name}/{w.member}: {w.progress.collapse_reason}" for j in s.jobs for w in j.workers
              if w.progress.collapsed]
    notes += [f"{j.name}/{w.member}: {_lr_law(w.progress)}" for j in s.jobs for w in j.workers
              if w.progress.lr_law]
    notes += [f"{j.name}/{w.member}: {w.progress.outer}" for j in s.jobs for w in j.workers if w.progress.outer]
    # Whose model model.pt is: "consensus of 3", "own", "the job's, from peer-0", "none: ...".
    notes += [f"{j.name}/{w.member}: model: {w.progress.model_source}" for j in s.jobs for w in j.workers
              if w.progress.model_source]
    notes = "".join("\n" + n for n in notes)
    return s, head + ("\n\n" + table + ("\n" + notes if notes else "") if s.jobs
                      else "\n\nno jobs (peerctl join JOB.toml)")


def cmd_peers(client: ControlClient, args) -> tuple[object, str]:
    reply = client.peers()
    if not reply.peers:
        return reply, "no other peers seen yet"
    rows = []
    for p in reply.peers:
        head = [p.peer_id, p.state, p.address, p.locality or "-", p.last_seen_s]
        for j in p.job_states or [None]:  # one row per worker and job: a daemon may run several
            job = [j.name, j.member or p.peer_id, j.device or "-", j.state + (", collapsed" if j.collapsed else ""),
                   j.phase or "-", j.round, j.lr, j.global_batch or "-", j.samples_per_s, j.local_batch or "-",
                   _percent(j.share)] if j else ["-"] * 11
            rows.append(head + job)
    table = render(["peer", "state", "address", "locality", "seen (s)", "job", "worker", "device",
                    "job state", "phase", "round", "lr", "global batch", "samples/s", "batch", "share"], rows)
    notes = "".join(f"\n{p.peer_id}: not training: {p.not_training}" for p in reply.peers if p.not_training)
    return reply, table + ("\n" + notes if notes else "")


def _lr_law(p) -> str:
    """The LR law in force and its factor now: "LR: sqrt law against the reference
    batch 96, cap 2: factor 1.155 at global batch 128"."""
    text = f"LR: {p.lr_law}"
    if p.lr_scale == p.lr_scale:  # NaN before the first step
        text += f": factor {p.lr_scale:.3f} at global batch {p.global_batch}"
    return text


def _busy(p) -> str:
    """The share of the wall time the worker computed since it started training,
    and the largest cause of the rest: "62% (round 30%)"; '-' before its first report."""
    if p.training_s <= 0:
        return "-"
    text = f"{100 * min(1.0, p.compute_s / p.training_s):.0f}%"
    if p.waited_s:
        cause, seconds = max(p.waited_s.items(), key=lambda kv: kv[1])
        if seconds > 0:
            text += f" ({cause} {100 * seconds / p.training_s:.0f}%)"
    return text


def _percent(share: float) -> str:
    """A DBS share as a percentage; '-' with fixed batches (NaN) or before the first step."""
    return "-" if not share or share != share else f"{100 * share:.1f}%"


def cmd_jobs(client: ControlClient, args) -> tuple[object, str]:
    reply = client.jobs()
    if not reply.jobs:
        return reply, "no jobs running on the LAN"
    return reply, render(["job", "fingerprint", "peers", "here"],
                         [[j.name, j.spec_fingerprint[:12], len(j.peer_ids), "yes" if j.local else "no"]
                          for j in reply.jobs])


def cmd_join(client: ControlClient, args) -> tuple[object, str]:
    path = Path(args.job)
    if path.suffix == ".toml" or path.exists():
        spec, text = load_job(path)  # validate here, so errors name the user's file
        reply = client.join(text, str(path.resolve().parent))
    else:
        spec_dir = str(Path(args.dir).resolve())
        code = client.fetch_code(args.job, spec_dir)
        accept = ""
        if code.source in ("stored", "fetched"):
            print(_code_notice(code), file=sys.stderr)
            if not (args.yes or _confirm("Run this code here? [y/N] ")):
                raise PeerdError(f"not joined: the code of {args.job} was not confirmed (nothing runs; "
                                 "--yes confirms at once)")
            accept = code.code
        reply = client.join_by_name(args.job, spec_dir, accept_code=accept)
    return reply, f"joined {reply.name} (fingerprint {reply.spec_fingerprint[:12]}); watch it with `peerctl status`"


def _code_notice(code) -> str:
    """Where the job's code came from, before it runs: the peer, the hash, the files."""
    how = "fetched just now" if code.source == "fetched" else "fetched before, kept"
    files = ", ".join(code.files[:8]) + (f" and {len(code.files) - 8} more" if len(code.files) > 8 else "")
    return (f"job {code.name} runs code that is not in your directory; it came from its peer "
            f"{code.from_peer or '?'} ({code.from_address or 'address unknown'}), {how}, verified:\n"
            f"  bundle sha256 {code.code}\n  {len(code.files)} files, {code.size} bytes: {files}\n"
            f"  stored in {code.path}")


def _confirm(question: str) -> bool:
    """The operator's yes; no answer (no terminal, end of input) is a no."""
    print(question, end="", file=sys.stderr, flush=True)
    try:
        answer = sys.stdin.readline()
    except (OSError, KeyboardInterrupt):
        return False
    return answer.strip().lower() in ("y", "yes")


def cmd_leave(client: ControlClient, args) -> tuple[object, str]:
    client.leave(args.job, drain=args.drain)
    how = "after its current round" if args.drain else "at once"
    return {"left": args.job, "drain": args.drain}, f"left {args.job} {how}"


def cmd_pause(client: ControlClient, args) -> tuple[object, str]:
    try:
        for_s = parse_duration(args.for_) if args.for_ else 0.0
    except ValueError as exc:
        raise ConfigError(f"--for: {exc}") from None
    reply = client.pause(for_s)
    return reply, (f"not training: {reply.not_training}; the jobs here left and come back "
                   + ("when the pause ends" if for_s else "on `peerctl resume`"))


def cmd_resume(client: ControlClient, args) -> tuple[object, str]:
    reply = client.resume()
    if reply.not_training:
        return reply, f"the pause is over, but not training: {reply.not_training}"
    return reply, "training again: the jobs here are joined again"


def cmd_secret(args) -> tuple[object, str]:
    """A new job secret file; no daemon needed."""
    create_secret_file(args.file, overwrite=args.force)
    return ({"secret_file": str(args.file), "mode": "0600"},
            f"wrote a new job secret to {args.file} (mode 0600). Copy it to every peer of the job over a "
            "private channel (e.g. scp), and name it in the job's [job] secret_file or in peerd.toml's "
            "[auth] job_secret_file; never put the secret itself in a job file.")


def cmd_export(client: ControlClient, args) -> tuple[object, str]:
    path = os.path.abspath(args.path)
    reply = client.export(args.job, path)
    return ({"job": args.job, "path": reply.path, "round": reply.round, "step": reply.step},
            f"wrote the model of {args.job} at round {reply.round} (step {reply.step}) to {reply.path}; "
            f"load it with model.load_state_dict(torch.load({reply.path!r}))")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="peerctl", description="Control the local peerd daemon: inspect peers and jobs, join and leave jobs.")
    parser.add_argument("--socket", default=os.environ.get("PEERD_SOCKET", DEFAULT_SOCKET),
                        help=f"daemon control socket (default: $PEERD_SOCKET or {DEFAULT_SOCKET})")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # --json is also accepted after the command; SUPPRESS keeps the top-level value otherwise.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON instead of a table")
    sub.add_parser("status", parents=[common], help="this daemon and the jobs it runs, with progress").set_defaults(run=cmd_status)
    sub.add_parser("peers", parents=[common], help="other daemons this one sees").set_defaults(run=cmd_peers)
    sub.add_parser("jobs", parents=[common], help="jobs running on the LAN").set_defaults(run=cmd_jobs)
    join = sub.add_parser("join", parents=[common], help="join (or start) a job: from a job file, or by the name of a job running on the LAN")
    join.add_argument("job", metavar="JOB.toml|NAME",
                      help="a job file, or the name of a running job (see `peerctl jobs`) whose spec is taken from its peers")
    join.add_argument("--dir", default=".", metavar="DIR",
                      help="joining by name: where this machine keeps the job's code and files; the job's relative "
                           "paths (script, modules, secret, data root) are taken from here, as from a job file's "
                           "directory (default: the current directory)")
    join.add_argument("--yes", action="store_true",
                      help="joining by name: run the job's code fetched from its peers without asking (its "
                           "source and hash are shown all the same)")
    join.set_defaults(run=cmd_join)
    leave = sub.add_parser("leave", parents=[common], help="leave a job")
    leave.add_argument("job", metavar="JOB", help="job name")
    leave.add_argument("--drain", action="store_true", help="finish the current round first")
    leave.set_defaults(run=cmd_leave)
    pause = sub.add_parser("pause", parents=[common],
                           help="the owner needs this machine: its workers leave their jobs (as a drain) and the "
                                "daemon joins them again when the pause ends")
    pause.add_argument("--for", dest="for_", metavar="DURATION",
                       help="end the pause by itself after DURATION (20s, 90m, 1h30m, 2d); default: at resume")
    pause.set_defaults(run=cmd_pause)
    sub.add_parser("resume", parents=[common],
                   help="end a pause: the jobs here are joined again").set_defaults(run=cmd_resume)
    secret = sub.add_parser("secret", parents=[common],
                            help="write a new random job secret to FILE, readable by its owner only (no daemon needed)")
    secret.add_argument("file", metavar="FILE", type=Path, help="where to write it")
    secret.add_argument("--force", action="store_true", help="replace an existing file")
    secret.set_defaults(local=cmd_secret)
    export = sub.add_parser("export", parents=[common],
                            help="write the current model of a running job to a file (a plain state_dict, "
                                 "with PATH.json beside it)")
    export.add_argument("job", metavar="JOB", help="job name")
    export.add_argument("path", metavar="PATH", help="file to write, on this machine (e.g. model.pt)")
    export.set_defaults(run=cmd_export)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if hasattr(args, "local"):
            reply, text = args.local(args)
        else:
            with ControlClient(Path(args.socket)) as client:
                reply, text = args.run(client, args)
    except PeerdError as exc:
        print(f"peerctl: {exc}", file=sys.stderr)
        return 1
    if args.json:
        data = reply if isinstance(reply, dict) else message_json(reply)
        print(json.dumps(data, indent=2, allow_nan=False))  # strict JSON: docs/operations.md, "JSON output"
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
