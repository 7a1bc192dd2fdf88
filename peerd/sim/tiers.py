"""The inner tier in the simulator (docs/simulation.md, "Result 8").

Between rounds, every k local steps, the members of each hierarchical group
replace their models by the group's exact mean, what an all-reduce over a
host's fast links leaves them with. A round's bytes are split by the links they
cross: the ones that leave a host are the slow ones, the cost that tiers are
meant to cut.
"""

from __future__ import annotations

import numpy as np

from peerd.core.groups import form_groups
from peerd.sim.algorithms import Comm, State, View
from peerd.sim.network import HOST, NetworkSpec


def group_average(state: State, view: View, size: int) -> list[list[int]]:
    """Every group's live members take the group's mean (the round's groups,
    so the inner tier averages exactly the peers the round's reduce does);
    the groups' live slots."""
    groups = form_groups(view.job, view.round, view.localities, size)
    index = {name: k for k, name in enumerate(view.names)}
    out = []
    for g in groups:
        members = np.array([index[p] for p in g])
        slots = view.slots[members[~view.dead[members]]]
        if len(slots) > 1:
            state.x[slots] = state.models(slots).mean(axis=0)
        out.append([int(s) for s in slots])
    return out


def slow_bytes(comm: Comm, live: list[int], net: NetworkSpec) -> float:
    """Bytes of one round that leave a host, summed over the peers."""
    total = sum(t.nbytes for t in comm.transfers if net.tier(t.src, t.dst) != HOST)
    if comm.collective_bytes and len(live) > 1:
        # a ring in slot order: one of its links per host leaves the host, when there are several
        hosts = len({net.host_of(s) for s in live})
        total += comm.collective_bytes * hosts if hosts > 1 else 0.0
    return float(total)
