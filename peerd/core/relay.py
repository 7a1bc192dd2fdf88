"""Membership relay: whom a daemon Hellos each interval, and how long a peer
stays in its view without news (docs/protocol.md, "Membership relay";
docs/algorithms.md, "Membership at lab size").

A realm of at most `full_mesh_max` daemons runs as a full mesh: each daemon
Hellos every peer it knows every interval and keeps only what peers said
themselves. A larger one relays: each daemon Hellos `fanout` random peers, and
takes the others' records from the replies (Membership.hear), so its messages
per interval stay constant and news of a daemon reaches every view within
about log N intervals.

Pure: the caller passes the peers and the random generator.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

FULL_MESH_MAX = 8
FANOUT = 3


def relaying(known: int, full_mesh_max: int) -> bool:
    """Whether a daemon that knows `known` other peers relays (the realm is
    larger than a full mesh's bound) rather than Hello every one."""
    return known + 1 > full_mesh_max


def hello_targets(peers: Sequence[str], fanout: int, full_mesh_max: int, rng: random.Random) -> list[str]:
    """The peers to Hello this interval: every one in a full mesh, else `fanout`
    drawn without replacement, a fresh draw each interval."""
    if not relaying(len(peers), full_mesh_max) or len(peers) <= fanout:
        return list(peers)
    return rng.sample(list(peers), fanout)


def spread_intervals(n: int) -> int:
    """Hello intervals a relaying realm of `n` daemons allows news of a daemon
    to reach every view: ceil(log2 n). Push-pull with fanout 3 needed at most 5
    at n = 64 and 8 at n = 1,000 in simulation (docs/algorithms.md, "Membership
    at lab size"), so this leaves a margin that grows with n."""
    return max(1, math.ceil(math.log2(max(n, 2))))


def view_timeout(n: int, peer_timeout_s: float, interval_s: float, full_mesh_max: int) -> float:
    """Seconds a peer stays in the view with no news of it, in a realm of `n`
    daemons: peer_timeout_s in a full mesh, plus the spread allowance when relaying."""
    if not relaying(n - 1, full_mesh_max):
        return peer_timeout_s
    return peer_timeout_s + interval_s * spread_intervals(n)


def settle_s(n: int, peer_timeout_s: float, interval_s: float, full_mesh_max: int) -> float:
    """Seconds after its start before a daemon's view can be trusted to show every
    running job: peer_timeout_s, or the spread allowance when that is longer."""
    if not relaying(n - 1, full_mesh_max):
        return peer_timeout_s
    return max(peer_timeout_s, interval_s * spread_intervals(n))


def suspect_after(n: int, interval_s: float, hello_timeout_s: float, full_mesh_max: int) -> float:
    """Seconds without news after which a peer shows as "suspected": two missed
    Hellos in a full mesh, the spread allowance when relaying."""
    if not relaying(n - 1, full_mesh_max):
        return 2 * interval_s + hello_timeout_s
    return interval_s * spread_intervals(n) + hello_timeout_s


def detection_bound(n: int, peer_timeout_s: float, interval_s: float, hello_timeout_s: float,
                    full_mesh_max: int) -> float:
    """Seconds from a daemon's death (no goodbye) until it is out of every view:
    the view timeout, plus one Hello round (interval and timeout) until the next
    expiry pass. A record carries the age of its news, so no view holds news
    of a dead daemon younger than its death."""
    return view_timeout(n, peer_timeout_s, interval_s, full_mesh_max) + interval_s + hello_timeout_s
