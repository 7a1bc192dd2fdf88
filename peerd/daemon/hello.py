"""The Hello client: asks known peers (and each seed) who they are and what they
run, every hello_interval_s, and keeps the address book and the membership view
from the answers. In a full mesh it asks every peer; in a larger realm a few at
random, and takes the others' records from their replies (peerd.core.relay).
Owns the channels to the peers."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable

import grpc

from peerd.security.auth import Authenticator
from peerd.settings.config import DaemonConfig
from peerd.core.directory import HELLO, ZEROCONF, PeerDirectory
from peerd.core.relay import hello_targets, relaying, view_timeout
from peerd.core.membership import Membership, PeerRecord
from peerd.daemon.records import Records, entry_of, record_of, state_of_reply
from peerd.daemon.services import GET_JOB_CODE, GET_JOB_RESULT, GET_JOB_SPEC, HELLO as HELLO_METHOD, PeerClient, hello_request
from peerd.errors import PeerdError, PeerUnavailable
from peerd.proto.v1 import peer_pb2
from peerd.security.rejections import Rejections
from peerd.security.tls import TlsMaterial, handshake_refusal

log = logging.getLogger("peerd")
HELLO_TIMEOUT_S = 2.0
CODE_TIMEOUT_S = 30.0  # one range of a job's code bundle (1 MiB)


class HelloClient:
    def __init__(self, peer_id: str, config: DaemonConfig, membership: Membership, auth: Authenticator | None,
                 tls: TlsMaterial | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.peer_id, self.config, self.membership, self.clock = peer_id, config, membership, clock
        self.directory = PeerDirectory(peer_id)
        self.records = Records()
        self.relaying = False  # the realm is larger than a full mesh: Hello a few, take records second-hand
        self.realm_size = 1  # this daemon and the peers it knows, at the last round
        self._rng = random.Random()
        # What the page's metrics and the tests count: Hello rounds, the Hellos
        # they sent, and the replies each peer gave.
        self.rounds = self.round_hellos = 0
        self.answered: Counter[str] = Counter()
        self.peer_address = ""  # this daemon's, once its Peer service is bound
        self.worker_changed = asyncio.Event()  # a worker started or stopped serving: Hello now
        self._peers = PeerClient(auth, tls)
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._background: set[asyncio.Task] = set()  # channel closes and out-of-turn Hellos in flight
        self._pulling: set[str] = set()  # peers asked out of turn, until they answer
        # A peer of another CA fails every Hello: one line per peer per minute, not one per try.
        self.tls_refusals = Rejections(log, clock, what="TLS handshake failed with")

    # ---- the address book ------------------------------------------------

    def learn_address(self, peer_id: str, address: str, via: str = ZEROCONF) -> None:
        """A peer's address from zeroconf, or (via="hello") from a Hello."""
        change = self.directory.learn(peer_id, address, via, self.clock())
        if change.found:
            log.info("found peer %s at %s (%s)", peer_id, address, via)
        self._close_channel(change.unused)

    def forget_address(self, peer_id: str) -> None:
        self._close_channel(self.directory.forget(peer_id))

    def lost(self, peer_id: str) -> None:
        """Zeroconf says the peer withdrew its announcement."""
        log.info("peer %s withdrew its announcement", peer_id)
        self.forget_address(peer_id)
        self.membership.forget(peer_id, self.clock())  # relayed records of its start are stale from now on
        self.records.forget(peer_id)

    def _close_channel(self, address: str | None) -> None:
        channel = self._channels.pop(address, None) if address is not None else None
        if channel is not None:
            self._in_background(asyncio.ensure_future(channel.close()))

    def _in_background(self, task: asyncio.Future) -> None:
        self._background.add(task)  # awaited on shutdown
        task.add_done_callback(self._background.discard)

    def _channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = self._peers.channel(address)
        return channel

    # ---- Hello rounds ------------------------------------------------------

    async def run(self, after_round: Callable[[], Awaitable[None]]) -> None:
        """Hello everyone every interval, or at once (asking the others back) when
        a worker starts or stops serving; `after_round` after each round."""
        changed = False
        while True:
            try:
                await self.hello_all(changed)
                await after_round()
            except Exception:  # one bad round must not stop discovery for good
                log.exception("hello round failed")
            try:
                await asyncio.wait_for(self.worker_changed.wait(), self.config.hello_interval_s)
            except TimeoutError:
                pass
            changed = self.worker_changed.is_set()
            self.worker_changed.clear()

    async def hello_all(self, changed: bool = False) -> None:
        """One round: every peer in a full mesh or after a change of this daemon's
        workers, else `fanout` random ones; then the view's expiry."""
        known = self.directory.addresses()
        seeds = [a for a in self.config.seeds if a not in known and a != self.peer_address]
        peers = dict(self.directory.items())
        n = self.realm_size = max(len(peers), len(self.membership.peers())) + 1
        self.relaying = relaying(n - 1, self.config.full_mesh_max)
        self.membership.timeout_s = view_timeout(n, self.config.peer_timeout_s, self.config.hello_interval_s,
                                                 self.config.full_mesh_max)
        targets = list(peers) if changed else hello_targets(sorted(peers), self.config.fanout,
                                                            self.config.full_mesh_max, self._rng)
        self.rounds += 1
        self.round_hellos += len(targets)
        await asyncio.gather(*(self.hello(p, peers[p], changed) for p in targets),
                             *(self.hello("", a, changed) for a in seeds))
        now = self.clock()
        for peer_id in self.membership.expire(now):
            log.warning("peer %s timed out", peer_id)
        answering = lambda p: self.membership.get(p) is not None  # noqa: E731
        for address in self.directory.expire(now, self.config.peer_timeout_s, answering):
            self._close_channel(address)  # heard of, but silent: not tried forever

    def pull_soon(self, peer_id: str) -> None:
        """A peer says its workers changed: ask it now rather than at the next
        interval (one ask in flight per peer), so a leave or a join reaches the
        other workers' views within a Hello round trip."""
        address = self.directory.address(peer_id)
        if address is None or peer_id in self._pulling:
            return
        self._pulling.add(peer_id)
        task = asyncio.create_task(self.hello(peer_id, address))
        task.add_done_callback(lambda _: self._pulling.discard(peer_id))
        self._in_background(task)

    def called_by(self, peer_id: str, incarnation: int, state_version: int) -> None:
        """A peer's Hello to us, relaying: it is alive now. Ask it back at once
        when we do not hold that start of it, or hold an older version."""
        if not self.relaying or not incarnation:
            return  # a full mesh hears each peer from its own replies alone
        held = self.membership.get(peer_id)
        if not self.membership.freshen(peer_id, incarnation, self.clock()) or held.state_version < state_version:
            self.pull_soon(peer_id)

    async def hello(self, peer_id: str, address: str, changed: bool = False) -> None:
        try:
            reply = await self._peers.call(
                self._channel(address), HELLO_METHOD,
                hello_request(self.peer_id, self.peer_address, self.config.realm, changed,
                              self.records.incarnation, self.records.version, self.relaying),
                peer_pb2.HelloReply, HELLO_TIMEOUT_S)
        except PeerdError as exc:
            refusal = handshake_refusal(str(exc))
            if refusal is not None:
                self.tls_refusals.record(f"{peer_id or 'a seed'} at {address}", "tls", refusal)
            else:
                log.debug("hello to %s at %s failed: %s", peer_id, address, exc)
            return  # silence counts against it through the membership timeout
        self.answered[reply.peer_id] += 1
        if reply.realm != self.config.realm:
            if peer_id:
                self.forget_address(peer_id)
            return
        if not peer_id:  # a seed: now we know who answers there
            if reply.peer_id == self.peer_id or not reply.peer_id:
                return
            self.learn_address(reply.peer_id, address, via=HELLO)
        for known in reply.known:  # passed onward: discovery reaches beyond the seeds
            if known.peer_id and known.address and known.peer_id not in self.directory:
                self.learn_address(known.peer_id, known.address, via=HELLO)
        self._observe(reply, address)
        if self.relaying:
            self._hear(reply.peers)

    def _observe(self, reply: peer_pb2.HelloReply, address: str) -> None:
        """The peer's own reply: first-hand, always taken."""
        jobs = tuple(entry_of(j) for j in reply.jobs)
        record = PeerRecord(reply.peer_id, address, reply.locality, reply.version, jobs, self.clock(),
                            reply.not_training, reply.incarnation, reply.state_version)
        self.records.remember(state_of_reply(reply, address))
        if self.membership.observe(record):
            log.info("peer %s joined the view (%d known)", reply.peer_id, len(self.membership.peers()))

    def _hear(self, states) -> None:
        """The replier's records of the others: taken where newer (Membership.hear)."""
        now = self.clock()
        for state in states:
            if state.peer_id == self.peer_id:
                continue
            seen = now - state.age_ms / 1000
            taken = self.membership.merge(state.peer_id, state.incarnation, state.state_version, seen, now,
                                          lambda: record_of(state, seen))  # noqa: B023 (called at once)
            if taken:
                self.records.remember(state)
                self.learn_address(state.peer_id, state.address, via=HELLO)
            if taken == "new":
                log.info("peer %s joined the view through a relay (%d known)", state.peer_id,
                         len(self.membership.peers()))

    async def job_spec(self, peer_id: str, name: str) -> peer_pb2.JobSpecReply:
        """The spec of job `name` as `peer_id` has it (a member of the view)."""
        record = self.membership.get(peer_id)
        if record is None:  # expired or withdrawn since the caller listed it
            raise PeerUnavailable(f"peer {peer_id} left the view")
        return await self._peers.call(
            self._channel(record.address), GET_JOB_SPEC, peer_pb2.JobSpecRequest(name=name),
            peer_pb2.JobSpecReply, HELLO_TIMEOUT_S)

    async def job_code(self, peer_id: str, request: peer_pb2.JobCodeRequest,
                       job_auth: Authenticator) -> peer_pb2.JobCodeReply:
        """A range of a job's code bundle from `peer_id`, asked and answered with
        proof of the job secret; the request names the address it goes to."""
        record = self.membership.get(peer_id)
        if record is None:
            raise PeerUnavailable(f"peer {peer_id} left the view")
        return await self._peers.call(self._channel(record.address), GET_JOB_CODE, request, peer_pb2.JobCodeReply,
                                      CODE_TIMEOUT_S, job=(job_auth, record.address))

    async def job_result(self, peer_id: str, request: peer_pb2.JobResultRequest,
                         job_auth: Authenticator | None) -> peer_pb2.JobResultReply:
        """A range of the model a finished job saved on `peer_id`, with proof of
        the job secret both ways when the job has one."""
        record = self.membership.get(peer_id)
        if record is None:
            raise PeerUnavailable(f"peer {peer_id} left the view")
        job = (job_auth, record.address) if job_auth is not None else None
        return await self._peers.call(self._channel(record.address), GET_JOB_RESULT, request,
                                      peer_pb2.JobResultReply, CODE_TIMEOUT_S, job=job)

    async def aclose(self) -> None:
        await asyncio.gather(*self._background, *(c.close() for c in self._channels.values()),
                             return_exceptions=True)
