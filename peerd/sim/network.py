"""Where simulated peers sit and how long a transfer takes between two of them.

Peers are placed `gpus_per_host` to a host and `hosts_per_rack` hosts to a
rack. A link belongs to one of three locality tiers (same host, same rack,
across racks), each with its own bandwidth and latency. Transfers queue on the
resources they use: between two peers of one host, the sender's and the
receiver's own bus; off the host, the two hosts' network cards, which every
peer of a host shares. Each card serves its queue in order (first come, first
served) at the tier's bandwidth, sending and receiving independently (the
switch buffers): a transfer of b bytes has left once the sender's card has
spent b / bandwidth on it, has arrived once the receiver's card has too, and is
usable a latency later. So a card that sends to, or receives from, k peers at
once takes k times as long, which is what unbalanced partners cost.
"""

from __future__ import annotations

from dataclasses import dataclass, field

HOST, RACK, CROSS = 0, 1, 2
TIER_NAMES = ("same-host", "same-rack", "across-racks")


@dataclass(frozen=True)
class Tier:
    bandwidth: float  # bytes/s
    latency: float  # s

    def __post_init__(self) -> None:
        if not (self.bandwidth > 0 and self.latency >= 0):
            raise ValueError(f"a tier needs bandwidth > 0 and latency ≥ 0, got {self}")


@dataclass(frozen=True)
class NetworkSpec:
    host: Tier = Tier(25e9, 5e-6)  # NVLink/PCIe class
    rack: Tier = Tier(1.25e9, 50e-6)  # 10 GbE
    cross: Tier = Tier(0.3125e9, 200e-6)  # 2.5 Gb/s left per host across the core
    gpus_per_host: int = 8
    hosts_per_rack: int = 4

    def __post_init__(self) -> None:
        if self.gpus_per_host < 1 or self.hosts_per_rack < 1:
            raise ValueError("gpus_per_host and hosts_per_rack must be ≥ 1")

    def tiers(self) -> tuple[Tier, Tier, Tier]:
        return (self.host, self.rack, self.cross)

    def host_of(self, slot: int) -> int:
        return slot // self.gpus_per_host

    def rack_of(self, slot: int) -> int:
        return self.host_of(slot) // self.hosts_per_rack

    def locality(self, slot: int) -> tuple[str, str]:
        """The (rack, host) path that peerd.core.groups groups by."""
        return (f"rack{self.rack_of(slot)}", f"host{self.host_of(slot)}")

    def tier(self, a: int, b: int) -> int:
        if self.host_of(a) == self.host_of(b):
            return HOST
        return RACK if self.rack_of(a) == self.rack_of(b) else CROSS


@dataclass
class Fabric:
    """Busy-until times of every bus and network card; reserves them per transfer."""

    spec: NetworkSpec
    _free: dict[tuple[str, int], float] = field(default_factory=dict)

    def send(self, src: int, dst: int, nbytes: float, start: float) -> float:
        """Reserve what a transfer from `src` to `dst` uses from `start`; its end time."""
        spec, free = self.spec, self._free
        a, b = src // spec.gpus_per_host, dst // spec.gpus_per_host
        if a == b:
            link, out, into = spec.host, ("bus-out", src), ("bus-in", dst)
        else:
            same_rack = a // spec.hosts_per_rack == b // spec.hosts_per_rack
            link, out, into = (spec.rack if same_rack else spec.cross), ("nic-out", a), ("nic-in", b)
        took = nbytes / link.bandwidth
        sent = max(start, free.get(out, 0.0)) + took
        taken = max(sent, free.get(into, 0.0) + took)
        free[out], free[into] = sent, taken
        return taken + link.latency

    def slowest(self, slots: list[int]) -> Tier:
        """The slowest tier on a ring through `slots` in the order given."""
        if len(slots) < 2:
            return self.spec.host
        worst = max(self.spec.tier(a, b) for a, b in zip(slots, slots[1:] + slots[:1]))
        return self.spec.tiers()[worst]
