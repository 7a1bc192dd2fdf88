"""The daemon's address book: where each peer's Peer service is, and how we know.

An address comes from zeroconf (the peer announces it on this LAN) or from a
Hello (the peer's own request, or a reply listing the peers the replier knows:
"heard of"). A peer only heard of is dropped again when it does not answer for
a timeout, so an address passed around after its peer died is not tried forever;
one found by zeroconf stays until zeroconf withdraws it.

Pure: the caller passes `now` and closes the channels of the addresses a change
leaves unused (returned, never closed here).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

ZEROCONF = "zeroconf"
HELLO = "hello"


@dataclass(frozen=True)
class AddressChange:
    found: bool = False  # the address is new for this peer
    unused: str | None = None  # an address no peer has any more: its channel may close


class PeerDirectory:
    def __init__(self, own_id: str) -> None:
        self._own_id = own_id
        self._addresses: dict[str, str] = {}  # peer id -> Peer service address
        self._heard_of: dict[str, float] = {}  # peer id -> when a Hello (not zeroconf) told us its address

    def __contains__(self, peer_id: str) -> bool:
        return peer_id in self._addresses

    def address(self, peer_id: str) -> str | None:
        return self._addresses.get(peer_id)

    def items(self) -> list[tuple[str, str]]:
        return list(self._addresses.items())

    def addresses(self) -> set[str]:
        return set(self._addresses.values())

    def learn(self, peer_id: str, address: str, via: str, now: float) -> AddressChange:
        """A peer's address, from zeroconf or (via=HELLO) from a Hello."""
        if peer_id == self._own_id:
            return AddressChange()
        if via == ZEROCONF:
            self._heard_of.pop(peer_id, None)
        elif peer_id not in self._addresses or peer_id in self._heard_of:
            self._heard_of[peer_id] = now
        if self._addresses.get(peer_id) == address:
            return AddressChange()
        unused = self.forget(peer_id)  # a restarted peer comes back on another port
        self._addresses[peer_id] = address
        return AddressChange(found=True, unused=unused)

    def forget(self, peer_id: str) -> str | None:
        """Drop the peer's address; returns it when no other peer has it."""
        address = self._addresses.pop(peer_id, None)
        if address is not None and address not in self._addresses.values():
            return address
        return None

    def expire(self, now: float, timeout_s: float, answering: Callable[[str], bool]) -> list[str]:
        """Forget the peers only heard of that have not answered for timeout_s;
        returns the addresses that leaves unused."""
        unused = []
        for peer_id, since in list(self._heard_of.items()):
            if not answering(peer_id) and now - since > timeout_s:
                del self._heard_of[peer_id]
                if (address := self.forget(peer_id)) is not None:
                    unused.append(address)
        return unused
