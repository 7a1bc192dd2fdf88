"""Peer ids and "host:port" addresses: one rule for each, used wherever they are
checked, made or taken apart (config, Hello, discovery, the exchange and bulk lanes)."""

from __future__ import annotations

import ipaddress

PEER_ID_MAX = 63
PEER_ID_RULE = f"1-{PEER_ID_MAX} ASCII letters, digits or '-'"
_HOST_PART_MAX = 40  # of a peer id made from the hostname, before the random suffix


def valid_peer_id(value: str) -> bool:
    """1-63 ASCII letters, digits or '-': what every peer accepts in a Hello."""
    return 0 < len(value) <= PEER_ID_MAX and all(c.isascii() and (c.isalnum() or c == "-") for c in value)


def peer_id_from_hostname(hostname: str, suffix: str) -> str:
    """A valid peer id "<host>-<suffix>" for this machine. A non-ASCII hostname is
    spelled as its IDNA (punycode) form, "bücher" → "xn--bcher-kva"; whatever is
    still not a letter or digit becomes '-'."""
    labels = []
    for label in hostname.split("."):
        try:
            labels.append(label.encode("idna").decode("ascii"))
        except UnicodeError:  # empty, too long, or not encodable: keep what is ASCII
            labels.append(label)
    host = "".join(c if c.isascii() and c.isalnum() else "-" for c in "-".join(labels))
    host = host[:_HOST_PART_MAX].strip("-") or "peer"
    return f"{host}-{suffix}"


def join_host_port(host: str, port: int) -> str:
    """ "host:port", with an IPv6 host in brackets: "[::1]:7000"."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def split_host_port(address: str) -> tuple[str, int]:
    """(host, port) from "host:port" or "[v6]:port"; ValueError when it is neither."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"not host:port: {address!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def host_of(address: str) -> str:
    """The host part of "host:port" or "[v6]:port"."""
    return split_host_port(address)[0]


def valid_address(value: object) -> bool:
    """ "host:port" with an IP host ("[v6]:port" for IPv6) and a port 1..65535."""
    if not isinstance(value, str):
        return False
    try:
        host, port = split_host_port(value)
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return 0 < port < 65536
