"""Which address `[daemon] host = "auto"` means on this machine (docs/operations.md).

The default route's source address when there is a default route; else the one
IPv4 address this machine has besides loopback; else no answer, and the
operator must name the address. The caller looks up the route and the
addresses (peerd.settings.config.resolve_host); this module only decides.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

AUTO = "auto"
ROUTE_REASON = "the default route's interface"
ROUTE_SOURCE_REASON = "the default route's source address"
ONLY_REASON = "the only interface address besides loopback; no default route"


@dataclass(frozen=True)
class HostPick:
    address: str
    interface: str  # "" when no listed interface holds the address
    reason: str

    def describe(self) -> str:
        """`10.1.2.3 (eth0, the default route's interface)`"""
        where = f"{self.interface}, " if self.interface else ""
        return f"{self.address} ({where}{self.reason})"


class NoHostPick(ValueError):
    """No address can be picked; the message says what was found and what to set."""


def pick_host(route_address: str | None, interfaces: Sequence[tuple[str, str]]) -> HostPick:
    """The address for host = "auto". `route_address`: the default route's
    source address, None without a default route; `interfaces`: (interface
    name, address) pairs of this machine, any family."""
    if route_address is not None and _usable(route_address):
        names = [name for name, address in interfaces if address == route_address]
        if not names:
            return HostPick(route_address, "", ROUTE_SOURCE_REASON)
        return HostPick(route_address, names[0], ROUTE_REASON)
    found = _candidates(interfaces)
    if len(found) == 1:
        (name, address), = found
        return HostPick(address, name, ONLY_REASON)
    link_local = [(n, a) for n, a in interfaces if _is_v4(a) and ipaddress.ip_address(a).is_link_local]
    skipped = f" (link-local ones are never picked: {_listed(link_local)})" if link_local else ""
    if not found:
        raise NoHostPick('daemon.host = "auto": no default route and no IPv4 address besides loopback'
                         f"{skipped}; is the network up? Else set daemon.host (or PEERD_HOST) to this "
                         "machine's LAN address")
    raise NoHostPick(f'daemon.host = "auto": no default route and {len(found)} IPv4 addresses besides '
                     f"loopback: {_listed(found)}{skipped}; set daemon.host (or PEERD_HOST) to one of them")


def _listed(pairs: Sequence[tuple[str, str]]) -> str:
    return ", ".join(f"{address} ({name})" for name, address in pairs)


def _candidates(interfaces: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """Usable IPv4 pairs, each address once, in the order given."""
    seen: set[str] = set()
    kept = []
    for name, address in interfaces:
        if address not in seen and _usable(address):
            seen.add(address)
            kept.append((name, address))
    return kept


def _is_v4(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).version == 4
    except ValueError:
        return False


def _usable(address: str) -> bool:
    # Link-local (169.254/16) is what an interface gets when DHCP failed: a
    # peer advertising it is unreachable once DHCP recovers.
    if not _is_v4(address):
        return False
    ip = ipaddress.ip_address(address)
    return not (ip.is_loopback or ip.is_link_local or ip.is_unspecified or ip.is_multicast)
