"""The membership view a daemon builds from discovery and Hello replies (DESIGN §1.7).

Pure: every method takes `now`. The daemon feeds it what it hears; workers get
`job_view()` as their list of partners.
"""

from __future__ import annotations

from dataclasses import dataclass, field


ACTIVE_STATES = ("starting", "running", "restarting")  # a job in these states holds its name


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

    @property
    def serving(self) -> bool:
        return bool(self.worker_address) and self.state == "running"


@dataclass(frozen=True)
class PeerRecord:
    peer_id: str
    address: str
    locality: str = ""
    version: str = ""
    jobs: tuple[JobEntry, ...] = ()
    last_seen: float = 0.0


@dataclass
class Membership:
    """Peers known to this daemon, each dropped `timeout_s` after it was last heard."""

    me: str
    timeout_s: float
    _peers: dict[str, PeerRecord] = field(default_factory=dict)

    def observe(self, record: PeerRecord) -> bool:
        """Record a fresh Hello reply; True if the peer is new."""
        if record.peer_id == self.me:
            return False
        is_new = record.peer_id not in self._peers
        self._peers[record.peer_id] = record
        return is_new

    def forget(self, peer_id: str) -> bool:
        return self._peers.pop(peer_id, None) is not None

    def expire(self, now: float) -> list[str]:
        """Drop peers not heard from within the timeout; return their ids."""
        dead = [p for p, r in self._peers.items() if now - r.last_seen > self.timeout_s]
        for peer_id in dead:
            del self._peers[peer_id]
        return dead

    def peers(self) -> list[PeerRecord]:
        return sorted(self._peers.values(), key=lambda r: r.peer_id)

    def get(self, peer_id: str) -> PeerRecord | None:
        return self._peers.get(peer_id)

    def job_view(self, job: str, spec_fingerprint: str) -> list[tuple[str, str]]:
        """(peer_id, worker address) of every other peer serving `job` with the
        same spec; a peer with another spec for the same name is left out."""
        view = []
        for record in self.peers():
            for entry in record.jobs:
                if entry.name == job and entry.spec_fingerprint == spec_fingerprint and entry.serving:
                    view.append((record.peer_id, entry.worker_address))
                    break  # one worker per peer and job
        return view

    def job_members(self, job: str, spec_fingerprint: str) -> list[str]:
        """Ids of the other peers in `job` with the same spec, serving or not yet."""
        return self.jobs().get((job, spec_fingerprint), [])

    def job_speeds(self, job: str, spec_fingerprint: str) -> dict[str, float]:
        """peer id -> published speed of every other peer in `job` with the same spec."""
        return {record.peer_id: entry.speed for record in self.peers() for entry in record.jobs
                if entry.name == job and entry.spec_fingerprint == spec_fingerprint
                and entry.state in ACTIVE_STATES}

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
