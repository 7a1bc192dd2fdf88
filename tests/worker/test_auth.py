"""Job and realm secrets (peerd.security.auth) and mutual TLS (peerd.security.tls): the pure
checks, then over real gRPC channels on 127.0.0.1."""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
import torch

from peerd.security.auth import AUTH_KEY, Authenticator, NonceCache, load_secret, new_secret_file
from peerd.daemon.app import Daemon
from peerd.daemon.services import HELLO, PeerClient
from peerd.errors import ConfigError, PeerUnavailable, Unauthenticated
from peerd.proto.v1 import peer_pb2
from peerd.security.rejections import Rejections
from peerd.security.tls import TlsSettings, handshake_refusal
from peerd.worker.wire.stores import Identity
from peerd.worker.state.pull import StateMeta
from peerd.worker.wire.server import start_exchange_server
from peerd.worker.wire.transport import FETCH_SEGMENT, GrpcTransport

from certs import make_ca, material, needs_openssl, settings
from exchange_helpers import NUMEL, SEGMENTS, Peer, two_peers

from conftest import daemon_config, until

SECRET = b"0123456789abcdef-the-job-secret"
OTHER = b"0123456789abcdef-another-secret"


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# ---- pure: sign, verify, replay window ---------------------------------------------------


def test_a_signed_request_verifies_once_and_its_reply_proof_checks():
    clock = Clock()
    client, server = Authenticator(SECRET, clock), Authenticator(SECRET, clock)
    (key, header), client_reply = client.sign("/m", b"body")
    assert key == AUTH_KEY and SECRET.decode() not in header
    server_reply = server.verify("/m", b"body", header)
    server_reply.update(b"chunk")
    client_reply.update(b"chunk")
    client_reply.check(server_reply.digest())
    with pytest.raises(Unauthenticated) as info:
        server.verify("/m", b"body", header)
    assert info.value.reason == "replayed"


@pytest.mark.parametrize("change, reason", [
    (lambda h, b, m: (h, b"other body", m), "bad_mac"),
    (lambda h, b, m: (h, b, "/other"), "bad_mac"),
    (lambda h, b, m: (None, b, m), "missing"),
    (lambda h, b, m: ("v1:x:y:z", b, m), "malformed"),
    (lambda h, b, m: (h.replace("v1:", "v2:"), b, m), "malformed"),
])
def test_a_changed_request_is_refused(change, reason):
    client, server = Authenticator(SECRET), Authenticator(SECRET)
    (_, header), _ = client.sign("/m", b"body")
    header, body, method = change(header, b"body", "/m")
    with pytest.raises(Unauthenticated) as info:
        server.verify(method, body, header)
    assert info.value.reason == reason


def test_another_secret_and_a_stale_timestamp_are_refused():
    clock = Clock()
    (_, header), _ = Authenticator(OTHER, clock).sign("/m", b"")
    with pytest.raises(Unauthenticated, match="does not match") as info:
        Authenticator(SECRET, clock).verify("/m", b"", header)
    assert info.value.reason == "bad_mac"
    (_, header), _ = Authenticator(SECRET, Clock(clock.now - 31)).sign("/m", b"")
    with pytest.raises(Unauthenticated, match="check NTP") as info:
        Authenticator(SECRET, clock).verify("/m", b"", header)
    assert info.value.reason == "stale"
    (_, header), _ = Authenticator(SECRET, Clock(clock.now + 29)).sign("/m", b"")
    Authenticator(SECRET, clock).verify("/m", b"", header)  # inside the window


def test_a_reply_without_proof_or_with_a_forged_one_is_refused():
    client, server = Authenticator(SECRET), Authenticator(SECRET)
    (_, header), reply = client.sign("/m", b"")
    expected = server.verify("/m", b"", header)
    with pytest.raises(Unauthenticated) as info:
        reply.check(None)
    assert info.value.reason == "reply_missing"
    reply.update(b"data the server never sent")
    with pytest.raises(Unauthenticated) as info:
        reply.check(expected.digest())
    assert info.value.reason == "reply_bad_mac"


def test_the_nonce_cache_is_bounded_and_never_readmits_a_dropped_nonce():
    cache = NonceCache(window_s=30, capacity=3)
    for i in range(3):
        assert cache.admit(f"n{i}", ts_ms=1000 + i, now_ms=1000 + i)
    assert not cache.admit("n1", 1001, 1003)
    assert cache.admit("n3", 1003, 1003)  # full: n0 dropped, and requests as old as it refused
    assert len(cache) == 3
    assert not cache.admit("n0", 1000, 1003)
    assert not cache.admit("fresh-but-old", 999, 1003)
    assert cache.admit("n4", 100_000, 100_000)  # the window moved on: old entries expire
    assert len(cache) == 1


def test_secret_files_are_checked(tmp_path):
    path = tmp_path / "secret"
    new_secret_file(path)
    assert len(load_secret(path)) >= 32
    with pytest.raises(ConfigError, match="cannot read"):
        load_secret(tmp_path / "absent")
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError, match="readable by every user"):
        load_secret(path)
    short = tmp_path / "short"
    short.write_text("abc\n")
    os.chmod(short, 0o600)
    with pytest.raises(ConfigError, match="holds 3 bytes"):
        load_secret(short)


# ---- the exchange over gRPC --------------------------------------------------------------


@pytest.fixture
async def serve():
    """Factory: serve a Peer's exchange with the given secret/TLS; stopped at the end."""
    servers, transports = [], []

    async def start(peer: Peer, secret: bytes | None = None, tls=None) -> str:
        auth = Authenticator(secret) if secret else None
        peer.rejections = Rejections(logging.getLogger("test"))  # what its server refused
        server, address = await start_exchange_server(
            peer.server, peer.state, "127.0.0.1", auth=auth, tls=tls, rejections=peer.rejections)
        servers.append(server)
        return address

    def client(peer_id: str, secret: bytes | None = None, tls=None) -> GrpcTransport:
        transport = GrpcTransport(Identity("job", "fp", peer_id), Authenticator(secret) if secret else None, tls)
        transports.append(transport)
        return transport

    yield start, client
    for t in transports:
        await t.aclose()
    for s in servers:
        await s.stop(grace=None)


async def _rounds(a: Peer, b: Peer, addresses, ta, tb):
    return await asyncio.gather(a.round(1, addresses, ta, 2.0), b.round(1, addresses, tb, 2.0))


async def test_peers_with_the_same_secret_average(serve):
    start, client = serve
    a, b = two_peers()
    addresses = {"a": await start(a, SECRET), "b": await start(b, SECRET)}
    expected = (a.vector + b.vector) / 2
    ta, tb = client("a", SECRET), client("b", SECRET)
    ra, rb = await _rounds(a, b, addresses, ta, tb)
    assert ra.misses == rb.misses == 0
    torch.testing.assert_close(a.vector, expected)
    torch.testing.assert_close(b.vector, expected)
    assert ta._lanes[addresses["b"]] > 0 and tb._lanes[addresses["a"]] > 0  # with proofs, over the bulk lane


@pytest.mark.parametrize("intruder_secret, reason", [(OTHER, "bad_mac"), (None, "missing")])
async def test_a_wrong_or_missing_secret_is_refused_both_ways_and_nothing_is_applied(
    serve, intruder_secret, reason
):
    start, client = serve
    a, b = two_peers()
    ta, tb = client("a", SECRET), client("b", intruder_secret)
    addresses = {"a": await start(a, SECRET), "b": await start(b, intruder_secret)}
    before_a, before_b = a.vector.clone(), b.vector.clone()
    ra, rb = await _rounds(a, b, addresses, ta, tb)
    assert ra.misses == rb.misses == SEGMENTS and not ra.reached and not rb.reached
    torch.testing.assert_close(a.vector, before_a)  # neither took the other's values
    torch.testing.assert_close(b.vector, before_b)
    assert "proof" in ra.errors["b"] and "proof" in rb.errors["a"]
    # a's server refused b's requests, and b's server (if it checks at all) refused a's.
    servicer_counts = a.rejections.counts
    assert servicer_counts[reason] == SEGMENTS
    if intruder_secret is None:  # b serves openly, but a refuses its unproven replies
        assert ta.rejections.counts["reply_missing"] == SEGMENTS


async def test_state_is_served_only_to_holders_of_the_secret(serve):
    start, client = serve
    a, _ = two_peers()
    address = await start(a, SECRET)
    await a.store.publish(1, a.vector)
    await a.board.capture([a.vector, torch.zeros(NUMEL)], StateMeta(1, 5, 0.5))
    with pytest.raises(Unauthenticated):
        await client("x", OTHER).fetch_state(address, a.layout[0], timeout=2.0)
    part = await client("y", SECRET).fetch_state(address, a.layout[0], timeout=2.0)
    torch.testing.assert_close(part.values, a.vector[: a.layout[0].size])


async def test_a_replayed_request_is_refused(serve):
    start, _ = serve
    a, _ = two_peers()
    address = await start(a, SECRET)
    await a.store.publish(1, a.vector)
    body = peer_pb2.SegmentRequest(job="job", fingerprint="fp", round=1, segment=0).SerializeToString()
    header, _ = Authenticator(SECRET).sign(FETCH_SEGMENT, body, audience=address)
    async with grpc.aio.insecure_channel(address) as channel:
        fetch = channel.unary_stream(FETCH_SEGMENT)
        first = [chunk async for chunk in fetch(body, metadata=(header,), timeout=2.0)]
        assert first  # the first copy is answered
        with pytest.raises(grpc.aio.AioRpcError) as info:
            [chunk async for chunk in fetch(body, metadata=(header,), timeout=2.0)]
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED and "replayed" in info.value.details()
    assert a.rejections.counts["replayed"] == 1


async def test_a_request_made_for_another_peer_is_refused(serve):
    """A partner that holds no secret cannot relay a caller's request to an honest
    peer and pass that peer's reply proof off with data of its own."""
    start, _ = serve
    a, _ = two_peers()
    address = await start(a, SECRET)
    await a.store.publish(1, a.vector)
    body = peer_pb2.SegmentRequest(job="job", fingerprint="fp", round=1, segment=0).SerializeToString()
    header, _ = Authenticator(SECRET).sign(FETCH_SEGMENT, body, audience="127.0.0.1:1")  # made for another
    async with grpc.aio.insecure_channel(address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            [chunk async for chunk in channel.unary_stream(FETCH_SEGMENT)(body, metadata=(header,), timeout=2.0)]
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert a.rejections.counts == {"bad_mac": 1}


# ---- mutual TLS --------------------------------------------------------------------------


@needs_openssl
async def test_mutual_tls_accepts_the_labs_ca_and_refuses_another(serve, tmp_path):
    start, client = serve
    make_ca(tmp_path, "lab")
    make_ca(tmp_path, "rogue")
    a, b = two_peers()
    address = await start(a, tls=material(tmp_path, "lab", "server"))
    await a.store.publish(1, a.vector)
    out = torch.empty(a.layout[0].size)
    lab = client("b", tls=material(tmp_path, "lab", "client"))
    await lab.fetch_segment(address, 1, 0, out, timeout=5.0)
    torch.testing.assert_close(out, a.vector[: out.numel()])
    assert lab._lanes[address] > 0  # over the bulk lane, under the same TLS
    # A client whose certificate another CA signed: the server refuses the handshake.
    out.zero_()
    with pytest.raises(PeerUnavailable, match="UNAVAILABLE"):
        await client("c", tls=material(tmp_path, "rogue", "intruder")).fetch_segment(address, 1, 0, out, 3.0)
    # No certificate at all.
    with pytest.raises(PeerUnavailable):
        await client("d").fetch_segment(address, 1, 0, out, 3.0)
    assert not out.any()
    # A server whose certificate another CA signed: the lab's client refuses it.
    rogue = Peer("r", torch.ones(NUMEL))
    rogue_address = await start(rogue, tls=material(tmp_path, "rogue", "rogue-server"))
    await rogue.store.publish(1, rogue.vector)
    with pytest.raises(PeerUnavailable):
        await client("e", tls=material(tmp_path, "lab", "client2")).fetch_segment(rogue_address, 1, 0, out, 3.0)
    assert not out.any()


# ---- daemons: realm secret and TLS on the Peer service -----------------------------------



@needs_openssl
async def test_daemons_with_the_realm_secret_and_tls_see_each_other_and_no_one_else(tmp_path):
    secret, other = tmp_path / "realm.secret", tmp_path / "other.secret"
    new_secret_file(secret)
    new_secret_file(other)
    make_ca(tmp_path, "lab")
    realm = tmp_path.name
    tls = {name: settings(tmp_path, "lab", name) for name in ("alpha", "beta", "gamma")}
    daemons = [
        Daemon(daemon_config(tmp_path, "alpha", realm, realm_secret_file=secret, tls=tls["alpha"])),
        Daemon(daemon_config(tmp_path, "beta", realm, realm_secret_file=secret, tls=tls["beta"])),
        Daemon(daemon_config(tmp_path, "gamma", realm, realm_secret_file=other, tls=tls["gamma"])),
    ]
    alpha, beta, gamma = daemons
    try:
        for d in daemons:
            await d.start()
        await until(lambda: alpha.membership.get("beta") and beta.membership.get("alpha"),
                    "alpha and beta to know each other")
        await asyncio.sleep(1.0)  # several Hello rounds: gamma, with another secret, stays out
        assert alpha.membership.get("gamma") is None and beta.membership.get("gamma") is None
        assert gamma.membership.peers() == []
        await until(lambda: gamma.peer_servicer.rejections.counts["bad_mac"] > 0, "gamma to refuse a Hello")  # it refuses their Hellos
        # A Hello with no proof over TLS: refused, and the address it offers is not learned.
        client = PeerClient(None, material(tmp_path, "lab", "outsider"))
        channel = client.channel(alpha.peer_address)
        try:
            with pytest.raises(Unauthenticated):
                await client.call(channel, HELLO, peer_pb2.HelloRequest(
                    peer_id="mallory", address="127.0.0.1:9", realm=realm), peer_pb2.HelloReply, 2.0)
        finally:
            await channel.close()
        assert "mallory" not in alpha.directory
    finally:
        for d in daemons:
            await d.aclose()


def test_a_failed_tls_handshake_is_named_and_anything_else_is_not():
    # gRPC's words when the other side's certificate is of another CA, and when a
    # peer without TLS talks to one with it.
    refused = ("127.0.0.1:40819: UNAVAILABLE: failed to connect to all addresses; last error: UNKNOWN: "
               "ipv4:127.0.0.1:40819: Tls handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: "
               "error:1000007d:SSL routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED: unable to get local "
               "issuer certificate: OK")
    assert handshake_refusal(refused) == "CERTIFICATE_VERIFY_FAILED: unable to get local issuer certificate"
    assert handshake_refusal("127.0.0.1:40819: UNAVAILABLE: failed to connect to all addresses; last error: "
                             "UNAVAILABLE: ipv4:127.0.0.1:40819: Socket closed") is None
    assert handshake_refusal("peer-1: DEADLINE_EXCEEDED: Deadline Exceeded") is None


@needs_openssl
async def test_a_daemon_of_another_ca_is_refused_with_one_peerd_line_per_peer_per_minute(tmp_path, caplog, capfd):
    make_ca(tmp_path, "lab")
    make_ca(tmp_path, "rogue")
    realm = tmp_path.name
    alpha = Daemon(daemon_config(tmp_path, "alpha", realm, tls=settings(tmp_path, "lab", "alpha")))
    delta = Daemon(daemon_config(tmp_path, "delta", realm, tls=settings(tmp_path, "rogue", "delta")))
    caplog.set_level(logging.WARNING, logger="peerd")
    try:
        await alpha.start()
        await delta.start()
        # They find each other (zeroconf on loopback) and every Hello fails the handshake.
        await until(lambda: alpha.hello.tls_refusals.counts["tls"] >= 3, "three refused Hellos from alpha")
        assert alpha.membership.get("delta") is None and delta.membership.get("alpha") is None
    finally:
        await alpha.aclose()
        await delta.aclose()
    lines = [r.getMessage() for r in caplog.records if "TLS handshake failed with delta" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "CERTIFICATE_VERIFY_FAILED" in lines[0], lines
    # gRPC's own handshake lines (one per try, not in peerd's format) stay off stderr.
    assert "ssl_transport_security" not in capfd.readouterr().err


def test_a_daemon_with_an_unreadable_secret_does_not_start(tmp_path):
    with pytest.raises(ConfigError, match="cannot read secret file"):
        Daemon(daemon_config(tmp_path, "alpha", "r", realm_secret_file=tmp_path / "absent"))
    with pytest.raises(ConfigError, match="cannot read secret file"):
        Daemon(replace(daemon_config(tmp_path, "beta", "r"), job_secret_file=tmp_path / "absent"))


# ---- settings: config tables, and what the daemon hands its worker -----------------------


def test_auth_and_tls_config_tables(tmp_path):
    from peerd.settings.config import parse_config

    source = str(tmp_path / "peerd.toml")
    config = parse_config({"auth": {"realm_secret_file": "realm.secret", "job_secret_file": "/etc/j"},
                           "tls": {"cert_file": "c.pem", "key_file": "k.pem", "ca_file": "/ca.pem"}}, source)
    assert config.realm_secret_file == tmp_path / "realm.secret"
    assert config.job_secret_file == Path("/etc/j")
    assert config.tls == TlsSettings(tmp_path / "c.pem", tmp_path / "k.pem", Path("/ca.pem"))
    with pytest.raises(ConfigError, match=r"\[tls\] needs cert_file, key_file and ca_file together; missing ca_file"):
        parse_config({"tls": {"cert_file": "c", "key_file": "k"}}, source)
    with pytest.raises(ConfigError, match=r"\[auth\] unknown key\(s\): secret"):
        parse_config({"auth": {"secret": "x"}}, source)
    with pytest.raises(ConfigError, match="auth.job_secret_file = 3: expected a file path"):
        parse_config({"auth": {"job_secret_file": 3}}, source)


@needs_openssl
def test_the_worker_gets_the_secret_path_and_tls_files_and_loads_them(tmp_path):
    from peerd.daemon.jobs import WorkerLaunch
    from peerd.worker.main import load_security, parse_args

    secret = tmp_path / "job.secret"
    new_secret_file(secret)
    make_ca(tmp_path, "lab")
    tls = replace(settings(tmp_path, "lab", "host"), server_name="peerd")
    launch = WorkerLaunch("unix:/x.sock", "p", "127.0.0.1", 1, tmp_path / "job.toml", "", tmp_path / "w.log",
                          secret_file=secret, tls=tls)
    argv = launch.argv()
    assert secret.read_text().strip() not in " ".join(argv)  # the path travels, not the secret
    security = load_security(parse_args(argv[3:]))
    assert security.auth is not None and security.tls.server_name == "peerd"
    assert security.tls.cert == tls.cert_file.read_bytes()
    assert load_security(parse_args(argv[3:13])).auth is None  # neither given: open
    with pytest.raises(ConfigError, match="go together"):
        load_security(parse_args([*argv[3:13], "--tls-cert", str(tls.cert_file)]))


def test_check_config_reads_the_secret_and_tls_files(tmp_path, capsys):
    from peerd.cli.daemon import main

    config = tmp_path / "peerd.toml"
    config.write_text('[auth]\nrealm_secret_file = "realm.secret"\n')
    assert main(["check-config", "--config", str(config)]) == 2
    assert f"cannot read secret file {tmp_path / 'realm.secret'}" in capsys.readouterr().err
    new_secret_file(tmp_path / "realm.secret")
    assert main(["check-config", "--config", str(config)]) == 0
    config.write_text('[tls]\ncert_file = "c.pem"\nkey_file = "k.pem"\nca_file = "ca.pem"\n')
    assert main(["check-config", "--config", str(config)]) == 2
    assert "cannot read the TLS certificate" in capsys.readouterr().err
