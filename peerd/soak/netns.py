"""The soak's network: one namespace per peer on a bridge in a namespace of its own.

    ns psk<tag>b:  bridge br0 ── port sk<tag>bN ═╗ (veth pair)
    ns psk<tag>N:  sk<tag>pN  10.99.0.(N+10)/24 ═╝  egress shaped by tc tbf

Every name carries the run's tag, so teardown removes exactly what this run
made and nothing of the host's (no host interface is touched). `Loopback` is the
fallback without root: every peer on 127.0.0.1, no shaping, no partitions.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass

from peerd.errors import PeerdError

IP_TIMEOUT_S = 10.0
MAX_PEERS = 240


class Unsupported(PeerdError):
    """The event needs something this run lacks (namespaces, a slowdown setting)."""


@dataclass(frozen=True)
class PeerNet:
    index: int
    address: str
    namespace: str = ""  # "" on loopback
    veth: str = ""  # the peer's end, in its namespace
    port: str = ""  # the bridge's end

    def command(self, argv: list[str]) -> list[str]:
        """argv run inside the peer's namespace (`ip netns exec` execs it: same PID)."""
        return ["ip", "netns", "exec", self.namespace, *argv] if self.namespace else argv


_MADE_HERE: set[str] = set()  # namespaces this process added and has not deleted


def made_here() -> set[str]:
    """The network namespaces this process made that still exist (a leak check's
    view: the namespace list is machine-wide, other processes' are not ours)."""
    try:
        existing = set(os.listdir("/run/netns"))
    except FileNotFoundError:
        existing = set()
    return _MADE_HERE & existing


def _ip(*args: str, timeout: float = IP_TIMEOUT_S) -> str:
    try:
        done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise PeerdError(f"`ip {' '.join(args)}` did not finish in {timeout:.0f}s") from None
    if done.returncode != 0:
        raise PeerdError(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")
    if args[:2] == ("netns", "add"):
        _MADE_HERE.add(args[2])
    elif args[:2] == ("netns", "del"):
        _MADE_HERE.discard(args[2])
    return done.stdout


def namespaces_unavailable() -> str:
    """Why this run cannot use network namespaces; "" when it can."""
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "the `ip` and `tc` commands (iproute2) are missing"
    probe = f"psk{os.getpid() % 100000}probe"
    try:
        _ip("netns", "add", probe)
        _ip("netns", "del", probe)
    except PeerdError as exc:
        return f"cannot create a network namespace: {exc}"
    return ""


def _tbf(tc: list[str], dev: str, rate_mbit: float) -> None:
    # burst ≥ rate/HZ-ish and ≥ one MTU, queue ≤ 200 ms.
    burst = max(16 * 1024, int(rate_mbit * 1e6 / 8 / 100))
    command = [*tc, "qdisc", "replace", "dev", dev, "root", "tbf",
               "rate", f"{rate_mbit}mbit", "burst", str(burst), "latency", "200ms"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=IP_TIMEOUT_S)
    if done.returncode != 0:
        raise PeerdError(f"tc tbf on {dev} failed: {done.stderr.strip()}")


class Namespaces:
    """Bridge, namespaces, veth pairs and tbf caps of one run; `close()` removes them all."""

    shaped = True
    partitions = True

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.bridge_ns = f"psk{tag}b"
        self.peers: dict[int, PeerNet] = {}
        self._made: list[str] = []

    def open(self) -> None:
        self._add_ns(self.bridge_ns)
        _ip("-n", self.bridge_ns, "link", "add", "br0", "type", "bridge")
        # No multicast snooping: mDNS floods to every port like on a plain switch.
        _ip("-n", self.bridge_ns, "link", "set", "br0", "type", "bridge", "mcast_snooping", "0")
        _ip("-n", self.bridge_ns, "link", "set", "br0", "up")

    def _add_ns(self, name: str) -> None:
        _ip("netns", "add", name)
        self._made.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def add_peer(self, index: int, rate_mbit: float) -> PeerNet:
        if not 0 <= index < MAX_PEERS:
            raise PeerdError(f"at most {MAX_PEERS} peers on one soak bridge")
        ns, veth, port = f"psk{self.tag}p{index}", f"sk{self.tag}p{index}", f"sk{self.tag}b{index}"
        self._add_ns(ns)
        _ip("link", "add", veth, "netns", ns, "type", "veth", "peer", "name", port, "netns", self.bridge_ns)
        _ip("-n", self.bridge_ns, "link", "set", port, "master", "br0")
        _ip("-n", self.bridge_ns, "link", "set", port, "up")
        address = f"10.99.0.{index + 10}"
        _ip("-n", ns, "addr", "add", f"{address}/24", "dev", veth)
        _ip("-n", ns, "link", "set", veth, "up")
        peer = PeerNet(index, address, ns, veth, port)
        self.peers[index] = peer
        if rate_mbit > 0:
            self.shape(index, rate_mbit)
        return peer

    def shape(self, index: int, rate_mbit: float, both_ways: bool = False) -> None:
        """Cap what peer `index` sends to rate_mbit (tc tbf on its veth, replacing
        any cap before); `both_ways`: what it receives too (on its bridge port)."""
        peer = self.peers[index]
        _tbf(peer.command(["tc"]), peer.veth, rate_mbit)
        if both_ways:
            _tbf(["ip", "netns", "exec", self.bridge_ns, "tc"], peer.port, rate_mbit)

    def set_link(self, index: int, up: bool) -> None:
        """Partition (down) or heal (up) a peer: its bridge port, like a pulled cable."""
        _ip("-n", self.bridge_ns, "link", "set", self.peers[index].port, "up" if up else "down")

    def counters(self) -> dict[int, tuple[int, int]]:
        """Peer index -> (bytes sent, bytes received), read at the bridge ports."""
        try:
            links = json.loads(_ip("-n", self.bridge_ns, "-j", "-s", "link", "show"))
        except (PeerdError, ValueError):
            return {}
        by_port = {p.port: i for i, p in self.peers.items()}
        out = {}
        for link in links:
            index = by_port.get(link.get("ifname"))
            stats = link.get("stats64") or link.get("stats") or {}
            if index is not None and stats:
                # What the bridge port receives is what the peer sent.
                out[index] = (stats["rx"]["bytes"], stats["tx"]["bytes"])
        return out

    def multicast_crosses(self, a: int, b: int, timeout_s: float = 5.0) -> bool:
        """Does a multicast datagram sent in peer a's namespace reach peer b's?"""
        probe = [sys.executable, "-m", "peerd.soak.mcast"]
        recv = [*probe, "recv", self.peers[b].address, str(timeout_s)]
        send = [*probe, "send", self.peers[a].address, str(timeout_s)]
        listener = subprocess.Popen(self.peers[b].command(recv),
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            time.sleep(0.3)
            sender = subprocess.Popen(self.peers[a].command(send),
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                out, _ = listener.communicate(timeout=timeout_s + 2)
            except subprocess.TimeoutExpired:
                out = ""
            sender.kill()
            sender.wait()
            return out.strip() == "ok"
        finally:
            if listener.poll() is None:
                listener.kill()
                listener.wait()

    def close(self) -> list[str]:
        """Delete every namespace this run made (their veths and the bridge go with them)."""
        errors = []
        for name in reversed(self._made):
            try:
                _ip("netns", "del", name)
            except PeerdError as exc:
                errors.append(str(exc))
        self._made.clear()
        self.peers.clear()
        return errors


class Loopback:
    """Fallback: every peer on 127.0.0.1; no bandwidth caps, no partitions."""

    shaped = False
    partitions = False

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.peers: dict[int, PeerNet] = {}

    def open(self) -> None:
        pass

    def add_peer(self, index: int, rate_mbit: float) -> PeerNet:
        self.peers[index] = PeerNet(index, "127.0.0.1")
        return self.peers[index]

    def set_link(self, index: int, up: bool) -> None:
        raise Unsupported("partitions need network namespaces (this run is on 127.0.0.1)")

    def counters(self) -> dict[int, tuple[int, int]]:
        return {}

    def multicast_crosses(self, a: int, b: int, timeout_s: float = 5.0) -> bool:
        return True

    def close(self) -> list[str]:
        self.peers.clear()
        return []
