"""The JSON the daemon's page polls (`GET /api/status`).

It carries the control API's replies as `peerctl --json status`, `peers` and
`jobs` print them, built by the same daemon methods, and beside them what the
page draws: each job's members in one list (this daemon's workers and the
peers' from their last Hello, with why one is not training) and the curves
kept in peerd.daemon.history.
"""

from __future__ import annotations

import math
import re
from typing import Protocol

from peerd.daemon.history import History
from peerd.control.jsonform import message_json
from peerd.proto.v1 import control_pb2

DEFAULT_POINTS = 200  # per member and curve; the page thins them further to its width
MAX_POINTS = 1000
# Points per curve over all of a job's members: 100 members get about 120 each,
# so the JSON stays a few hundred KiB and quick to build on the daemon's loop.
BUDGET = 12000


class PageSource(Protocol):
    """What the page reads of a daemon (peerd.daemon.app.Daemon)."""

    history: History

    def status(self) -> control_pb2.StatusReply: ...

    def list_peers(self) -> control_pb2.ListPeersReply: ...

    def list_jobs(self) -> control_pb2.ListJobsReply: ...


def page_status(daemon: PageSource, now: float, points: int = DEFAULT_POINTS) -> dict:
    status, peers, jobs = daemon.status(), daemon.list_peers(), daemon.list_jobs()
    return {
        "peer_id": status.peer_id,
        "status": message_json(status),
        "peers": message_json(peers),
        "jobs": message_json(jobs),
        "view": job_views(status, peers, daemon.history, now),
        "history": daemon.history.as_json(now, max(2, min(points, MAX_POINTS)), BUDGET),
    }


def why(state: str, phase: str, message: str = "", restarts: int = 0) -> str:
    """Why a member is not training, in words; "" while it trains."""
    first = message.splitlines()[0] if message else ""
    crashed = "restarting after a crash" + (f": {first}" if first else "")
    if state == "restarting" or (state == "starting" and (restarts or message)):
        return crashed
    if state in ("failed", "stopped", "left", "finished", "starting"):
        return {"failed": "failed" + (f": {first}" if first else ""), "stopped": "left the job (stopped here)",
                "left": "left the job: no longer in any Hello", "finished": "finished the job",
                "starting": "starting its worker"}[state]
    if phase.startswith("waiting for peers"):
        return f"{phase}: held at the start gate until [job] min_peers members serve"
    return {"training": "", "": "", "joining": "joining: before its first round",
            "syncing": "catching up: taking the job's state from its peers",
            "draining": "leaving after this round", "consensus": "averaging the final models with the others",
            "finished": "finished the job"}.get(phase, phase)


def _num(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _local_member(peer_id: str, w: control_pb2.LocalWorker) -> dict:
    p = w.progress
    return {
        "member": w.member or peer_id, "daemon": peer_id, "local": True, "device": w.device, "state": w.state,
        "phase": p.phase, "why": why(w.state, p.phase, w.message, w.restarts), "message": w.message,
        "round": p.round, "epochs": _num(p.job_progress), "loss": _num(p.loss), "metric": _num(p.metric),
        "lr": _num(p.lr), "global_batch": p.global_batch, "local_batch": p.local_batch, "share": _num(p.share),
        "samples_per_s": _num(p.samples_per_s), "disagreement": _num(p.disagreement),
        "segment_misses": p.segment_misses, "rejected": sum(p.rejected.values()), "restarts": w.restarts,
        "pid": w.pid, "seen_s": 0.0, "suspected": False,
        "collapsed": p.collapsed, "collapse_reason": p.collapse_reason,
        "lr_law": p.lr_law, "lr_scale": _num(p.lr_scale),
    }


def _remote_member(peer: control_pb2.PeerInfo, j: control_pb2.PeerJob) -> dict:
    return {
        "member": j.member or peer.peer_id, "daemon": peer.peer_id, "local": False, "device": j.device,
        "state": j.state, "phase": j.phase, "why": why(j.state, j.phase), "message": "",
        "round": j.round, "epochs": _num(j.epochs), "loss": _num(j.loss), "metric": _num(j.metric),
        "lr": _num(j.lr), "global_batch": j.global_batch, "local_batch": j.local_batch, "share": _num(j.share),
        "samples_per_s": _num(j.samples_per_s), "disagreement": _num(j.disagreement),
        "segment_misses": j.segment_misses, "rejected": j.rejected, "restarts": None, "pid": None,
        "seen_s": round(peer.last_seen_s, 2), "suspected": peer.state == "suspected",
        "collapsed": j.collapsed, "collapse_reason": "",  # the reason is on its own daemon's page
        "lr_law": "", "lr_scale": None,  # on its own daemon's page: a Hello carries the LR only
    }


def _left_member(member: str, age_s: float, last) -> dict:
    """A member the curves know that no reply lists any more."""
    return {
        "member": member, "daemon": "", "local": False, "device": "", "state": "left", "phase": "",
        "why": why("left", ""), "message": "", "round": int(last.round), "epochs": _num(last.epochs),
        "loss": _num(last.loss), "metric": _num(last.metric), "lr": _num(last.lr), "global_batch": 0,
        "local_batch": int(last.local_batch) if math.isfinite(last.local_batch) else 0, "share": None,
        "samples_per_s": None, "disagreement": None, "segment_misses": 0, "rejected": 0, "restarts": None,
        "pid": None, "seen_s": round(age_s, 1), "suspected": False, "collapsed": False, "collapse_reason": "",
        "lr_law": "", "lr_scale": None,
    }


def natural_key(text: str) -> list:
    """peer-2 before peer-10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def job_views(status: control_pb2.StatusReply, peers: control_pb2.ListPeersReply, history: History,
              now: float) -> list[dict]:
    """Every job this daemon runs or hears of, with its members, sorted by name."""
    members: dict[str, list[dict]] = {}
    for j in status.jobs:
        members.setdefault(j.name, []).extend(_local_member(status.peer_id, w) for w in j.workers)
    for peer in peers.peers:
        for j in peer.job_states:
            members.setdefault(j.name, []).append(_remote_member(peer, j))
    for name in history.jobs():
        known = {m["member"] for m in members.get(name, [])}
        for member, series in history.members(name).items():
            if member not in known and len(series):
                members.setdefault(name, []).append(_left_member(member, now - series.last_t, series.last()))
    local = {j.name: j for j in status.jobs}
    return [_job_view(name, sorted(rows, key=lambda m: natural_key(m["member"])), local.get(name))
            for name, rows in sorted(members.items())]


def _job_view(name: str, rows: list[dict], local: control_pb2.LocalJob | None) -> dict:
    """A job's figures at a glance: where the furthest member is, the global
    batch, the LR law and outer step in force (as this daemon's worker has it), the metric's
    name and, at the end, the consensus's value."""
    active = [m for m in rows if m["state"] not in ("left", "stopped", "failed")] or rows
    p = local.progress if local is not None else None
    metric_name = (p.metric_name if p is not None else "") or "metric"
    consensus = p.metrics.get(f"consensus_{metric_name}") if p is not None else None
    return {
        "name": name, "here": local is not None, "state": local.state if local is not None else "",
        "round": max((m["round"] for m in active), default=0),
        "epochs": max((m["epochs"] for m in active if m["epochs"] is not None), default=None),
        "global_batch": max((m["global_batch"] for m in active), default=0),
        "lr_law": p.lr_law if p is not None else "",
        "outer": p.outer if p is not None else "",  # [outer]: the outer step in force, in words
        "metric_name": metric_name, "metric_higher_better": bool(p.metric_higher_better) if p is not None else True,
        "consensus": _num(consensus) if consensus is not None else None,
        "consensus_peers": int(p.metrics.get("consensus_peers", 0)) if p is not None else 0,
        "members": rows,
    }
