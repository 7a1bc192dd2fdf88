"""Daemons in one event loop: discovery through zeroconf on 127.0.0.1, Hello,
health and the control API, with no training (and no torch in the daemon)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from dataclasses import replace

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from peerd.daemon.app import Daemon
from peerd.errors import ConfigError, UnknownJob
from peerd.proto.v1 import peer_pb2, peer_pb2_grpc

from conftest import daemon_config, until


async def test_two_daemons_find_each_other_and_answer_hello_and_health(daemons, tmp_path):
    a, b = await daemons("alpha"), await daemons("beta")
    await until(lambda: a.membership.get("beta") and b.membership.get("alpha"), "alpha and beta to know each other")
    assert a.status().peers_known == 1
    assert [p.peer_id for p in b.list_peers().peers] == ["alpha"]

    async with grpc.aio.insecure_channel(a.peer_address) as channel:
        health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        reply = await peer_pb2_grpc.PeerStub(channel).Hello(peer_pb2.HelloRequest(peer_id="x"))
        assert reply.peer_id == "alpha" and not reply.jobs
    assert oct((tmp_path / "alpha.sock").stat().st_mode & 0o777) == "0o660"


async def test_daemons_of_different_realms_ignore_each_other(daemons):
    a, b = await daemons("alpha", realm="lab-a"), await daemons("beta", realm="lab-b")
    c = await daemons("gamma", realm="lab-a")
    await until(lambda: a.membership.get("gamma") and c.membership.get("alpha"), "alpha and gamma to know each other")
    await asyncio.sleep(1.0)  # several Hello rounds: beta must stay out
    assert a.membership.get("beta") is None and c.membership.get("beta") is None
    assert b.membership.peers() == []


async def test_the_same_peer_id_may_live_in_two_realms(daemons, tmp_path):
    a = await daemons("alpha", realm="lab-a")
    b = await daemons("beta", realm="lab-a")
    twin = Daemon(replace(daemon_config(tmp_path, "alpha-b", realm="lab-b"), peer_id="alpha"))
    await twin.start()  # another realm: no clash of mDNS names
    try:
        await until(lambda: a.membership.get("beta") and b.membership.get("alpha"), "alpha and beta to know each other")
        assert b.membership.get("alpha").address == a.peer_address
    finally:
        await twin.aclose()


async def test_a_stopped_daemon_leaves_the_view(daemons):
    a, b = await daemons("alpha"), await daemons("beta")
    await until(lambda: a.membership.get("beta"), "alpha to know beta")
    await b.aclose()
    # Zeroconf goodbye or the Hello timeout, whichever comes first.
    await until(lambda: a.membership.get("beta") is None, "alpha to forget beta after it left")


async def test_a_second_daemon_on_the_same_socket_is_refused(daemons, tmp_path):
    first = await daemons("alpha")
    twin = Daemon(daemon_config(tmp_path, "alpha"))
    with pytest.raises(ConfigError, match="already serving"):
        await twin.start()
    await twin.aclose()
    assert (tmp_path / "alpha.sock").exists()  # the twin left the first daemon's socket alone
    assert first.status().peer_id == "alpha"


async def test_bad_join_and_unknown_leave_are_clear_errors(daemons):
    a = await daemons("alpha")
    with pytest.raises(ConfigError, match="job.name"):
        await a.join("[job]\nmodel = 'm:f'\ndata = 'm:g'\n", "")
    with pytest.raises(UnknownJob, match="nope"):
        await a.leave("nope", drain=False)
    with pytest.raises(UnknownJob, match="peerctl jobs"):
        await a.join_by_name("nope")
    with pytest.raises(ConfigError, match="no module named 'surely_not_installed'"):
        await a.join("[job]\nname = 'x'\nmodel = 'surely_not_installed.m:f'\ndata = 'peerd.examples.mnist:g'\n", "")
    assert a.jobs == {}


def test_the_control_plane_does_not_import_torch():
    code = (
        "import sys, peerd.daemon.app, peerd.cli.daemon, peerd.cli.peerctl, peerd.control.client\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
