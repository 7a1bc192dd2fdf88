"""host = "auto" on real interfaces and routes: `peerd check-config`, and the
daemon itself, run in network namespaces this test makes.

Every link is made inside a namespace (`ip -n NS link add`), so nothing is
added to, bound on or sent from this machine's own interfaces; deleting a
namespace removes its links. Names carry the pid, so parallel runs do not meet.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from peerd.soak.netns import namespaces_unavailable

NO_NETNS = namespaces_unavailable()
pytestmark = pytest.mark.skipif(bool(NO_NETNS), reason=f"host = auto in namespaces: {NO_NETNS}")

PEERD = Path(sys.executable).with_name("peerd")
TAG = f"h{os.getpid()}"  # interface names: at most 15 characters
ENV = {k: v for k, v in os.environ.items() if not k.startswith("PEERD_")}


def ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)
    assert done.returncode == 0, f"ip {' '.join(args)}: {done.stderr.strip()}"


def existing_namespaces() -> set[str]:
    try:
        return set(os.listdir("/run/netns"))
    except FileNotFoundError:
        return set()


class Lab:
    """The namespaces of one test; close() deletes them (and so their links)."""

    def __init__(self) -> None:
        self.made: list[str] = []

    def namespace(self, suffix: str) -> str:
        name = f"pd{TAG}{suffix}"
        ip("netns", "add", name)
        self.made.append(name)
        ip("-n", name, "link", "set", "lo", "up")
        return name

    def veth(self, ns: str, name: str, address: str | None, peer_ns: str, peer: str,
             peer_address: str | None) -> None:
        """A veth pair made inside `ns`, its other end moved to `peer_ns`; both up."""
        ip("-n", ns, "link", "add", name, "type", "veth", "peer", "name", peer, "netns", peer_ns)
        for where, dev, addr in ((ns, name, address), (peer_ns, peer, peer_address)):
            if addr:
                ip("-n", where, "addr", "add", addr, "dev", dev)
            ip("-n", where, "link", "set", dev, "up")

    def close(self) -> None:
        for name in reversed(self.made):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)
        assert not existing_namespaces() & set(self.made), "a namespace outlived the test"


@pytest.fixture
def lab():
    made = Lab()
    try:
        yield made
    finally:
        made.close()


def routed(lab: Lab) -> tuple[str, str]:
    """A namespace with two addresses and a default route through the first."""
    ns = lab.namespace("r")
    lab.veth(ns, f"{TAG}r0", "10.201.0.2/24", ns, f"{TAG}r1", "10.202.0.2/24")
    ip("-n", ns, "route", "add", "default", "via", "10.201.0.1", "dev", f"{TAG}r0")
    return ns, f"{TAG}r0"


def unrouted(lab: Lab) -> tuple[str, str]:
    """Two namespaces joined by two veth pairs, no default route: `one` has
    one address (its second link has none), `two` has two."""
    one, two = lab.namespace("o"), lab.namespace("t")
    lab.veth(one, f"{TAG}o0", "10.203.0.2/24", two, f"{TAG}t0", "10.203.0.3/24")
    lab.veth(one, f"{TAG}o1", None, two, f"{TAG}t1", "10.204.0.3/24")
    return one, two


def check_config(ns: str, config: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", ns, str(PEERD), "check-config", "--config", str(config)],
                          capture_output=True, text=True, timeout=60, env=ENV)


@pytest.fixture
def auto_config(tmp_path) -> Path:
    path = tmp_path / "peerd.toml"
    path.write_text('[daemon]\nhost = "auto"\n')
    return path


def test_with_a_default_route_auto_picks_the_routes_interface_address(lab, auto_config):
    ns, dev = routed(lab)
    out = check_config(ns, auto_config)
    assert out.returncode == 0, out.stderr
    assert f"host auto: 10.201.0.2 ({dev}, the default route's interface)" in out.stdout
    assert "zeroconf speaks on 10.201.0.2 only" in out.stdout


def test_without_a_default_route_auto_picks_the_only_address(lab, auto_config):
    one, _ = unrouted(lab)
    out = check_config(one, auto_config)
    assert out.returncode == 0, out.stderr
    assert f"host auto: 10.203.0.2 ({TAG}o0, the only interface address besides loopback" in out.stdout


def test_without_a_default_route_two_addresses_fail_with_both_named(lab, auto_config):
    _, two = unrouted(lab)
    out = check_config(two, auto_config)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "valid" not in out.stdout and "Traceback" not in out.stderr
    [line] = out.stderr.strip().splitlines()
    assert line.startswith(f"peerd: {auto_config}: daemon.host = \"auto\": no default route"), line
    assert f"10.203.0.3 ({TAG}t0), 10.204.0.3 ({TAG}t1)" in line
    assert line.endswith("set daemon.host (or PEERD_HOST) to one of them"), line


def test_the_daemon_binds_and_advertises_the_picked_address(lab, tmp_path):
    ns, dev = routed(lab)
    config = tmp_path / "peerd.toml"
    config.write_text(f'[daemon]\nhost = "auto"\nstate_dir = "{tmp_path / "state"}"\n'
                      f'control_socket = "{tmp_path / "control.sock"}"\n[worker]\nstandby = false\n')
    proc = subprocess.Popen(["ip", "netns", "exec", ns, str(PEERD), "--config", str(config)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV)
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any("serving as" in line for line in lines):
            line = proc.stderr.readline()  # the daemon logs to stderr, one record a line
            if not line:
                break
            lines.append(line)
        log = "".join(lines)
        assert f"host auto: 10.201.0.2 ({dev}, the default route's interface)" in log, log
        assert "peer 10.201.0.2:" in log, log
    finally:
        proc.send_signal(signal.SIGTERM)  # `ip netns exec` execs: this is the daemon
        try:
            proc.communicate(timeout=45)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, log
