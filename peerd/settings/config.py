"""Daemon settings (/etc/peerd/peerd.toml), parsed once into a frozen DaemonConfig."""

from __future__ import annotations

import ipaddress
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from peerd.core.availability import MODES, Settings as Availability
from peerd.core.hostpick import AUTO, HostPick, NoHostPick, pick_host
from peerd.core.names import PEER_ID_RULE, valid_address, valid_peer_id
from peerd.core.slowdown import CLOCKS
from peerd.core.windows import WINDOW_RULE, parse_window
from peerd.errors import ConfigError
from peerd.security.tls import TlsSettings
from peerd.settings.tomlconf import Table, read_toml_file

DEFAULT_PATH = Path("/etc/peerd/peerd.toml")
LOG_FORMATS = ("text", "json")
# Per-machine settings an operator may set in the environment instead of the
# file (e.g. in /etc/peerd/peerd.env, read by the systemd unit). They win over
# the file. PEERD_CONFIG names the file itself (peerd.cli.daemon).
ENV_OVERRIDES = {
    "PEERD_PEER_ID": ("daemon", "peer_id", str),
    "PEERD_HOST": ("daemon", "host", str),
    "PEERD_LOCALITY": ("daemon", "locality", str),
    "PEERD_METRICS_PORT": ("metrics", "port", int),
    "PEERD_SEEDS": ("discovery", "seeds", list),  # comma-separated host:port
    "PEERD_DATA_ROOT": ("data", "root", str),
}
_DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d{1,3})?")
_LISTED_DEVICE = re.compile(r"cpu|mps|cuda(:\d{1,3})?")
MAX_WORKERS = 64
# [worker] devices = "auto": one worker per local GPU, counted when the daemon
# starts (peerd.daemon.devices), one "auto" worker when there is none.
EVERY_GPU: tuple[str, ...] = ()


@dataclass(frozen=True)
class DaemonConfig:
    state_dir: Path = Path("/var/lib/peerd")
    control_socket: Path = Path("/run/peerd/control.sock")
    peer_id: str = ""  # empty: made once and kept in state_dir/peer_id
    # Address the peer and exchange services bind to and advertise; AUTO: picked
    # when the daemon starts (resolve_host).
    host: str = "127.0.0.1"
    peer_port: int = 0  # 0: any free port
    locality: str = ""  # rack/subnet label for hierarchical grouping
    realm: str = "default"  # only daemons of the same realm see each other
    # Where zeroconf speaks; ("all",) for every interface. (AUTO,): the address
    # host = "auto" picks, which is the default with it.
    interfaces: tuple[str, ...] = ("127.0.0.1",)
    hello_interval_s: float = 1.0
    peer_timeout_s: float = 6.0
    # A realm of at most full_mesh_max daemons: a Hello to every peer each interval;
    # larger: to `fanout` random peers, whose replies relay the others' records (peerd.core.relay).
    full_mesh_max: int = 8
    fanout: int = 3
    worker_threads: int = 1  # torch threads per job on this daemon, split among its workers
    # One worker per entry, each a torch device; "auto": cuda if present, else cpu.
    # EVERY_GPU: one per local GPU.
    worker_devices: tuple[str, ...] = ("auto",)
    worker_standby: bool = True  # keep a worker process with torch imported, ready for the next join
    restart_backoff_s: float = 1.0
    restart_backoff_max_s: float = 30.0
    # A worker's max_crashes-th crash within crash_window_s seconds is not restarted:
    # the job fails on this peer (peerd.core.restarts). 0: restart every crash.
    max_crashes: int = 5
    crash_window_s: float = 600.0
    # Security (docs/operations.md). Without secrets the services are open to the LAN.
    realm_secret_file: Path | None = None  # proof of it on every daemon-to-daemon call
    job_secret_file: Path | None = None  # jobs whose spec names no secret_file, or (joined by name) one not here
    tls: TlsSettings | None = None  # mutual TLS for every connection between machines
    slowdown: float = 1.0  # testing only: workers sleep (slowdown − 1) × each step's time ...
    slowdown_clock: str = "wall"  # ... its wall time, or "cpu": its CPU time (peerd.core.slowdown)
    step_overhead_s: float = 0.0  # testing only: workers sleep this long after every step, whatever its batch
    stop_timeout_s: float = 30.0  # SIGTERM/SIGINT: the whole ordered shutdown takes at most this
    zeroconf: bool = True  # announce and browse with mDNS
    seeds: tuple[str, ...] = ()  # host:port of Peer services to Hello, for peers beyond this subnet
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 0  # Prometheus endpoint; 0: off
    log_format: str = "text"  # "text" (logfmt-like) or "json", one record per line
    # Where this machine's own data sets are: jobs with data_mode = "local" read
    # theirs under it (a job's [data] root overrides it). None: no local data here.
    data_root: Path | None = None
    # TensorBoard event files of every job's workers, DIR/JOB/MEMBER (a job's own
    # [log] tensorboard wins); None: none written.
    tensorboard: Path | None = None
    # [availability]: whether this machine trains only while its owner leaves it free
    # (peerd.core.availability; docs/operations.md, "Shared machines").
    availability: Availability = Availability()


def parse_config(data: dict, source: str) -> DaemonConfig:
    root = Table(data, source, "")
    daemon, discovery, worker = root.sub("daemon"), root.sub("discovery"), root.sub("worker")
    auth, tls = root.sub("auth"), root.sub("tls")
    metrics, logging_, data = root.sub("metrics"), root.sub("log"), root.sub("data")
    availability = root.sub("availability")
    d = DaemonConfig()
    host = daemon.get("host", str, d.host, check=lambda v: v == AUTO or _is_ip(v),
                      expect='an IP address, or "auto" (picked when the daemon starts)')
    config = DaemonConfig(
        state_dir=Path(daemon.get("state_dir", str, str(d.state_dir))),
        control_socket=Path(daemon.get("control_socket", str, str(d.control_socket))),
        peer_id=daemon.get("peer_id", str, "", check=lambda v: v == "" or valid_peer_id(v),
                             expect=PEER_ID_RULE),
        host=host,
        peer_port=daemon.get("peer_port", int, 0, check=lambda v: 0 <= v < 65536, expect="a port 0..65535"),
        locality=daemon.get("locality", str, ""),
        stop_timeout_s=daemon.get("stop_timeout_s", float, d.stop_timeout_s, **_POSITIVE),
        **_discovery(discovery, d, host),
        **_worker(worker, d, source),
        realm_secret_file=_path(auth, "realm_secret_file", source),
        job_secret_file=_path(auth, "job_secret_file", source),
        tls=_tls(tls, source),
        metrics_host=metrics.get("host", str, d.metrics_host, check=_is_ip, expect="an IP address"),
        metrics_port=metrics.get("port", int, 0, check=lambda v: 0 <= v < 65536, expect="a port 0..65535 (0: off)"),
        log_format=logging_.get("format", str, "text", check=lambda v: v in LOG_FORMATS,
                                expect="'text' or 'json'"),
        data_root=_path(data, "root", source, "a directory holding this machine's data sets"),
        tensorboard=_path(logging_, "tensorboard", source, "a directory for TensorBoard's event files"),
        availability=_availability(availability),
    )
    for table in (daemon, discovery, worker, auth, tls, metrics, logging_, data, availability, root):
        table.finish()
    if config.restart_backoff_s > config.restart_backoff_max_s:
        raise ConfigError(f"{source}: worker.restart_backoff_s must not exceed worker.restart_backoff_max_s")
    if config.peer_timeout_s <= 2 * config.hello_interval_s:
        raise ConfigError(f"{source}: discovery.peer_timeout_s must exceed 2 × hello_interval_s")
    return config


_POSITIVE = dict(check=lambda v: v > 0, expect="a number > 0")


def _discovery(discovery: Table, d: DaemonConfig, host: str) -> dict:
    """The [discovery] table's fields of DaemonConfig."""
    return dict(
        realm=discovery.get("realm", str, d.realm, check=lambda v: 0 < len(v) <= 63 and v.isprintable(),
                            expect="1-63 printable characters"),
        interfaces=_interfaces(discovery, host),
        hello_interval_s=discovery.get("hello_interval_s", float, d.hello_interval_s, **_POSITIVE),
        peer_timeout_s=discovery.get("peer_timeout_s", float, d.peer_timeout_s, **_POSITIVE),
        full_mesh_max=discovery.get("full_mesh_max", int, d.full_mesh_max, check=lambda v: v >= 1,
                                    expect="an integer >= 1"),
        fanout=discovery.get("fanout", int, d.fanout, check=lambda v: 1 <= v <= 64, expect="an integer 1..64"),
        zeroconf=discovery.get("zeroconf", bool, True),
        seeds=tuple(discovery.get("seeds", list, [], check=lambda v: all(valid_address(x) for x in v),
                                  expect='a list of "host:port" (an IP address, or "[v6]:port")')),
    )


def _worker(worker: Table, d: DaemonConfig, source: str) -> dict:
    """The [worker] table's fields of DaemonConfig."""
    return dict(
        worker_threads=worker.get("threads", int, 1, check=lambda v: 1 <= v <= 256, expect="an integer 1..256"),
        worker_devices=_devices(worker, source),
        worker_standby=worker.get("standby", bool, d.worker_standby),
        restart_backoff_s=worker.get("restart_backoff_s", float, d.restart_backoff_s, **_POSITIVE),
        restart_backoff_max_s=worker.get("restart_backoff_max_s", float, d.restart_backoff_max_s, **_POSITIVE),
        max_crashes=worker.get("max_crashes", int, d.max_crashes, check=lambda v: v >= 0,
                               expect="an integer >= 0 (0: no limit)"),
        crash_window_s=worker.get("crash_window_s", float, d.crash_window_s, **_POSITIVE),
        slowdown=worker.get("slowdown", float, 1.0, check=lambda v: 1 <= v <= 1000,
                            expect="a number in 1..1000 (a testing knob: 1 is full speed)"),
        slowdown_clock=worker.get("slowdown_clock", str, d.slowdown_clock, check=lambda v: v in CLOCKS,
                                  expect=f"one of {', '.join(repr(c) for c in CLOCKS)}"),
        step_overhead_s=worker.get("step_overhead_s", float, 0.0, check=lambda v: 0 <= v <= 60,
                                   expect="seconds in 0..60 (a testing knob: 0 is none)"),
    )


def _availability(table: Table) -> Availability:
    d = Availability()
    texts = table.get("windows", list, [], check=lambda v: all(isinstance(x, str) for x in v),
                      expect=f"a list of windows, each {WINDOW_RULE}")
    try:
        windows = tuple(parse_window(text) for text in texts)
    except ValueError as exc:
        raise ConfigError(f"{table.where('windows')} = {texts!r}: {exc}") from None
    names = table.get("commands", list, [], check=lambda v: all(isinstance(x, str) and x for x in v),
                      expect="a list of process names")
    return Availability(
        mode=table.get("mode", str, d.mode, check=lambda v: v in MODES,
                       expect=" or ".join(repr(m) for m in MODES)),
        windows=windows,
        cpu_share=table.get("cpu_share", float, d.cpu_share, check=lambda v: 0 < v <= 1024,
                            expect="cores in (0, 1024]"),
        hold_off_s=table.get("hold_off_s", float, d.hold_off_s, check=lambda v: 0 <= v <= 86400,
                             expect="seconds in 0..86400"),
        check_interval_s=table.get("check_interval_s", float, d.check_interval_s, check=lambda v: 0.1 <= v <= 60,
                                   expect="seconds in 0.1..60"),
        commands=tuple(names),
    )


def _interfaces(table: Table, host: str) -> tuple[str, ...]:
    given = table.get("interfaces", list, None,
                      check=lambda v: v and all(isinstance(x, str) and (x == "all" or _is_ip(x)) for x in v),
                      expect='a list of IP addresses, or ["all"]')
    if given is not None:
        return tuple(given)
    # Left unset, mDNS follows the host: "auto" (the same file then works on every
    # machine) or a fixed IPv4 address (mDNS on loopback would hide a daemon that
    # serves on the LAN), and zeroconf never speaks on every interface unasked.
    if host == AUTO:
        return (AUTO,)
    address = ipaddress.ip_address(host) if _is_ip(host) else None
    if address is not None and address.version == 4 and not address.is_unspecified:
        return (host,)
    return DaemonConfig.interfaces


def resolve_host(config: DaemonConfig) -> tuple[DaemonConfig, HostPick | None]:
    """A copy of `config` with host = "auto" (and interfaces that follow it)
    replaced by this machine's address, and the pick; (config, None) for a
    configured address."""
    if config.host != AUTO:
        return config, None
    try:
        pick = pick_host(_route_address(), _interface_addresses())
    except NoHostPick as exc:
        raise ConfigError(str(exc)) from None
    interfaces = (pick.address,) if config.interfaces == (AUTO,) else config.interfaces
    return replace(config, host=pick.address, interfaces=interfaces), pick


# Reserved for documentation (RFC 5737): no route but the default one covers it.
# Only connect()ed, which sends nothing; the kernel fills in the route's source.
ROUTE_PROBE = ("203.0.113.1", 9)


def _route_address() -> str | None:
    """The source address of the IPv4 default route; None without one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(ROUTE_PROBE)
        except OSError:  # ENETUNREACH: no route
            return None
        return probe.getsockname()[0]


def _interface_addresses() -> list[tuple[str, str]]:
    """(interface, IPv4 address) of every interface, loopback included."""
    import ifaddr  # only for host = "auto"

    return [(adapter.nice_name, ip.ip) for adapter in ifaddr.get_adapters() for ip in adapter.ips
            if isinstance(ip.ip, str)]  # IPv6 comes as a tuple


def _devices(table: Table, source: str) -> tuple[str, ...]:
    """[worker] device (one worker) or devices (one worker per entry); both
    only when they say the same."""
    device = table.get("device", str, "", check=_DEVICE.fullmatch,
                       expect='"auto", "cpu", "cuda", "cuda:N" or "mps"')
    devices = table.get("devices", (str, list), None,
                        check=lambda v: v == "auto" or (0 < len(v) <= MAX_WORKERS and all(
                            isinstance(x, str) and _LISTED_DEVICE.fullmatch(x) for x in v)),
                        expect=f'"auto" (every local GPU), or a list of 1..{MAX_WORKERS} of '
                               '"cpu", "cuda", "cuda:N" or "mps" (one worker each)')
    if devices is None:
        return (device or "auto",)
    chosen = EVERY_GPU if devices == "auto" else tuple(devices)
    if device and chosen != (device,):
        raise ConfigError(f"{source}: worker.device = {device!r} and worker.devices = {devices!r} disagree; "
                          "give only worker.devices")
    return chosen


def _path(table: Table, key: str, source: str, expect: str = "a file path") -> Path | None:
    """An optional file path; a relative one is taken from the config file's directory."""
    value = table.get(key, str, "", check=lambda v: 0 < len(v) <= 4096 and "\0" not in v, expect=expect)
    if not value:
        return None
    path = Path(value).expanduser()
    return path if path.is_absolute() else Path(source).parent / path


def _tls(table: Table, source: str) -> TlsSettings | None:
    files = {k: _path(table, k, source) for k in ("cert_file", "key_file", "ca_file")}
    server_name = table.get("server_name", str, "", check=lambda v: len(v) <= 253 and v.isprintable(),
                            expect="a DNS name every peer's certificate carries")
    given = sorted(k for k, v in files.items() if v is not None)
    if not given and not server_name:
        return None
    if len(given) != 3:
        missing = ", ".join(k for k in files if files[k] is None)
        raise ConfigError(f"{source}: [tls] needs cert_file, key_file and ca_file together; missing {missing}")
    return TlsSettings(files["cert_file"], files["key_file"], files["ca_file"], server_name)


def config_path(path: Path | None, env: Mapping[str, str] | None = None) -> Path | None:
    """The file to read: the argument, else $PEERD_CONFIG, else the default if it exists."""
    env = os.environ if env is None else env
    if path is not None:
        return path
    if env.get("PEERD_CONFIG"):
        return Path(env["PEERD_CONFIG"])
    return DEFAULT_PATH if DEFAULT_PATH.exists() else None


def load_config(path: Path | None, env: Mapping[str, str] | None = None) -> DaemonConfig:
    """Settings from `path` (see config_path) with the environment overrides
    applied; defaults when there is no file."""
    env = os.environ if env is None else env
    path = config_path(path, env)
    data = read_toml_file(path) if path is not None else {}
    return parse_config(apply_env(data, env), str(path) if path else "built-in defaults")


def apply_env(data: dict, env: Mapping[str, str]) -> dict:
    """`data` with the PEERD_* overrides set in `env` put in; each value is
    checked on its own first, so a bad one is reported by its variable's name."""
    data = {table: dict(values) if isinstance(values, dict) else values for table, values in data.items()}
    for name, (table, key, kind) in ENV_OVERRIDES.items():
        raw = env.get(name)
        if raw is None or raw == "":
            continue
        if kind is int:
            try:
                value: object = int(raw)
            except ValueError:
                raise ConfigError(f"environment: {name}={raw!r}: expected an integer") from None
        elif kind is list:
            value = [x.strip() for x in raw.split(",") if x.strip()]
        else:
            value = raw
        parse_config({table: {key: value}}, f"environment {name}")  # raises naming the variable
        if not isinstance(data.get(table, {}), dict):
            continue  # the file's own error is reported by parse_config
        data.setdefault(table, {})[key] = value
    return data


def _is_ip(value: str) -> bool:
    if not isinstance(value, str):
        return False  # ip_address() would take an integer
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True

