"""The wire side of membership relay (docs/protocol.md, "Membership relay"):
this daemon's own incarnation and version, the peers' records in wire form for
the replies that pass them on, and records to and from the wire.

Decisions (whom to Hello, which record wins, when a peer expires) are in
peerd.core.relay and peerd.core.membership."""

from __future__ import annotations

import time

from peerd.core.membership import JobEntry, Membership, PeerRecord
from peerd.proto.v1 import peer_pb2

MAX_AGE_MS = 2**32 - 1


def entry_of(ad: peer_pb2.JobAd) -> JobEntry:
    return JobEntry(ad.name, ad.spec_fingerprint, ad.worker_address, ad.round, ad.state, ad.phase, ad.lr,
                    ad.global_batch, ad.samples_per_s, ad.local_batch, ad.share, ad.member, ad.device,
                    ad.data_samples, ad.progress, fixed_s=ad.fixed_s, per_sample_s=ad.per_sample_s,
                    epochs_read=ad.epochs_read, loss=ad.loss, metric=ad.metric, disagreement=ad.disagreement,
                    segment_misses=ad.segment_misses, rejected=ad.rejected, collapsed=ad.collapsed)


def record_of(state: peer_pb2.PeerState, seen: float) -> PeerRecord:
    """The record a PeerState gives, its news fresh at `seen`."""
    return PeerRecord(state.peer_id, state.address, state.locality, state.version,
                      tuple(entry_of(j) for j in state.jobs), seen, state.not_training,
                      state.incarnation, state.state_version)


def state_of_reply(reply: peer_pb2.HelloReply, address: str) -> peer_pb2.PeerState:
    """A peer's own reply as the record others get from us."""
    return peer_pb2.PeerState(peer_id=reply.peer_id, address=address, locality=reply.locality,
                              version=reply.version, jobs=reply.jobs, not_training=reply.not_training,
                              incarnation=reply.incarnation, state_version=reply.state_version)


class Records:
    """This daemon's own record's incarnation (its start, in ns of the wall clock,
    so a restart outranks the start before it) and version (bumped when what its
    reply says changes); the peers' records as last taken, for replies."""

    def __init__(self, incarnation: int | None = None) -> None:
        self.incarnation = incarnation if incarnation is not None else time.time_ns()
        self.version = 0
        self._content = b""
        self._states: dict[str, peer_pb2.PeerState] = {}

    def stamp(self, reply: peer_pb2.HelloReply) -> peer_pb2.HelloReply:
        """Set this daemon's incarnation and version on its own reply."""
        content = peer_pb2.PeerState(locality=reply.locality, version=reply.version, jobs=reply.jobs,
                                     not_training=reply.not_training).SerializeToString(deterministic=True)
        if content != self._content:
            self._content = content
            self.version += 1
        reply.incarnation, reply.state_version = self.incarnation, self.version
        return reply

    def remember(self, state: peer_pb2.PeerState) -> None:
        self._states[state.peer_id] = state

    def forget(self, peer_id: str) -> None:
        self._states.pop(peer_id, None)

    def states(self, membership: Membership, now: float) -> list[peer_pb2.PeerState]:
        """The records of the peers in the view, each with the age of its news."""
        out = []
        for record in membership.peers():
            state = self._states.get(record.peer_id)
            if state is None or state.incarnation != record.incarnation:
                continue
            copy = peer_pb2.PeerState()
            copy.CopyFrom(state)
            copy.age_ms = min(MAX_AGE_MS, max(0, round(1000 * (now - record.last_seen))))
            out.append(copy)
        for peer_id in [p for p in self._states if membership.get(p) is None]:
            del self._states[peer_id]  # expired or forgotten
        return out
