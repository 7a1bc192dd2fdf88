"""gRPC edges of the daemon: Peer (TCP), Control and Supervisor (unix socket).

peerd errors become status codes here and nowhere else.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2_grpc

from peerd import __version__
from peerd.core.names import PEER_ID_RULE, join_host_port, valid_address, valid_peer_id
from peerd.security.auth import AUTH_KEY, REPLY_KEY, Authenticator, ReplyMac, metadata_value
from peerd.errors import ConfigError, JobMismatch, PeerdError, PeerUnavailable, Unauthenticated, UnknownJob
from peerd.daemon.codestore import CodeStore
from peerd.daemon.results import ResultFiles, Saved
from peerd.settings.jobspec import JobSpec
from peerd.proto.v1 import control_pb2, control_pb2_grpc, peer_pb2
from peerd.security.rejections import Rejections
from peerd.security.tls import TlsMaterial, add_port, open_channel

_CODES = {
    ConfigError: grpc.StatusCode.INVALID_ARGUMENT,
    JobMismatch: grpc.StatusCode.FAILED_PRECONDITION,
    UnknownJob: grpc.StatusCode.NOT_FOUND,
    PeerUnavailable: grpc.StatusCode.UNAVAILABLE,
}


async def _abort(context, exc: PeerdError):
    code = next((c for kind, c in _CODES.items() if isinstance(exc, kind)), grpc.StatusCode.UNKNOWN)
    await context.abort(code, str(exc))


log = logging.getLogger("peerd")
PEER_SERVICE = "peerd.v1.Peer"
HELLO = f"/{PEER_SERVICE}/Hello"
GET_JOB_SPEC = f"/{PEER_SERVICE}/GetJobSpec"
GET_JOB_CODE = f"/{PEER_SERVICE}/GetJobCode"
GET_JOB_RESULT = f"/{PEER_SERVICE}/GetJobResult"
# A job's code goes only to a caller that proves the job secret, beside any realm proof.
JOB_AUTH_KEY, JOB_REPLY_KEY = "peerd-job-auth", "peerd-job-auth-reply"
MAX_PEER_REQUEST_BYTES = 16 * 1024
MAX_PEER_REPLY_BYTES = 4 * 1024 * 1024  # a job spec, or a Hello with many jobs
PEER_SERVER_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_PEER_REQUEST_BYTES),
    ("grpc.max_send_message_length", MAX_PEER_REPLY_BYTES),
]
PEER_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_PEER_REPLY_BYTES),
    ("grpc.max_send_message_length", MAX_PEER_REQUEST_BYTES),
]


class AddressBook(Protocol):
    """What a Hello tells the daemon: who is where, and who changed
    (peerd.daemon.hello.HelloClient)."""

    def learn_address(self, peer_id: str, address: str, via: str) -> None: ...

    def pull_soon(self, peer_id: str) -> None: ...

    def called_by(self, peer_id: str, incarnation: int, state_version: int) -> None: ...


class JobSpecs(Protocol):
    """The specs of the jobs this daemon joined (peerd.daemon.registry.JobRegistry)."""

    def spec_reply(self, name: str) -> peer_pb2.JobSpecReply: ...

    def code_secret(self, name: str, code: str) -> bytes: ...

    def result(self, name: str, spec_fingerprint: str) -> tuple[Saved, bytes | None]: ...

    code: CodeStore
    results: ResultFiles


class PeerServicer:
    """Daemon-to-daemon calls. Requests arrive as raw bytes: with a realm secret
    they must carry proof of it (peerd.security.auth), and replies carry proof back.

    A Hello of this `realm` goes to `book`; every Hello is answered with
    `hello_reply(relay)` (the peers' records too when the caller relays), a
    GetJobSpec and a GetJobCode from `specs`; `address()` is this daemon's Peer
    address, which a job proof must name."""

    def __init__(self, realm: str, book: AddressBook, hello_reply: Callable[[bool], peer_pb2.HelloReply],
                 specs: JobSpecs, auth: Authenticator | None = None, address: Callable[[], str] = str) -> None:
        self._realm = realm
        self._address = address
        self._job_auths: dict[bytes, Authenticator] = {}  # by the secret's sha256: each its own nonces
        self._book = book
        self._hello_reply = hello_reply
        self._specs = specs
        self._auth = auth
        self.rejections = Rejections(log)
        self.hellos = 0  # answered (peerd_hellos_received)

    async def _refuse(self, context, code: grpc.StatusCode, reason: str, message: str) -> None:
        peer = context.peer() or "unknown"
        self.rejections.record(peer.rsplit(":", 1)[0], reason, message)
        await context.abort(code, message)

    async def _admit(self, method: str, raw: bytes, message_type, context):
        reply = None
        if self._auth is not None:
            try:
                reply = self._auth.verify(method, raw, metadata_value(context.invocation_metadata(), AUTH_KEY))
            except Unauthenticated as exc:
                await self._refuse(context, grpc.StatusCode.UNAUTHENTICATED, exc.reason, str(exc))
        try:
            return message_type.FromString(raw), reply
        except DecodeError:
            await self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT, "malformed", "undecodable request")

    def _answer(self, context, reply, message, job_reply: ReplyMac | None = None) -> bytes:
        raw = message.SerializeToString()
        trailers = []
        for key, mac in ((REPLY_KEY, reply), (JOB_REPLY_KEY, job_reply)):
            if mac is not None:
                mac.update(raw)
                trailers.append((key, mac.digest()))
        if trailers:
            context.set_trailing_metadata(tuple(trailers))
        return raw

    async def Hello(self, raw: bytes, context) -> bytes:
        request, reply = await self._admit(HELLO, raw, peer_pb2.HelloRequest, context)
        if request.realm == self._realm and (request.peer_id or request.address):
            if not (valid_peer_id(request.peer_id) and valid_address(request.address)):
                await self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT, "bad_request",
                                   f"Hello needs a peer_id of {PEER_ID_RULE} and an IP:port address")
            self._book.learn_address(request.peer_id, request.address, via="hello")
            if request.changed:
                self._book.pull_soon(request.peer_id)
            elif request.incarnation:
                self._book.called_by(request.peer_id, request.incarnation, request.state_version)
        self.hellos += 1
        return self._answer(context, reply, self._hello_reply(request.relay))

    async def GetJobSpec(self, raw: bytes, context) -> bytes:
        request, reply = await self._admit(GET_JOB_SPEC, raw, peer_pb2.JobSpecRequest, context)
        try:
            return self._answer(context, reply, self._specs.spec_reply(request.name))
        except PeerdError as exc:
            await _abort(context, exc)

    async def GetJobCode(self, raw: bytes, context) -> bytes:
        request, reply = await self._admit(GET_JOB_CODE, raw, peer_pb2.JobCodeRequest, context)
        try:
            secret = self._specs.code_secret(request.name, request.code)
        except Unauthenticated as exc:
            await self._refuse(context, grpc.StatusCode.UNAUTHENTICATED, exc.reason, str(exc))
        except PeerdError as exc:
            await _abort(context, exc)
        job_reply = await self._job_proof(GET_JOB_CODE, raw, secret, context)
        total, data = self._specs.code.chunk(request.code, request.offset)
        message = peer_pb2.JobCodeReply(code=request.code, total=total, offset=request.offset, data=data)
        return self._answer(context, reply, message, job_reply)

    async def GetJobResult(self, raw: bytes, context) -> bytes:
        request, reply = await self._admit(GET_JOB_RESULT, raw, peer_pb2.JobResultRequest, context)
        try:
            saved, secret = self._specs.result(request.name, request.spec_fingerprint)
        except PeerdError as exc:
            await _abort(context, exc)
        job_reply = await self._job_proof(GET_JOB_RESULT, raw, secret, context) if secret is not None else None
        try:
            message = await asyncio.to_thread(self._specs.results.reply, saved, request.offset, request.record_only)
        except (PeerdError, OSError) as exc:
            await _abort(context, exc if isinstance(exc, PeerdError) else UnknownJob(f"the saved model: {exc}"))
        return self._answer(context, reply, message, job_reply)

    async def _job_proof(self, method: str, raw: bytes, secret: bytes, context) -> ReplyMac:
        """The caller's proof of the job secret, checked; the proof back."""
        key = hashlib.sha256(secret).digest()
        auth = self._job_auths.get(key) or self._job_auths.setdefault(key, Authenticator(secret))
        try:
            return auth.verify(method, raw, metadata_value(context.invocation_metadata(), JOB_AUTH_KEY),
                               audience=self._address())
        except Unauthenticated as exc:
            await self._refuse(context, grpc.StatusCode.UNAUTHENTICATED, exc.reason, f"job secret: {exc}")


async def start_peer_server(
    servicer: PeerServicer, health, host: str, port: int, tls: TlsMaterial | None
) -> tuple[grpc.aio.Server, str]:
    """The Peer and Health services on host:port; the server and its address."""
    server = grpc.aio.server(options=PEER_SERVER_OPTIONS, maximum_concurrent_rpcs=256)
    handlers = {
        "Hello": grpc.unary_unary_rpc_method_handler(servicer.Hello),
        "GetJobSpec": grpc.unary_unary_rpc_method_handler(servicer.GetJobSpec),
        "GetJobCode": grpc.unary_unary_rpc_method_handler(servicer.GetJobCode),
        "GetJobResult": grpc.unary_unary_rpc_method_handler(servicer.GetJobResult),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(PEER_SERVICE, handlers),))
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    bound = add_port(server, join_host_port(host, port), tls)
    if bound == 0:
        raise ConfigError(f"cannot bind the peer service to {join_host_port(host, port)}")
    await server.start()
    return server, join_host_port(host, bound)


class PeerClient:
    """The caller's side of the Peer service: signs requests and checks replies
    when a realm secret is set; gRPC errors become peerd errors here."""

    def __init__(self, auth: Authenticator | None, tls: TlsMaterial | None) -> None:
        self._auth = auth
        self._tls = tls

    def channel(self, address: str) -> grpc.aio.Channel:
        return open_channel(address, self._tls, PEER_CHANNEL_OPTIONS)

    async def call(self, channel: grpc.aio.Channel, method: str, request, reply_type, timeout: float,
                   job: tuple[Authenticator, str] | None = None):
        """`job`: the job secret's authenticator and the callee's address, for a
        call that must prove the job secret (GetJobCode) and be proved back."""
        body = request.SerializeToString()
        metadata, macs = [], []
        if self._auth is not None:
            header, reply = self._auth.sign(method, body)
            metadata.append(header)
            macs.append((REPLY_KEY, reply))
        if job is not None:
            (_, value), reply = job[0].sign(method, body, audience=job[1])
            metadata.append((JOB_AUTH_KEY, value))
            macs.append((JOB_REPLY_KEY, reply))
        call = channel.unary_unary(method)(body, timeout=timeout, metadata=tuple(metadata) or None)
        try:
            raw = await call
            trailing = await call.trailing_metadata() if macs else None
            for key, reply in macs:
                reply.update(raw)
                reply.check(metadata_value(trailing, key))
            return reply_type.FromString(raw)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                raise Unauthenticated(f"refused this peer's proof: {exc.details()}", "refused") from None
            raise PeerUnavailable(f"{exc.code().name}: {exc.details()}") from None
        except DecodeError:
            raise PeerUnavailable("undecodable reply") from None


class ControlApi(Protocol):
    """What peerctl asks of the daemon (peerd.daemon.app.Daemon)."""

    def status(self) -> control_pb2.StatusReply: ...

    def list_peers(self) -> control_pb2.ListPeersReply: ...

    def list_jobs(self) -> control_pb2.ListJobsReply: ...

    async def join(self, spec_toml: str, spec_dir: str) -> JobSpec: ...

    async def join_by_name(self, name: str, spec_dir: str = "", accept_code: str = "") -> JobSpec: ...

    async def fetch_code(self, name: str, spec_dir: str) -> control_pb2.FetchCodeReply: ...

    async def leave(self, name: str, drain: bool) -> None: ...

    async def export(self, name: str, path: str) -> control_pb2.ExportReply: ...

    async def pause(self, for_s: float) -> str: ...

    async def resume(self) -> str: ...


class ControlServicer(control_pb2_grpc.ControlServicer):
    def __init__(self, api: ControlApi) -> None:
        self._api = api

    async def Status(self, request, context):
        return self._api.status()

    async def ListPeers(self, request, context):
        return self._api.list_peers()

    async def ListJobs(self, request, context):
        return self._api.list_jobs()

    async def Join(self, request, context):
        try:
            if request.name:
                spec = await self._api.join_by_name(request.name, request.spec_dir, request.accept_code)
            else:
                spec = await self._api.join(request.spec_toml, request.spec_dir)
        except PeerdError as exc:
            await _abort(context, exc)
        return control_pb2.JoinReply(name=spec.name, spec_fingerprint=spec.fingerprint)

    async def FetchCode(self, request, context):
        try:
            return await self._api.fetch_code(request.name, request.spec_dir)
        except PeerdError as exc:
            await _abort(context, exc)

    async def Leave(self, request, context):
        try:
            await self._api.leave(request.name, request.drain)
        except PeerdError as exc:
            await _abort(context, exc)
        return control_pb2.LeaveReply()

    async def Export(self, request, context):
        try:
            return await self._api.export(request.name, request.path)
        except PeerdError as exc:
            await _abort(context, exc)

    async def Pause(self, request, context):
        if not 0 <= request.for_s < 1e9:  # NaN too
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"for_s = {request.for_s}: expected seconds >= 0")
        return control_pb2.PauseReply(not_training=await self._api.pause(request.for_s))

    async def Resume(self, request, context):
        return control_pb2.ResumeReply(not_training=await self._api.resume())


# A worker's report in, the job's view for it out (peerd.daemon.app.Daemon.worker_heartbeat).
WorkerHeartbeat = Callable[[control_pb2.WorkerReport], control_pb2.WorkerView]


# A worker back after its job's end asks for the job's model (peerd.daemon.app.Daemon.take_result).
TakeResult = Callable[[control_pb2.ResultRequest], Awaitable[control_pb2.ResultReply]]


class SupervisorServicer(control_pb2_grpc.SupervisorServicer):
    def __init__(self, heartbeat: WorkerHeartbeat, take_result: TakeResult) -> None:
        self._heartbeat = heartbeat
        self._take_result = take_result

    async def Heartbeat(self, request, context):
        try:
            return self._heartbeat(request)
        except PeerdError as exc:
            await _abort(context, exc)

    async def TakeResult(self, request, context):
        try:
            return await self._take_result(request)
        except PeerdError as exc:
            await _abort(context, exc)


def hello_request(peer_id: str, address: str, realm: str, changed: bool = False, incarnation: int = 0,
                  state_version: int = 0, relay: bool = False) -> peer_pb2.HelloRequest:
    return peer_pb2.HelloRequest(peer_id=peer_id, address=address, version=__version__, realm=realm,
                                 changed=changed, incarnation=incarnation, state_version=state_version,
                                 relay=relay)
