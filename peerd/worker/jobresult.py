"""The job's model for a worker that comes back after its job ended elsewhere
(docs/operations.md, "When a member comes back after the end").

Its daemon takes the model a finished member saved (peerd.daemon.results); the
worker trains nothing and says whose model it ends with, or, when no member's
daemon sends one, that it ends with none and where the model is.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from dataclasses import dataclass

from peerd.proto.v1 import control_pb2
from peerd.worker.link import ORPHAN_AFTER_S, SupervisorLink

log = logging.getLogger("peerd.worker")

TAKE_PATIENCE_S = 120.0  # while no finished member's daemon is known yet (its Hello may be on the way)
TAKE_TIMEOUT_S = 900.0  # one take: the daemon downloads and checks the whole model
ASK_AGAIN_S = 0.5


@dataclass(frozen=True)
class Taken:
    """How the take went: the model's source (peerctl status) and its metrics."""

    source: str
    metrics: dict[str, float]
    taken: bool


async def ask(link: SupervisorLink, fingerprint: str, ended_by: list[str]) -> control_pb2.ResultReply:
    """The daemon's answer, asked again while no member's daemon holds a model yet."""
    deadline = time.monotonic() + TAKE_PATIENCE_S
    while True:
        reply = await link.take_result(fingerprint, ended_by, TAKE_TIMEOUT_S)
        if reply.outcome != "pending" or time.monotonic() > deadline:
            return reply
        await asyncio.sleep(ASK_AGAIN_S)
        await link.beat()


async def take_jobs_model(link: SupervisorLink, fingerprint: str, ended_by: list[str], job: str,
                          metric: str) -> Taken:
    reply = await ask(link, fingerprint, ended_by)
    if reply.outcome != "taken":
        log.error("no model.pt here: the job finished on %s while this worker was away, and no member's daemon "
                  "sent its model (%s); the job's model is in their state directory (jobs/%s/model.pt)",
                  ", ".join(ended_by), reply.detail or reply.outcome, job)
        return Taken(f"none: the job's model is on {', '.join(ended_by)}", {}, False)
    return _taken(reply, metric)


async def first_end(link: SupervisorLink, fingerprint: str, members: list[str], digest: str, metric: str) -> Taken:
    """The first end is the job's: when one of `members` finished before this
    worker with another consensus (a frozen daemon hid this worker from it, or
    left it out of this one's), its model is taken instead of this end's.
    Asked once; a frozen daemon answers when it thaws, or not at all."""
    reply = await link.take_result(fingerprint, members, ORPHAN_AFTER_S, digest)
    if reply.outcome != "taken":
        return Taken("", {}, False)
    log.warning("%s finished the job before this end, with another consensus: ending with its model, the "
                "job's", reply.from_peer)
    return _taken(reply, metric)


def _taken(reply: control_pb2.ResultReply, metric: str) -> Taken:
    record = json.loads(reply.record)
    metrics = {k: float(v) for k, v in (record.get("metrics") or {}).items() if isinstance(v, int | float)}
    members = record.get("consensus") or [reply.from_peer]
    log.info("took the job's model from %s: consensus of %d (%s), digest %s, %s %.4f; model saved to model.pt",
             reply.from_peer, len(members), ", ".join(members), record.get("consensus_digest", "?"), metric,
             metrics.get(f"consensus_{metric}", metrics.get(metric, math.nan)))
    return Taken(f"the job's, from {reply.from_peer}", metrics, True)
