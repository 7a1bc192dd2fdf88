"""The daemon's gRPC servicers on their own: each is built from the narrow parts
it uses (no Daemon, no server, no sockets) and called as grpc.aio would call it."""

from __future__ import annotations

from types import SimpleNamespace

import grpc
import pytest

from peerd.security.auth import REPLY_KEY, Authenticator, metadata_value
from peerd.daemon.services import HELLO, ControlServicer, PeerServicer, SupervisorServicer, hello_request
from peerd.errors import JobMismatch, UnknownJob
from peerd.proto.v1 import control_pb2, peer_pb2

SECRET = b"0123456789abcdef-the-unit-secret"


class Aborted(Exception):
    pass


class Context:
    """The parts of a grpc.aio servicer context the servicers touch."""

    def __init__(self, metadata=()) -> None:
        self.metadata = tuple(metadata)
        self.code: grpc.StatusCode | None = None
        self.details = ""
        self.trailing = ()

    def peer(self) -> str:
        return "ipv4:10.0.0.9:50123"

    def invocation_metadata(self):
        return self.metadata

    def set_trailing_metadata(self, metadata) -> None:
        self.trailing = metadata

    async def abort(self, code, details):
        self.code, self.details = code, details
        raise Aborted(details)


class Book:
    def __init__(self) -> None:
        self.learned: list[tuple[str, str, str]] = []
        self.pulled: list[str] = []
        self.called: list[tuple[str, int, int]] = []

    def learn_address(self, peer_id: str, address: str, via: str) -> None:
        self.learned.append((peer_id, address, via))

    def pull_soon(self, peer_id: str) -> None:
        self.pulled.append(peer_id)

    def called_by(self, peer_id: str, incarnation: int, state_version: int) -> None:
        self.called.append((peer_id, incarnation, state_version))


class Specs:
    def spec_reply(self, name: str) -> peer_pb2.JobSpecReply:
        if name != "mnist":
            raise UnknownJob(f"no job {name!r} here")
        return peer_pb2.JobSpecReply(name=name, spec_toml="[job]\n", spec_fingerprint="fp")


def peer_servicer(auth: Authenticator | None = None) -> tuple[PeerServicer, Book]:
    book = Book()
    reply = lambda relay: peer_pb2.HelloReply(peer_id="me", realm="lab")  # noqa: E731
    return PeerServicer("lab", book, reply, Specs(), auth), book


async def test_a_relaying_hello_says_who_called_at_which_start_and_gets_the_peers_records():
    book, asked = Book(), []
    reply = lambda relay: asked.append(relay) or peer_pb2.HelloReply(peer_id="me")  # noqa: E731
    servicer = PeerServicer("lab", book, reply, Specs())
    raw = hello_request("other", "10.0.0.9:7000", "lab", incarnation=5, state_version=2, relay=True)
    await servicer.Hello(raw.SerializeToString(), Context())
    assert book.called == [("other", 5, 2)] and book.pulled == [] and asked == [True]
    await servicer.Hello(hello_request("other", "10.0.0.9:7000", "lab").SerializeToString(), Context())
    assert len(book.called) == 1 and asked == [True, False]  # an older daemon's Hello: as before


async def test_peer_servicer_passes_a_hello_of_its_realm_on_and_answers_every_hello():
    servicer, book = peer_servicer()
    raw = hello_request("other", "10.0.0.9:7000", "lab", changed=True).SerializeToString()
    reply = peer_pb2.HelloReply.FromString(await servicer.Hello(raw, Context()))
    assert reply.peer_id == "me"
    assert book.learned == [("other", "10.0.0.9:7000", "hello")] and book.pulled == ["other"]

    stranger = hello_request("far", "10.0.0.8:7000", "elsewhere", changed=True).SerializeToString()
    assert peer_pb2.HelloReply.FromString(await servicer.Hello(stranger, Context())).peer_id == "me"
    assert len(book.learned) == 1 and book.pulled == ["other"]  # another realm's peer is not learned


async def test_peer_servicer_refuses_a_bad_hello_and_maps_errors_to_status_codes():
    servicer, book = peer_servicer()
    context = Context()
    with pytest.raises(Aborted):
        await servicer.Hello(hello_request("Bad Id!", "nowhere", "lab").SerializeToString(), context)
    assert context.code == grpc.StatusCode.INVALID_ARGUMENT and book.learned == []
    assert servicer.rejections.counts["bad_request"] == 1

    spec = await servicer.GetJobSpec(peer_pb2.JobSpecRequest(name="mnist").SerializeToString(), Context())
    assert peer_pb2.JobSpecReply.FromString(spec).spec_fingerprint == "fp"
    context = Context()
    with pytest.raises(Aborted):
        await servicer.GetJobSpec(peer_pb2.JobSpecRequest(name="nope").SerializeToString(), context)
    assert context.code == grpc.StatusCode.NOT_FOUND


async def test_peer_servicer_with_a_realm_secret_checks_proofs_and_proves_its_reply():
    servicer, _ = peer_servicer(Authenticator(SECRET))
    body = hello_request("other", "10.0.0.9:7000", "lab").SerializeToString()
    context = Context()
    with pytest.raises(Aborted):
        await servicer.Hello(body, context)  # no proof
    assert context.code == grpc.StatusCode.UNAUTHENTICATED

    header, mac = Authenticator(SECRET).sign(HELLO, body)
    context = Context([header])
    raw = await servicer.Hello(body, context)
    mac.update(raw)
    mac.check(metadata_value(context.trailing, REPLY_KEY))


class Api:
    """A control API that records what it was asked."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def status(self) -> control_pb2.StatusReply:
        return control_pb2.StatusReply(peer_id="me")

    def list_peers(self) -> control_pb2.ListPeersReply:
        return control_pb2.ListPeersReply(peers=[control_pb2.PeerInfo(peer_id="other")])

    def list_jobs(self) -> control_pb2.ListJobsReply:
        return control_pb2.ListJobsReply()

    async def join(self, spec_toml: str, spec_dir: str):
        self.calls.append(("join", spec_toml, spec_dir))
        return SimpleNamespace(name="mnist", fingerprint="fp")

    async def join_by_name(self, name: str, spec_dir: str = "", accept_code: str = ""):
        self.calls.append(("join_by_name", name, spec_dir, accept_code))
        return SimpleNamespace(name=name, fingerprint="fp2")

    async def leave(self, name: str, drain: bool) -> None:
        raise UnknownJob(f"no job {name!r} here")

    async def export(self, name: str, path: str) -> control_pb2.ExportReply:
        return control_pb2.ExportReply(path=path, round=3)


async def test_control_servicer_answers_from_the_control_api():
    api = Api()
    servicer = ControlServicer(api)
    assert (await servicer.Status(control_pb2.StatusRequest(), Context())).peer_id == "me"
    assert [p.peer_id for p in (await servicer.ListPeers(control_pb2.ListPeersRequest(), Context())).peers] == ["other"]
    assert not (await servicer.ListJobs(control_pb2.ListJobsRequest(), Context())).jobs
    joined = await servicer.Join(control_pb2.JoinRequest(spec_toml="t", spec_dir="/d"), Context())
    assert (joined.name, joined.spec_fingerprint) == ("mnist", "fp")
    joined = await servicer.Join(control_pb2.JoinRequest(name="charlm", spec_dir="/e", accept_code="ab"), Context())
    assert (joined.name, joined.spec_fingerprint) == ("charlm", "fp2")
    assert api.calls == [("join", "t", "/d"), ("join_by_name", "charlm", "/e", "ab")]
    exported = await servicer.Export(control_pb2.ExportRequest(name="mnist", path="/m.pt"), Context())
    assert (exported.path, exported.round) == ("/m.pt", 3)
    context = Context()
    with pytest.raises(Aborted):
        await servicer.Leave(control_pb2.LeaveRequest(name="nope"), context)
    assert context.code == grpc.StatusCode.NOT_FOUND and "nope" in context.details


async def test_supervisor_servicer_answers_a_heartbeat_with_the_view():
    def heartbeat(report: control_pb2.WorkerReport) -> control_pb2.WorkerView:
        if report.fingerprint != "fp":
            raise JobMismatch("another spec")
        return control_pb2.WorkerView(members=[report.member], settled=True)

    async def take_result(request: control_pb2.ResultRequest) -> control_pb2.ResultReply:
        if request.job != "j":
            raise UnknownJob(f"no job {request.job!r}")
        return control_pb2.ResultReply(outcome="none", detail=",".join(getattr(request, "from")))

    servicer = SupervisorServicer(heartbeat, take_result)
    view = await servicer.Heartbeat(control_pb2.WorkerReport(job="j", member="me.0", fingerprint="fp"), Context())
    assert list(view.members) == ["me.0"] and view.settled
    context = Context()
    with pytest.raises(Aborted):
        await servicer.Heartbeat(control_pb2.WorkerReport(job="j", fingerprint="old"), context)
    assert context.code == grpc.StatusCode.FAILED_PRECONDITION
    taken = await servicer.TakeResult(control_pb2.ResultRequest(job="j", **{"from": ["a", "b"]}), Context())
    assert taken.outcome == "none" and taken.detail == "a,b"
    context = Context()
    with pytest.raises(Aborted):
        await servicer.TakeResult(control_pb2.ResultRequest(job="k"), context)
    assert context.code == grpc.StatusCode.NOT_FOUND
