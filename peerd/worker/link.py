"""The worker's line to its daemon: report progress, receive the job's view.

A daemon that stops answering (frozen, or gone where the parent-death signal
does not reach) does not stop the training at once: the data plane does not
need it, so the worker trains on with the view it last heard for
`orphan_after_s`, then leaves at its next round with a checkpoint
(docs/architecture.md, "Workers die with their daemon"). Only heartbeats sent
that long after the last answer count: a worker that was itself stopped
(SIGSTOP, a swapped-out machine) finds its own stall in the first beat's
timeout and does not take it for the daemon's loss.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import grpc

from peerd.control.progress import empty_progress
from peerd.proto.v1 import control_pb2, control_pb2_grpc

log = logging.getLogger("peerd.worker")

ORPHAN_AFTER_S = 60.0  # training on without the daemon's answer, at most (docs/architecture.md)


class SupervisorLink:
    def __init__(self, control_address: str, job: str, fingerprint: str, orphan_after_s: float = ORPHAN_AFTER_S,
                 member: str = "") -> None:
        self._channel = grpc.aio.insecure_channel(control_address)
        self._stub = control_pb2_grpc.SupervisorStub(self._channel)
        self._job = job
        self._member = member  # this worker's id in the job: which of the daemon's workers reports
        self._fingerprint = fingerprint
        self._orphan_after_s = orphan_after_s
        self._last_ok = time.monotonic()
        self._silent_s = 0.0  # how long the daemon had been silent when the newest unanswered beat was sent
        self.address = ""
        self.progress = empty_progress()
        self.view: dict[str, str] = {}  # serving workers: peer id -> exchange address
        self.localities: dict[str, str] = {}  # peer id -> its rack/subnet label
        self.daemons: dict[str, str] = {}  # peer id -> its daemon's peer id (several workers may share one)
        self.members: list[str] = []  # every peer in the job, serving or still starting
        self.speeds: dict[str, float] = {}  # the other members' published speeds (DBS)
        self.fixed_s: dict[str, float] = {}  # ... their published step models (DBS): fixed seconds per step
        self.per_sample_s: dict[str, float] = {}  # ... and seconds per sample
        self.data_sizes: dict[str, int] = {}  # local data: the other members' published data set sizes
        self.progresses: dict[str, float] = {}  # local data: the other members' counts of the job's epochs
        self.terms: dict[str, float] = {}  # local data: the members' terms of the job's clock (peerd.core.unionclock)
        self.stop = False
        self.stop_reason = ""  # why the daemon asked it to leave (WorkerView.stop_reason)
        self.export_path = ""  # peerctl export asks for the model here
        self.settled = False  # the daemon's view can be trusted to show a running job
        self.finished: set[str] = set()  # members that reached the job's end

    @property
    def orphaned(self) -> bool:
        return self._silent_s > self._orphan_after_s

    @property
    def silent_s(self) -> float:
        """Seconds since the daemon last answered."""
        return time.monotonic() - self._last_ok

    async def beat(self) -> bool:
        report = control_pb2.WorkerReport(
            job=self._job, pid=_pid(), address=self.address, fingerprint=self._fingerprint,
            progress=self.progress, member=self._member,
        )
        sent = time.monotonic()
        try:
            reply = await self._stub.Heartbeat(report, timeout=5.0)
        except grpc.aio.AioRpcError as exc:
            self._silent_s = max(self._silent_s, sent - self._last_ok)
            if exc.code() == grpc.StatusCode.NOT_FOUND:  # this daemon does not run this worker (any more)
                if not self.stop:
                    log.warning("the daemon disowns this worker: %s; leaving", exc.details())
                self.stop, self.stop_reason = True, self.stop_reason or "the daemon does not run this worker"
                return False
            log.warning("daemon did not answer the heartbeat: %s", exc.code().name)
            return False
        self._last_ok, self._silent_s = time.monotonic(), 0.0
        self.view = {p.peer_id: p.address for p in reply.peers}
        self.localities = {p.peer_id: p.locality for p in reply.peers}
        self.daemons = {p.peer_id: p.daemon or p.peer_id for p in reply.peers}
        self.members = list(reply.members)
        self.speeds = {s.peer_id: s.samples_per_s for s in reply.speeds}
        self.fixed_s = {s.peer_id: s.fixed_s for s in reply.speeds}
        self.per_sample_s = {s.peer_id: s.per_sample_s for s in reply.speeds}
        self.data_sizes = {s.peer_id: s.data_samples for s in reply.speeds if s.data_samples}
        self.progresses = {s.peer_id: s.progress for s in reply.speeds if s.progress > 0}
        self.terms = {s.peer_id: s.epochs_read for s in reply.speeds if s.epochs_read > 0}
        self.stop = self.stop or reply.stop
        self.stop_reason = self.stop_reason or reply.stop_reason
        self.export_path = reply.export_path
        self.settled = reply.settled
        self.finished = set(reply.finished)
        return True

    async def take_result(self, fingerprint: str, finished: list[str], timeout_s: float,
                          digest: str = "") -> control_pb2.ResultReply:
        """Ask the daemon for the job's model, which finished members hold
        (peerd.daemon.results): it lands in this worker's directory when taken;
        with `digest` (this worker's own end), only when theirs differs."""
        request = control_pb2.ResultRequest(job=self._job, member=self._member, fingerprint=fingerprint,
                                            digest=digest, **{"from": finished})
        try:
            return await self._stub.TakeResult(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            return control_pb2.ResultReply(outcome="none", detail=f"the daemon: {exc.code().name}: {exc.details()}")

    async def run(self, interval_s: float, refresh: Callable[[], None] | None = None) -> None:
        """Beat every interval_s; `refresh()` first brings `progress` up to date."""
        while True:
            if refresh is not None:
                refresh()
            await self.beat()
            await asyncio.sleep(interval_s)

    async def aclose(self) -> None:
        await self._channel.close()


def _pid() -> int:
    import os

    return os.getpid()
