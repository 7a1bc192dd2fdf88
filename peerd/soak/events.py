"""Carrying out one churn event of the schedule against a running soak: kill a
worker or a daemon, cut a peer's link, drain it out, slow it down, pause it for
its owner, freeze its daemon or worker, or join a peer (new or again). Each
event runs in a thread of its own (`Running`), so the soak goes on sampling
every peer meanwhile.
"""

from __future__ import annotations

import subprocess
import threading
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from peerd.errors import PeerdError
from peerd.soak import schedule as sch
from peerd.soak.checks import EventRecord
from peerd.soak.netns import Unsupported
from peerd.soak.peers import SoakPeer

if TYPE_CHECKING:
    from peerd.soak.runner import Soak

EVENT_SLACK_S = 150.0  # an event's actions may take down_s plus this


def carry_out(soak: Soak, event: sch.Event) -> EventRecord:
    """Do `event` and say how it went; a failure is the record's, not raised."""
    at = soak.now()
    if event.kind == sch.JOIN and event.peer < 0:  # a new peer: the next free index
        event = replace(event, peer=max(soak.peers) + 1)
    try:
        detail = _act(soak, event)
        ok = True
    except Unsupported as exc:
        soak.say(f"[{at:5.0f}s] {event.describe()}: skipped: {exc}")
        return EventRecord(at, soak.now(), event.kind, f"peer-{event.peer}", f"skipped: {exc}", ok=False)
    except (PeerdError, OSError, subprocess.SubprocessError) as exc:
        detail, ok = f"failed: {exc}", False
    record = EventRecord(at, soak.now(), event.kind, f"peer-{event.peer}", detail, ok)
    soak.say(f"[{record.at_s:5.0f}s] {event.describe()}: {detail}")
    return record


def _act(soak: Soak, e: sch.Event) -> str:
    job = soak.run.spec.name
    if e.kind == sch.JOIN:
        return _join_event(soak, e.peer)
    peer = soak.peers.get(e.peer)
    if peer is None:
        raise PeerdError(f"no peer-{e.peer} in this run")
    if e.kind == sch.KILL_WORKER:
        return f"killed worker pid {peer.kill_worker(job)}"
    if e.kind == sch.KILL_DAEMON:
        pid = peer.process.pid
        peer.kill_daemon()
        time.sleep(e.down_s)
        peer.start()
        peer.wait_ready()
        return f"killed daemon pid {pid}; restarted as pid {peer.process.pid}"
    if e.kind == sch.PARTITION:
        soak.net.set_link(peer.index, up=False)
        peer.linked = False
        time.sleep(e.down_s)
        soak.net.set_link(peer.index, up=True)
        peer.linked = True
        return f"link down {e.down_s:g}s, then up"
    if e.kind == sch.LEAVE:
        with peer.client(timeout_s=EVENT_SLACK_S) as c:
            c.leave(job, drain=True)
        peer.in_job = False
        return "left after draining"
    if e.kind == sch.OWNER:
        return _owner_event(peer, e.down_s)
    if e.kind == sch.FREEZE:
        return _freeze_event(peer, e, job)
    if e.kind == sch.SLOWDOWN:
        if not soak.slowdown_key:
            raise Unsupported("this build's daemon config has no `slowdown`")
        peer.stop()
        peer.slowdown = e.factor
        peer.write_config(soak.realm, soak.slowdown_key, soak.data_config(peer.index), discovery=soak.discovery())
        peer.start()
        peer.wait_ready()
        return f"daemon restarted with slowdown {e.factor:g}"
    raise PeerdError(f"unknown event kind {e.kind}")


def _join_event(soak: Soak, index: int) -> str:
    peer = soak.peers.get(index)
    fresh = peer is None
    if fresh:
        peer = soak.add_peer(index)
        peer.start()
        peer.wait_ready()
        soak.wait(lambda: _sees_any(peer), f"peer-{index} to discover the others", 60.0)
    elif peer.in_job:
        raise PeerdError(f"peer-{index} is already in the job")
    soak.join(peer)
    return "new peer joined" if fresh else "joined again"


def _owner_event(peer: SoakPeer, down_s: float) -> str:
    """The owner's manual switch (peerctl pause --for): the pause returns once the
    machine's workers have left; the daemon joins its jobs again by itself."""
    asked = time.monotonic()
    with peer.client(timeout_s=EVENT_SLACK_S) as c:
        reply = c.pause(for_s=down_s)
    freed = time.monotonic() - asked
    time.sleep(max(0.0, down_s - freed))
    return f"paused for its owner ({reply.not_training}): its workers left in {freed:.1f}s"


def _freeze_event(peer: SoakPeer, e: sch.Event, job: str) -> str:
    """SIGSTOP the peer's daemon or worker, SIGCONT it after down_s (or as soon
    as the soak ends: a stopped process cannot end cleanly)."""
    pid = peer.freeze(e.process, job)
    stopped = time.monotonic()
    try:
        peer.stay_frozen(e.down_s)
    finally:
        peer.thaw()
    return f"{e.process} pid {pid} stopped (SIGSTOP) for {time.monotonic() - stopped:.1f}s, then continued (SIGCONT)"


def _sees_any(peer: SoakPeer) -> bool:
    with peer.client() as c:
        return c.status().peers_known > 0


@dataclass
class Running:
    """An event being carried out in its own thread, so sampling goes on meanwhile."""

    event: sch.Event
    started_s: float
    limit_s: float
    thread: threading.Thread | None = None
    result: list[EventRecord] = field(default_factory=list)

    def start(self, carry_out) -> None:
        self.thread = threading.Thread(target=lambda: self.result.append(carry_out(self.event)), daemon=True)
        self.thread.start()

    @property
    def done(self) -> bool:
        return not self.thread.is_alive()

    def record(self, now: float) -> EventRecord:
        if self.result:
            return self.result[0]
        what = "did not finish" if self.thread.is_alive() else "crashed"
        return EventRecord(self.started_s, now, self.event.kind, f"peer-{self.event.peer}", f"failed: {what}", False)
