"""The membership view a daemon builds from discovery and Hello replies (docs/algorithms.md §1.7).

Pure: every method takes `now`. The daemon feeds it what it hears; workers get
`job_workers()` as their list of partners. A daemon may run several workers of
a job; each is a member of the job with its own id (JobEntry.member).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from peerd.core.codes import ACTIVE_STATES, WorkerState


@dataclass(frozen=True)
class JobEntry:
    name: str
    spec_fingerprint: str
    worker_address: str
    round: int
    state: str
    phase: str = ""
    lr: float = float("nan")
    global_batch: int = 0
    speed: float = float("nan")  # samples/s its worker measured (DBS)
    local_batch: int = 0
    share: float = float("nan")
    member: str = ""  # the worker's id in the job; "": the daemon's only worker, known by the peer id
    device: str = ""
    data_samples: int = 0  # data_mode = "local": training samples its worker holds (n_i); 0: unknown
    progress: float = 0.0  # data_mode = "local": its count of the job's epochs
    # DBS's step model t(b) = fixed_s + per_sample_s·b its worker measured; 0 from a
    # peer that does not publish it (then planned by `speed` alone)
    fixed_s: float = 0.0
    per_sample_s: float = 0.0
    epochs_read: float = 0.0  # data_mode = "local": its term of the job's clock (peerd.core.unionclock)
    # For display only (peerctl peers, the daemon's page): 0 from a peer older than them
    loss: float = float("nan")
    metric: float = float("nan")
    disagreement: float = float("nan")
    segment_misses: int = 0
    rejected: int = 0
    collapsed: bool = False  # its worker's training collapsed (peerd.core.health)

    @property
    def serving(self) -> bool:
        return bool(self.worker_address) and self.state == WorkerState.RUNNING


@dataclass(frozen=True)
class WorkerEndpoint:
    """A serving worker of a job, as a partner for this daemon's workers."""

    member: str
    address: str
    daemon: str  # its daemon's peer id: workers of one daemon group first
    locality: str


@dataclass(frozen=True)
class PeerRecord:
    peer_id: str
    address: str
    locality: str = ""
    version: str = ""
    jobs: tuple[JobEntry, ...] = ()
    last_seen: float = 0.0
    not_training: str = ""  # why that machine trains no job now (its owner's pause, use, windows)
    # Relay (peerd.core.relay): the peer's start (a new one each start) and the
    # version of this content at that start; 0 from a daemon that sends none.
    incarnation: int = 0
    state_version: int = 0


@dataclass
class Membership:
    """Peers known to this daemon, each dropped `timeout_s` after it was last heard.

    A record's `last_seen` is when the newest news of it was fresh: a reply from
    the peer itself (`observe`), a Hello it sent (`freshen`), or another daemon's
    record with its age (`hear`). Liveness and content merge apart: the latest
    news of an incarnation keeps it, the highest version gives the content, and
    a newer incarnation (a restart) replaces the record."""

    me: str
    timeout_s: float
    _peers: dict[str, PeerRecord] = field(default_factory=dict)
    # peer id -> (incarnation, when it left): news of that start no later than it is stale
    _left: dict[str, tuple[int, float]] = field(default_factory=dict)

    def observe(self, record: PeerRecord) -> bool:
        """Record a fresh Hello reply (the peer speaking for itself: always taken); True if the peer is new."""
        if record.peer_id == self.me:
            return False
        is_new = record.peer_id not in self._peers
        self._peers[record.peer_id] = record
        self._left.pop(record.peer_id, None)
        return is_new

    def hear(self, record: PeerRecord, now: float) -> str:
        """A record second-hand (relayed), `last_seen` set from its age: "new" if the
        peer entered the view, "taken" if its content replaced ours, "" otherwise
        (only its time may have moved on)."""
        if record.peer_id == self.me or now - record.last_seen > self.timeout_s or self._stale(record):
            return ""
        held = self._peers.get(record.peer_id)
        if held is None or record.incarnation > held.incarnation:
            self._peers[record.peer_id] = record
            return "new" if held is None else "taken"
        if record.incarnation < held.incarnation:
            return ""
        seen = max(held.last_seen, record.last_seen)
        if record.state_version > held.state_version:
            self._peers[record.peer_id] = replace(record, last_seen=seen)
            return "taken"
        if seen > held.last_seen:
            self._peers[record.peer_id] = replace(held, last_seen=seen)
        return ""

    def merge(self, peer_id: str, incarnation: int, state_version: int, seen: float, now: float,
              record: Callable[[], PeerRecord]) -> str:
        """A relayed record of a peer, as `hear`; `record()` (its content, read off the wire)
        is only made when that start and version are newer than what we hold."""
        held = self._peers.get(peer_id)
        if held is not None and held.incarnation == incarnation and held.state_version >= state_version:
            self.freshen(peer_id, incarnation, seen)  # the common case: only the time moves
            return ""
        return self.hear(record(), now)

    def freshen(self, peer_id: str, incarnation: int, now: float) -> bool:
        """The peer itself called at `now`: its record's time moves on if we hold
        that incarnation. False if we do not (unknown, or another start)."""
        held = self._peers.get(peer_id)
        if held is None or held.incarnation != incarnation:
            return False
        if now > held.last_seen:
            self._peers[peer_id] = replace(held, last_seen=now)
        return True

    def _stale(self, record: PeerRecord) -> bool:
        left = self._left.get(record.peer_id)
        return left is not None and (record.incarnation, record.last_seen) <= left

    def forget(self, peer_id: str, now: float | None = None) -> bool:
        """The peer left (its zeroconf goodbye): a relayed record of that start no
        newer than `now` is ignored from here on (until it is older than the timeout)."""
        held = self._peers.pop(peer_id, None)
        if held is not None and now is not None:
            self._left[peer_id] = (held.incarnation, now)
        return held is not None

    def expire(self, now: float) -> list[str]:
        """Drop peers not heard from within the timeout; return their ids."""
        dead = [p for p, r in self._peers.items() if now - r.last_seen > self.timeout_s]
        for peer_id in dead:
            del self._peers[peer_id]
        for peer_id in [p for p, (_, at) in self._left.items() if now - at > self.timeout_s]:
            del self._left[peer_id]  # news that old is refused by its age anyway
        return dead

    def peers(self) -> list[PeerRecord]:
        return sorted(self._peers.values(), key=lambda r: r.peer_id)

    def get(self, peer_id: str) -> PeerRecord | None:
        return self._peers.get(peer_id)

    def _entries(
        self, job: str, spec_fingerprint: str, keep: Callable[[JobEntry], bool] = lambda entry: True
    ) -> list[tuple[str, PeerRecord, JobEntry]]:
        """(member id, record, entry) of the other daemons' workers of `job` with
        this spec that `keep` accepts; the first such entry of a member id counts."""
        out, seen = [], set()
        for record in self.peers():
            for entry in record.jobs:
                member = entry.member or record.peer_id
                if (entry.name == job and entry.spec_fingerprint == spec_fingerprint and member not in seen
                        and keep(entry)):
                    seen.add(member)
                    out.append((member, record, entry))
        return out

    def job_workers(self, job: str, spec_fingerprint: str) -> list[WorkerEndpoint]:
        """Every other daemon's worker serving `job` with the same spec (a daemon
        may run several); one with another spec for the same name is left out."""
        return [WorkerEndpoint(member, entry.worker_address, record.peer_id, record.locality)
                for member, record, entry in self._entries(job, spec_fingerprint, lambda e: e.serving)]

    def job_view(self, job: str, spec_fingerprint: str) -> list[tuple[str, str]]:
        """(member id, worker address) of job_workers()."""
        return [(w.member, w.address) for w in self.job_workers(job, spec_fingerprint)]

    def job_members(self, job: str, spec_fingerprint: str) -> list[str]:
        """Member ids of the other daemons' workers in `job` with the same spec, serving or not yet."""
        return [member for member, _, _ in self._entries(job, spec_fingerprint, _active)]

    def job_speeds(self, job: str, spec_fingerprint: str) -> dict[str, float]:
        """member id -> published speed of every other daemon's worker in `job` with the same spec."""
        return {member: entry.speed for member, _, entry in self._entries(job, spec_fingerprint, _active)}

    def job_step_costs(self, job: str, spec_fingerprint: str) -> dict[str, tuple[float, float]]:
        """member id -> published (fixed_s, per_sample_s) of every other daemon's worker in `job` (DBS)."""
        return {member: (entry.fixed_s, entry.per_sample_s)
                for member, _, entry in self._entries(job, spec_fingerprint, _active)}

    def job_data_sizes(self, job: str, spec_fingerprint: str) -> dict[str, int]:
        """member id -> published data set size (local data) of every other daemon's worker in `job`."""
        return {member: entry.data_samples for member, _, entry in self._entries(job, spec_fingerprint, _active)}

    def job_progress(self, job: str, spec_fingerprint: str) -> dict[str, float]:
        """member id -> published job progress (local data) of every other daemon's worker in `job`."""
        return {member: entry.progress for member, _, entry in self._entries(job, spec_fingerprint, _active)}

    def job_terms(self, job: str, spec_fingerprint: str) -> dict[str, float]:
        """member id -> published term of the job's clock (local data) of every other
        daemon's worker in `job`, finished ones included: the terms only grow."""
        return {member: entry.epochs_read for member, _, entry in self._entries(job, spec_fingerprint, _any)
                if entry.epochs_read > 0}

    def job_finished(self, job: str, spec_fingerprint: str) -> list[str]:
        """Member ids of the other daemons' workers that finished `job` (reached its end)."""
        return [member for member, _, _ in
                self._entries(job, spec_fingerprint, lambda e: e.state == WorkerState.FINISHED)]

    def result_holders(self, job: str, spec_fingerprint: str) -> list[str]:
        """The other daemons with a worker that finished `job` (each holds its model), sorted."""
        return sorted({record.peer_id for _, record, _ in
                       self._entries(job, spec_fingerprint, lambda e: e.state == WorkerState.FINISHED)})

    def daemons_of(self, job: str, spec_fingerprint: str, members: Iterable[str]) -> list[str]:
        """The daemons running these members of `job` (a member id that is a
        daemon's own id stands for it, whatever that daemon advertises now)."""
        wanted = set(members)
        found = {record.peer_id for member, record, _ in self._entries(job, spec_fingerprint) if member in wanted}
        return sorted(found | {m for m in wanted if m in self._peers})

    def jobs(self) -> dict[tuple[str, str], list[str]]:
        """(job name, spec fingerprint) -> ids of the peers running it."""
        out: dict[tuple[str, str], list[str]] = {}
        for record in self.peers():
            for entry in record.jobs:
                if entry.state in ACTIVE_STATES:
                    ids = out.setdefault((entry.name, entry.spec_fingerprint), [])
                    if record.peer_id not in ids:
                        ids.append(record.peer_id)
        return out


def liveness(peers: list[PeerRecord], now: float, suspect_after_s: float) -> dict[str, str]:
    """Peer id -> "alive", or "suspected" when not heard from for suspect_after_s."""
    return {r.peer_id: "suspected" if now - r.last_seen > suspect_after_s else "alive" for r in peers}


def _active(entry: JobEntry) -> bool:
    return entry.state in ACTIVE_STATES


def _any(entry: JobEntry) -> bool:
    return True
