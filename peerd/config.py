"""Daemon settings (/etc/peerd/peerd.toml), parsed once into a frozen DaemonConfig."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

from peerd.errors import ConfigError
from peerd.tomlconf import Table, read_toml_file

DEFAULT_PATH = Path("/etc/peerd/peerd.toml")


@dataclass(frozen=True)
class DaemonConfig:
    state_dir: Path = Path("/var/lib/peerd")
    control_socket: Path = Path("/run/peerd/control.sock")
    peer_id: str = ""  # empty: made once and kept in state_dir/peer_id
    host: str = "127.0.0.1"  # address the peer and exchange services bind to and advertise
    peer_port: int = 0  # 0: any free port
    locality: str = ""  # rack/subnet label for hierarchical grouping
    realm: str = "default"  # only daemons of the same realm see each other
    interfaces: tuple[str, ...] = ("127.0.0.1",)  # where zeroconf speaks; ("all",) for every interface
    hello_interval_s: float = 1.0
    peer_timeout_s: float = 6.0
    worker_threads: int = 1
    restart_backoff_s: float = 1.0
    restart_backoff_max_s: float = 30.0
    slowdown: float = 1.0  # testing only: workers sleep (slowdown − 1) × each step's compute time


def parse_config(data: dict, source: str) -> DaemonConfig:
    root = Table(data, source, "")
    daemon, discovery, worker = root.sub("daemon"), root.sub("discovery"), root.sub("worker")
    d = DaemonConfig()
    positive = dict(check=lambda v: v > 0, expect="a number > 0")
    config = DaemonConfig(
        state_dir=Path(daemon.get("state_dir", str, str(d.state_dir))),
        control_socket=Path(daemon.get("control_socket", str, str(d.control_socket))),
        peer_id=daemon.get("peer_id", str, "", check=_valid_peer_id, expect="1-63 letters, digits or '-'"),
        host=daemon.get("host", str, d.host, check=_is_ip, expect="an IP address"),
        peer_port=daemon.get("peer_port", int, 0, check=lambda v: 0 <= v < 65536, expect="a port 0..65535"),
        locality=daemon.get("locality", str, ""),
        realm=discovery.get("realm", str, d.realm, check=lambda v: 0 < len(v) <= 63 and v.isprintable(),
                            expect="1-63 printable characters"),
        interfaces=tuple(discovery.get("interfaces", list, list(d.interfaces),
                                       check=lambda v: v and all(isinstance(x, str) and (x == "all" or _is_ip(x)) for x in v),
                                       expect='a list of IP addresses, or ["all"]')),
        hello_interval_s=discovery.get("hello_interval_s", float, d.hello_interval_s, **positive),
        peer_timeout_s=discovery.get("peer_timeout_s", float, d.peer_timeout_s, **positive),
        worker_threads=worker.get("threads", int, 1, check=lambda v: 1 <= v <= 256, expect="an integer 1..256"),
        restart_backoff_s=worker.get("restart_backoff_s", float, d.restart_backoff_s, **positive),
        restart_backoff_max_s=worker.get("restart_backoff_max_s", float, d.restart_backoff_max_s, **positive),
        slowdown=worker.get("slowdown", float, 1.0, check=lambda v: 1 <= v <= 1000,
                            expect="a number in 1..1000 (a testing knob: 1 is full speed)"),
    )
    for table in (daemon, discovery, worker, root):
        table.finish()
    if config.restart_backoff_s > config.restart_backoff_max_s:
        raise ConfigError(f"{source}: worker.restart_backoff_s must not exceed worker.restart_backoff_max_s")
    if config.peer_timeout_s <= 2 * config.hello_interval_s:
        raise ConfigError(f"{source}: discovery.peer_timeout_s must exceed 2 × hello_interval_s")
    return config


def load_config(path: Path | None) -> DaemonConfig:
    """Settings from `path`; defaults when path is None and the default file is absent."""
    if path is None:
        if not DEFAULT_PATH.exists():
            return DaemonConfig()
        path = DEFAULT_PATH
    return parse_config(read_toml_file(path), str(path))


def _is_ip(value: str) -> bool:
    if not isinstance(value, str):
        return False  # ip_address() would take an integer
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def _valid_peer_id(value: str) -> bool:
    return value == "" or (len(value) <= 63 and all(c.isalnum() or c == "-" for c in value))
