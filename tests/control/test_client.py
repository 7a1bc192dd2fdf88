"""The control client against a real gRPC server on a unix socket."""

from __future__ import annotations

from concurrent import futures

import grpc
import pytest

from peerd.control.client import ControlClient
from peerd.errors import DaemonNotRunning
from peerd.proto.v1 import control_pb2, control_pb2_grpc


class FlakyControl(control_pb2_grpc.ControlServicer):
    """Fails the first call of each method with UNAVAILABLE, as a broken connection does."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.code = grpc.StatusCode.UNAVAILABLE

    def _flaky(self, name: str, context) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        if self.calls[name] == 1:
            context.abort(self.code, "Stream removed (Failed parsing HTTP/2)")

    def Status(self, request, context):
        self._flaky("Status", context)
        return control_pb2.StatusReply(peer_id="flaky")

    def Join(self, request, context):
        self._flaky("Join", context)
        return control_pb2.JoinReply()


@pytest.fixture
def flaky(tmp_path):
    servicer = FlakyControl()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    control_pb2_grpc.add_ControlServicer_to_server(servicer, server)
    socket = tmp_path / "control.sock"
    server.add_insecure_port(f"unix:{socket}")
    server.start()
    yield servicer, socket
    server.stop(None)


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN])
def test_a_read_that_meets_a_broken_connection_is_asked_once_more(flaky, code):
    servicer, socket = flaky
    servicer.code = code
    with ControlClient(socket) as client:
        assert client.status().peer_id == "flaky"
    assert servicer.calls["Status"] == 2


def test_a_join_is_never_repeated(flaky):
    servicer, socket = flaky
    with ControlClient(socket) as client, pytest.raises(DaemonNotRunning):
        client.join("[job]\n")
    assert servicer.calls["Join"] == 1
