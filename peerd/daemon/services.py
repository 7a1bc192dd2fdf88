"""gRPC edges of the daemon: Peer (TCP), Control and Supervisor (unix socket).

peerd errors become status codes here and nowhere else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc

from peerd import __version__
from peerd.errors import ConfigError, JobMismatch, PeerdError, PeerUnavailable, UnknownJob
from peerd.proto.v1 import control_pb2, control_pb2_grpc, peer_pb2, peer_pb2_grpc

if TYPE_CHECKING:
    from peerd.daemon.app import Daemon

_CODES = {
    ConfigError: grpc.StatusCode.INVALID_ARGUMENT,
    JobMismatch: grpc.StatusCode.FAILED_PRECONDITION,
    UnknownJob: grpc.StatusCode.NOT_FOUND,
    PeerUnavailable: grpc.StatusCode.UNAVAILABLE,
}


async def _abort(context, exc: PeerdError):
    code = next((c for kind, c in _CODES.items() if isinstance(exc, kind)), grpc.StatusCode.UNKNOWN)
    await context.abort(code, str(exc))


class PeerServicer(peer_pb2_grpc.PeerServicer):
    def __init__(self, daemon: Daemon) -> None:
        self._daemon = daemon

    async def Hello(self, request, context):
        if request.peer_id and request.address and request.realm == self._daemon.config.realm:
            self._daemon.learn_address(request.peer_id, request.address, via="hello")
        return self._daemon.hello_reply()

    async def GetJobSpec(self, request, context):
        try:
            return self._daemon.job_spec(request.name)
        except PeerdError as exc:
            await _abort(context, exc)


class ControlServicer(control_pb2_grpc.ControlServicer):
    def __init__(self, daemon: Daemon) -> None:
        self._daemon = daemon

    async def Status(self, request, context):
        return self._daemon.status()

    async def ListPeers(self, request, context):
        return self._daemon.list_peers()

    async def ListJobs(self, request, context):
        return self._daemon.list_jobs()

    async def Join(self, request, context):
        try:
            if request.name:
                spec = await self._daemon.join_by_name(request.name)
            else:
                spec = await self._daemon.join(request.spec_toml, request.spec_dir)
        except PeerdError as exc:
            await _abort(context, exc)
        return control_pb2.JoinReply(name=spec.name, spec_fingerprint=spec.fingerprint)

    async def Leave(self, request, context):
        try:
            await self._daemon.leave(request.name, request.drain)
        except PeerdError as exc:
            await _abort(context, exc)
        return control_pb2.LeaveReply()


class SupervisorServicer(control_pb2_grpc.SupervisorServicer):
    def __init__(self, daemon: Daemon) -> None:
        self._daemon = daemon

    async def Heartbeat(self, request, context):
        try:
            return self._daemon.worker_heartbeat(request)
        except PeerdError as exc:
            await _abort(context, exc)


def hello_request(peer_id: str, address: str, realm: str) -> peer_pb2.HelloRequest:
    return peer_pb2.HelloRequest(peer_id=peer_id, address=address, version=__version__, realm=realm)
