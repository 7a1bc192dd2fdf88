"""The bulk lane under mutual TLS: a real BulkServer and BulkClient on 127.0.0.1
with certificates made by openssl, the checks gRPC's channels make, and the
refusals counted and logged once per peer a minute."""

from __future__ import annotations

import asyncio
import logging
import ssl
from dataclasses import replace

import pytest
import torch

from peerd.security.auth import Authenticator
from peerd.core.segments import split_even
from peerd.errors import PeerUnavailable
from peerd.worker.wire.bulk import BulkServer
from peerd.worker.wire.bulk_client import BulkClient
from peerd.worker.wire.bulk_tls import client_context, server_context
from peerd.worker.wire.stores import Identity, SegmentServer, SnapshotStore

from bulk_helpers import NUMEL, SEGMENTS, Lane, cancel_twice_mid_segment, segment_request
from certs import make_ca, material, needs_openssl
from conftest import until

pytestmark = needs_openssl
BIG = 1_500_003  # 6 MB: a segment of 3 MB is several TLS send pieces and ~200 records
SECRET = b"bulk-lane-secret-0123456789"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """name -> TlsMaterial: "server", "client" of the lab's CA; "intruder",
    "rogue-server" of another CA."""
    directory = tmp_path_factory.mktemp("pki")
    make_ca(directory, "lab")
    make_ca(directory, "rogue")
    return {name: material(directory, ca, name) for name, ca in
            (("server", "lab"), ("client", "lab"), ("intruder", "rogue"), ("rogue-server", "rogue"))}


class TlsLane(Lane):
    """A Lane over `numel` values in `segments`, under TLS with `tls`
    (None: plain), with proofs with `auth`."""

    def __init__(self, tls, numel: int = NUMEL, segments: int = SEGMENTS, auth=None) -> None:
        super().__init__()
        self.store = SnapshotStore(numel)
        self.server = BulkServer(SegmentServer(Identity("job", "fp", "srv"), self.store, segments, 1000),
                                 auth, tls=server_context(tls) if tls is not None else None)
        self.vector = torch.randn(numel, generator=torch.Generator().manual_seed(7))
        self.layout = split_even(numel, segments)


def client_for(tls, **options) -> BulkClient:
    return BulkClient(tls=client_context(tls), **options)


class Relay:
    """A TCP relay between client and lane that keeps every byte the lane sent:
    what anyone on the path would see."""

    def __init__(self, port: int) -> None:
        self._target = port
        self.seen = bytearray()
        self._tasks: set[asyncio.Task] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._connect, "127.0.0.1", 0)
        return self._server.sockets[0].getsockname()[1]

    async def _connect(self, client_r, client_w) -> None:
        lane_r, lane_w = await asyncio.open_connection("127.0.0.1", self._target)

        async def pump(reader, writer, keep: bool) -> None:
            try:
                while data := await reader.read(1 << 16):
                    if keep:
                        self.seen += data
                    writer.write(data)
                    await writer.drain()
            finally:
                writer.close()

        await asyncio.gather(pump(client_r, lane_w, False), pump(lane_r, client_w, True), return_exceptions=True)

    async def close(self) -> None:
        self._server.close()


@pytest.mark.parametrize("tls", [True, False], ids=["tls", "plain"])
async def test_segments_cross_the_lane_intact_and_under_tls_unreadable_on_the_path(pki, tls):
    """Every segment, 3 MB each, arrives bit-exact through a relay; under TLS the
    relay never sees the values, on the plain lane it does (the test can tell)."""
    async with TlsLane(pki["server"] if tls else None, BIG, 2) as lane:
        relay = Relay(lane.port)
        port = await relay.start()
        client = client_for(pki["client"]) if tls else BulkClient()
        try:
            await lane.store.publish(1, lane.vector)
            outs = [torch.empty(span.size) for span in lane.layout]
            await asyncio.gather(*(client.fetch("127.0.0.1", port, segment_request(1, s), outs[s], 10.0)
                                   for s in range(2)))
            assert all(torch.equal(outs[s], lane.segment(s)) for s in range(2))
            probe = lane.vector[1000:1016].numpy().tobytes()  # 64 bytes of values
            assert (probe in relay.seen) is not tls
            assert len(relay.seen) >= BIG * 4
        finally:
            await client.aclose()
            await relay.close()


async def test_under_tls_the_lane_speaks_tls_1_3_with_an_aead_and_proofs_still_work(pki):
    async with TlsLane(pki["server"], auth=Authenticator(SECRET)) as lane:
        lane.server.audience = "127.0.0.1:1"
        client = client_for(pki["client"], auth=Authenticator(SECRET))
        try:
            await lane.store.publish(1, lane.vector)
            outs = [torch.empty(span.size) for span in lane.layout]
            await asyncio.gather(*(client.fetch("127.0.0.1", lane.port, segment_request(1, s), outs[s], 5.0,
                                                audience="127.0.0.1:1") for s in range(SEGMENTS)))
            assert all(torch.equal(outs[s], lane.segment(s)) for s in range(SEGMENTS))
            sock = next(iter(client._pipes.values()))._sender.sock
            assert sock.version() == "TLSv1.3"
            assert sock.cipher()[0] in ("TLS_AES_256_GCM_SHA384", "TLS_AES_128_GCM_SHA256")
            assert lane.connections() == 1 and not lane.server.tls_refusals.counts
        finally:
            await client.aclose()


def _no_certificate(pki) -> ssl.SSLContext:
    """A client that trusts the lab's CA but shows no certificate of its own."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cadata=pki["client"].ca.decode())
    return context


# The intruders trust the lab's CA (its certificate is no secret): the lane refuses them,
# not they the lane.
@pytest.mark.parametrize("who, reason", [
    ("another CA", "CERTIFICATE_VERIFY_FAILED: unable to get local issuer certificate"),
    ("no certificate", "PEER_DID_NOT_RETURN_A_CERTIFICATE"),
    ("no TLS", "WRONG_VERSION_NUMBER"),
])
async def test_a_client_without_a_certificate_of_the_lab_is_refused_and_logged_once(pki, caplog, who, reason):
    caplog.set_level(logging.WARNING, logger="peerd.worker")
    async with TlsLane(pki["server"]) as lane:
        await lane.store.publish(1, lane.vector)
        out = torch.full((lane.layout[0].size,), -1.0)
        for _ in range(2):  # twice: counted twice, logged once
            client = {"another CA": lambda: client_for(replace(pki["intruder"], ca=pki["client"].ca)),
                      "no certificate": lambda: BulkClient(tls=_no_certificate(pki)),
                      "no TLS": BulkClient}[who]()
            try:
                with pytest.raises(PeerUnavailable):
                    await client.fetch("127.0.0.1", lane.port, segment_request(1, 0), out, 3.0)
            finally:
                await client.aclose()
        assert bool((out == -1.0).all())
        refusals = lane.server.tls_refusals
        await until(lambda: refusals.counts["tls"] >= 2, "the lane to refuse both handshakes")
        assert refusals.counts == {"tls": 2}
    server_line = "TLS handshake failed on the bulk lane with 127.0.0.1 (tls): "
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(server_line)]
    assert len(lines) == 1, lines
    assert lines[0].startswith(server_line + reason), lines


@pytest.mark.parametrize("server, name, refused", [
    ("rogue-server", "", "CERTIFICATE_VERIFY_FAILED: self-signed certificate in certificate chain"),
    ("server", "not-peerd", "CERTIFICATE_VERIFY_FAILED: Hostname mismatch"),
    ("server", "peerd", None),
])
async def test_the_client_checks_the_lanes_certificate_as_grpc_does(pki, caplog, server, name, refused):
    """Of the lab's CA, and for the address dialled or [tls] server_name."""
    caplog.set_level(logging.WARNING, logger="peerd.worker")
    async with TlsLane(pki[server]) as lane:
        await lane.store.publish(1, lane.vector)
        out = torch.full((lane.layout[0].size,), -1.0)
        client = client_for(pki["client"], server_name=name)
        try:
            if refused is None:
                await client.fetch("127.0.0.1", lane.port, segment_request(1, 0), out, 3.0)
                assert torch.equal(out, lane.segment(0))
                return
            with pytest.raises(PeerUnavailable, match="TLS handshake failed"):
                await client.fetch("127.0.0.1", lane.port, segment_request(1, 0), out, 3.0)
            assert bool((out == -1.0).all())
            assert client.tls_refusals.counts == {"tls": 1}
            line, = [r.getMessage() for r in caplog.records if "TLS handshake failed" in r.getMessage()]
            assert line.startswith(f"TLS handshake failed on the bulk lane with 127.0.0.1:{lane.port} (tls): {refused}")
        finally:
            await client.aclose()


async def test_a_refused_handshake_is_counted_once_however_many_fetches_waited_for_it(pki):
    # Fetches of one partner and stage share one connection: when its handshake
    # fails, that is one refusal, as the lane's own count has it.
    async with TlsLane(pki["rogue-server"]) as lane:
        await lane.store.publish(1, lane.vector)
        client = client_for(pki["client"])
        try:
            outs = [torch.empty(lane.layout[s].size) for s in range(4)]
            results = await asyncio.gather(*(client.fetch("127.0.0.1", lane.port, segment_request(1, s), outs[s], 3.0)
                                             for s in range(4)), return_exceptions=True)
            assert all(isinstance(r, PeerUnavailable) for r in results), results
            assert client.tls_refusals.counts == {"tls": 1}
        finally:
            await client.aclose()


# ---- the pipe under TLS: its reader thread sends the requests ------------------------------


async def test_under_tls_requests_queued_behind_a_waiting_one_all_arrive_on_one_connection(pki):
    async with TlsLane(pki["server"]) as lane:
        client = client_for(pki["client"])
        try:
            outs = [torch.empty(span.size) for span in lane.layout]
            fetches = asyncio.gather(*(client.fetch("127.0.0.1", lane.port, segment_request(1, s), outs[s], 5.0)
                                       for s in range(SEGMENTS)))
            await asyncio.sleep(0.2)
            assert not fetches.done()  # round 1 is not published yet: all wait on the lane
            await lane.store.publish(1, lane.vector)
            await fetches
            assert all(torch.equal(outs[s], lane.segment(s)) for s in range(SEGMENTS))
            assert lane.connections() == 1
        finally:
            await client.aclose()


async def test_under_tls_a_deadline_fails_the_pipe_and_the_next_fetch_reconnects(pki):
    async with TlsLane(pki["server"]) as lane:
        client = client_for(pki["client"])
        try:
            outs = [torch.full((span.size,), -1.0) for span in lane.layout]
            results = await asyncio.gather(
                *(client.fetch("127.0.0.1", lane.port, segment_request(1, s), outs[s], 0.3) for s in range(3)),
                return_exceptions=True)
            assert all(isinstance(r, PeerUnavailable) for r in results), results
            await lane.store.publish(1, lane.vector)
            await asyncio.sleep(0.2)
            assert all(bool((out == -1.0).all()) for out in outs)  # nothing written after the failure
            await client.fetch("127.0.0.1", lane.port, segment_request(1, 4), outs[4], 5.0)
            assert torch.equal(outs[4], lane.segment(4))
        finally:
            await client.aclose()


async def test_under_tls_a_fetch_cancelled_mid_segment_stops_its_reader_before_returning(pki):
    big = 8_000_000  # 32 MB: still arriving when the cancellations come
    async with TlsLane(pki["server"], big, 1) as lane:
        client = client_for(pki["client"])
        try:
            await lane.store.publish(1, torch.ones(big))
            await cancel_twice_mid_segment(client, lane.port, big, times=3)
        finally:
            await client.aclose()
