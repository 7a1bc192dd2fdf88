"""Daemons in one event loop, no training: discovery through seeds (with and
without zeroconf), the metrics endpoint, the control socket's group, and
peerctl's error for a socket it may not use."""

from __future__ import annotations

import asyncio
import grp
import os
import socket
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from peerd.daemon.app import Daemon, _give_to_group

from conftest import daemon_config, free_port, until


async def test_without_zeroconf_daemons_find_each_other_through_seeds_and_pass_peers_on(daemons):
    hub = await daemons("hub", zeroconf=False)
    # Each of the others knows only the hub; they learn of each other from its Hello replies.
    a = await daemons("alpha", zeroconf=False, seeds=(hub.peer_address,))
    b = await daemons("beta", zeroconf=False, seeds=(hub.peer_address,))
    await until(lambda: all(d.membership.get(o) for d, others in
                            ((hub, ("alpha", "beta")), (a, ("hub", "beta")), (b, ("hub", "alpha")))
                            for o in others), "every daemon to know the other two through the seed")
    assert a.membership.get("beta").address == b.peer_address
    assert [p.state for p in a.list_peers().peers] == ["alive", "alive"]


async def test_seeds_and_zeroconf_together(daemons):
    # alpha and beta see each other by zeroconf; gamma (no mDNS) only has alpha as a seed.
    a = await daemons("alpha")
    b = await daemons("beta")
    c = await daemons("gamma", zeroconf=False, seeds=(a.peer_address,))
    await until(lambda: c.membership.get("alpha") and c.membership.get("beta") and b.membership.get("gamma"), "gamma to be known through the seeds")


async def test_a_seed_of_another_realm_is_ignored(daemons):
    other = await daemons("other", zeroconf=False, realm="elsewhere")
    a = await daemons("alpha", zeroconf=False, seeds=(other.peer_address,))
    await asyncio.sleep(1.0)  # several Hello rounds
    assert a.membership.peers() == [] and other.membership.peers() == []


async def test_a_peer_heard_of_that_goes_silent_is_forgotten(daemons):
    hub = await daemons("hub", zeroconf=False)
    a = await daemons("alpha", zeroconf=False, seeds=(hub.peer_address,))
    b = await daemons("beta", zeroconf=False, seeds=(hub.peer_address,))
    await until(lambda: a.membership.get("beta"), "alpha to know beta")
    await b.aclose()
    await until(lambda: a.membership.get("beta") is None and "beta" not in a.directory, "alpha to forget beta and its address")
    assert a.membership.get("hub")  # the seed stays


async def test_metrics_endpoint_is_served_and_follows_the_view(daemons):
    port = free_port()
    a = await daemons("alpha", zeroconf=False, metrics_port=port)

    async def scrape(path: str = "/metrics") -> tuple[str, str]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        data = await reader.read()
        writer.close()
        head, _, body = data.decode().partition("\r\n\r\n")
        return head.split("\r\n")[0], body

    def value(body: str, name: str) -> float:
        return next(s.value for f in text_string_to_metric_families(body) for s in f.samples if s.name == name)

    status, body = await scrape()
    assert status == "HTTP/1.0 200 OK"
    assert value(body, "peerd_peers_known") == 0
    assert any(f.name == "process_cpu_seconds" for f in text_string_to_metric_families(body))
    await daemons("beta", zeroconf=False, seeds=(a.peer_address,))
    await until(lambda: a.membership.get("beta"), "alpha to know beta")
    _, body = await scrape()
    assert value(body, "peerd_peers_known") == 1
    assert 0 < value(body, "peerd_hellos_sent_total") <= a.hello.round_hellos  # counted on: Hellos go on
    assert 0 < value(body, "peerd_hellos_received_total") <= a.peer_servicer.hellos
    assert value(body, "peerd_relaying") == 0
    assert (await scrape("/other"))[0] == "HTTP/1.0 404 Not Found"


def test_the_control_socket_is_given_to_the_group(tmp_path):
    path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        group = grp.getgrgid(1).gr_name  # an existing group other than ours (root's 0)
        _give_to_group(path, group)
        assert path.stat().st_gid == 1
        _give_to_group(path, "surely-no-such-group")  # absent: left as it is, logged
        assert path.stat().st_gid == 1


def _as_nobody(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, *args],
        capture_output=True, text=True, timeout=60, env={**os.environ, "HOME": "/"},
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run peerctl as another user")
def test_peerctl_says_permission_denied_for_a_socket_it_may_not_use():
    if _as_nobody("-c", "import peerd.cli.peerctl").returncode != 0:
        pytest.skip("user nobody cannot read this checkout or its .venv (e.g. under a 0700 directory)")
    tmp = Path(tempfile.mkdtemp(prefix="peerd-perm-"))
    try:
        tmp.chmod(0o755)
        path = tmp / "control.sock"
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(path))
            s.listen()
            path.chmod(0o660)  # root's group: nobody is not in it
            out = _as_nobody("-m", "peerd.cli.peerctl", "--socket", str(path), "status")
        assert out.returncode == 1, out.stderr
        assert f"permission denied on {path}" in out.stderr
        assert "group" in out.stderr and "Traceback" not in out.stderr
        assert stat.S_IMODE(path.stat().st_mode) == 0o660
    finally:
        for p in tmp.iterdir():
            p.unlink()
        tmp.rmdir()


async def test_systemd_hears_ready_status_and_stopping_in_order(tmp_path, monkeypatch):
    path = tempfile.mktemp(prefix="peerd-notify-", dir="/tmp")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        sock.setblocking(False)
        monkeypatch.setenv("NOTIFY_SOCKET", path)
        daemon = Daemon(daemon_config(tmp_path, "alpha", f"notify-{tmp_path.name}", zeroconf=False))
        await daemon.start()
        await asyncio.sleep(0.5)  # a Hello round or two
        await daemon.aclose()
        messages = []
        while True:
            try:
                messages.append(sock.recv(4096).decode())
            except BlockingIOError:
                break
    os.unlink(path)
    ready = next(i for i, m in enumerate(messages) if "READY=1" in m)
    stopping = next(i for i, m in enumerate(messages) if "STOPPING=1" in m)
    assert ready < stopping
    assert "STATUS=serving as alpha" in messages[ready]
    assert any("STATUS=serving as alpha" in m and "0 peers; jobs: none" in m for m in messages[ready:stopping])


async def test_a_worker_that_starts_or_stops_serving_reaches_the_others_before_the_interval(daemons, tmp_path):
    """Hello is pull-based: the others learn a daemon's jobs when they ask it.
    When one of its workers starts or stops serving (a join, a drained leave),
    the daemon Hellos everyone at once with `changed`, and they ask it back
    at once. With a 60 s interval, the others can only have learnt it that way."""
    from peerd.daemon.jobs import LocalJob, RestartPolicy, WorkerLaunch
    from peerd.settings.jobspec import parse_job
    from peerd.proto.v1 import control_pb2

    from conftest import example_job

    slow = dict(zeroconf=False, hello_interval_s=60.0, peer_timeout_s=130.0)
    b = await daemons("beta", **slow)
    a = await daemons("alpha", seeds=(b.peer_address,), **slow)
    await until(lambda: "alpha" in b.directory, "beta to learn alpha's address")  # from a's first Hello; b asks a again in 60 s
    spec = parse_job(example_job(job={"name": "pushed"}), "test")
    launch = WorkerLaunch("unix:/nowhere", "alpha", "127.0.0.1", 1, tmp_path / "job.toml", "", tmp_path / "w.log")
    a.jobs[spec.name] = LocalJob.create(spec, tmp_path, [launch], RestartPolicy(1.0, 1.0))  # supervised by nobody: reports only

    def report(address: str) -> None:
        a.worker_heartbeat(control_pb2.WorkerReport(job=spec.name, pid=1, address=address, fingerprint="f"))

    report("127.0.0.1:9")
    await until(lambda: b.membership.job_view(spec.name, spec.fingerprint) == [("alpha", "127.0.0.1:9")],
                "beta to see alpha serving the job")
    report("")  # leaving: no longer serving
    await until(lambda: b.membership.job_view(spec.name, spec.fingerprint) == [],
                "beta to see alpha no longer serving")
    assert b.membership.job_members(spec.name, spec.fingerprint) == ["alpha"]  # still a member, not serving
