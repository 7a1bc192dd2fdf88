"""The averaging algorithms, applied to every peer's real parameters at once.

Each algorithm changes the parameter matrix in place for one round, from the
plans of peerd's cores (topology.derangement, groups.form_groups /
partner_groups, rng.SeededStream), and returns the transfers the round needs, so
the network model can time them. Peers that crashed but are still in the view
(not yet expired) contribute nothing: whoever waits on them keeps its own value
after the deadline.

  allreduce      exact average of all live peers (ring all-reduce timing)
  sgp            push-sum over the time-varying exponential graph, one out-peer a round
  gossip         whole-model pairwise averaging over a random matching
  crossover      segment-wise pull from a derangement per segment (load balanced)
  crossover-unbalanced   same, but every peer picks each partner independently
  crossover-whole        load balanced, one segment (no segmentation)
  random-pull    one segment and independent partners (neither: the paper's ablation)
  hierarchical   in-group average, crossover across groups, all-gather in the group
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from peerd.core.groups import form_groups, partner_groups
from peerd.core.rng import SeededStream, derive_seed
from peerd.core.segments import Span
from peerd.core.topology import derangement


@dataclass(frozen=True)
class Transfer:
    src: int  # slot
    dst: int
    nbytes: float
    deps: tuple[int, ...] = ()  # indices of transfers that must finish first


@dataclass
class Comm:
    transfers: list[Transfer] = field(default_factory=list)
    collective_bytes: float = 0.0  # per live peer, for a collective (all-reduce)


@dataclass(frozen=True)
class View:
    """The membership view of one round, shared by every peer in this simulator."""

    job: str
    round: int
    names: tuple[str, ...]  # sorted peer ids
    slots: np.ndarray  # slots[k]: row of names[k] in the parameter matrix
    dead: np.ndarray  # dead[k]: crashed, still in the view until it expires
    localities: dict[str, tuple[str, ...]]

    @property
    def live(self) -> np.ndarray:
        return self.slots[~self.dead]


@dataclass
class State:
    """Parameters (rows = slots) and push-sum weights; a peer's model is x / w."""

    x: np.ndarray
    w: np.ndarray

    def models(self, slots: np.ndarray) -> np.ndarray:
        rows = contiguous(slots)
        if np.all(self.w[rows] == 1.0):  # not push-sum, or push-sum in balance
            return self.x[rows]
        return self.x[rows] / self.w[rows, None].astype(np.float32)


def contiguous(slots: np.ndarray) -> slice | np.ndarray:
    """A slice (a view, no copy) when the slots are one ascending run, else the slots."""
    if len(slots) and slots[-1] - slots[0] == len(slots) - 1 and np.all(np.diff(slots) == 1):
        return slice(int(slots[0]), int(slots[-1]) + 1)
    return slots


@dataclass(frozen=True)
class Segments:
    spans: tuple[Span, ...]
    bytes_per_param: float  # 4 for float32, more when timing a larger model

    def nbytes(self, s: int) -> float:
        return self.spans[s].size * self.bytes_per_param

    @property
    def model_bytes(self) -> float:
        return sum(self.nbytes(s) for s in range(len(self.spans)))


def allreduce(state: State, view: View, segs: Segments, weights: np.ndarray | None = None) -> Comm:
    """`weights`: a weighted average instead (the samples each peer trained since the last round)."""
    live = view.live
    state.x[live] = state.models(live).mean(axis=0) if weights is None else np.average(state.models(live), 0, weights)
    state.w[live] = 1.0
    n = len(live)
    return Comm(collective_bytes=2 * (n - 1) / n * segs.model_bytes if n > 1 else 0.0)


def _pull(state: State, view: View, segs: Segments, sources: list[np.ndarray]) -> Comm:
    """x_k[s] ← ½(x_k[s] + x_src[s]) for every segment s; a dead source is skipped."""
    comm = Comm()
    slots, dead = view.slots, view.dead
    for s, src in enumerate(sources):
        take = ~dead & ~dead[src]
        rows, from_rows = slots[take], slots[src[take]]
        span = segs.spans[s]
        state.x[rows, span.start : span.stop] = 0.5 * (
            state.x[rows, span.start : span.stop] + state.x[from_rows, span.start : span.stop]
        )
        comm.transfers += [Transfer(int(slots[j]), int(slots[k]), segs.nbytes(s)) for k, j in enumerate(src) if not dead[k]]
    return comm


def crossover(state: State, view: View, segs: Segments, balanced: bool = True) -> Comm:
    """Pull every segment from a partner: a derangement (topology core) or, unbalanced,
    an independent uniform choice per peer (the paper's "no fairness" ablation)."""
    n = len(view.names)
    if n < 2:
        return Comm()
    sources = []
    for s in range(len(segs.spans)):
        if balanced:  # the seed plan_round uses, so the sources equal its RoundPlan.sources
            sources.append(np.array(derangement(n, derive_seed(view.job, view.round, s))))
        else:
            stream = SeededStream(derive_seed(view.job, view.round, s, "unbalanced"))
            picks = [stream.below(n - 1) for _ in range(n)]
            sources.append(np.array([j + (j >= k) for k, j in enumerate(picks)]))
    return _pull(state, view, segs, sources)


def gossip(state: State, view: View, segs: Segments) -> Comm:
    """Whole-model pairwise averaging over a random matching (odd one out waits)."""
    n = len(view.names)
    order = list(range(n))
    SeededStream(derive_seed(view.job, view.round, "pairs")).shuffle(order)
    partner = np.arange(n)
    for a, b in zip(order[0::2], order[1::2]):
        partner[a], partner[b] = b, a
    whole = Segments((Span(0, state.x.shape[1]),), segs.bytes_per_param)
    comm = _pull(state, view, whole, [partner])
    comm.transfers = [t for t in comm.transfers if t.src != t.dst]
    return comm


def sgp(state: State, view: View, segs: Segments) -> Comm:
    """Push-sum: keep ½(x, w), push ½(x, w) to peer k + 2^(round mod log₂ n).

    A push to a crashed peer is lost with it; a crashed peer pushes nothing.
    """
    n = len(view.names)
    if n < 2:
        return Comm()
    hops = int(math.floor(math.log2(n - 1))) + 1
    offset = 2 ** (view.round % hops)
    slots, dead = view.slots, view.dead
    dst = (np.arange(n) + offset) % n
    live = slots[~dead]
    half_x, half_w = 0.5 * state.x[live], 0.5 * state.w[live]
    state.x[live], state.w[live] = half_x, half_w
    send = ~dead & ~dead[dst]
    state.x[slots[dst[send]]] += half_x[send[~dead]]
    state.w[slots[dst[send]]] += half_w[send[~dead]]
    nbytes = segs.model_bytes
    return Comm([Transfer(int(slots[k]), int(slots[dst[k]]), nbytes) for k in range(n) if send[k]])


def hierarchical(state: State, view: View, segs: Segments, size: int) -> Comm:
    """peerd's hierarchical crossover (docs/algorithms.md §1.3) with the groups core's plan.

    Per segment s: the owner of s in group G (member s mod |G|) averages s over
    G's live members, sets x ← (1 − w_G)·x_G + w_G·x_H with H = the partner
    group of (round, s), and every member takes the result. An owner that
    crashed leaves its group's s unchanged; a crashed partner owner skips the mix.
    """
    groups = form_groups(view.job, view.round, view.localities, size)
    index = {name: k for k, name in enumerate(view.names)}
    slots, dead = view.slots, view.dead
    members = [np.array([index[p] for p in g]) for g in groups]
    smallest = min(len(g) for g in groups)  # w_G as GroupPlan.weight; a test checks plan_hierarchical
    weight = np.array([0.5 * smallest / len(g) for g in groups]) if len(groups) > 1 else np.zeros(1)
    alive = [m[~dead[m]] for m in members]
    order = np.concatenate(alive)  # live members, group by group
    counts = np.array([len(a) for a in alive])
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    of_group = np.repeat(np.arange(len(groups)), counts)
    rows = slots[order]
    comm = Comm()
    for s in range(len(segs.spans)):
        span = segs.spans[s]
        cols = slice(span.start, span.stop)
        owner = np.array([m[s % len(m)] for m in members])
        ok = ~dead[owner] & (counts > 0)
        full = np.zeros((len(groups), span.size), np.float32)
        filled = counts > 0  # dropping empty groups' starts merges no ranges
        if filled.any():
            full[filled] = np.add.reduceat(state.x[rows, cols], starts[filled], axis=0) / counts[filled, None]
        if len(groups) > 1:
            partner = np.array(partner_groups(view.job, view.round, len(groups), s))
            w = np.where(ok[partner], weight, 0.0)[:, None].astype(np.float32)
            new = (1 - w) * full + w * full[partner]
        else:
            partner, new = None, full
        take = ok[of_group]
        state.x[rows[take], cols] = new[of_group[take]]
        _hier_transfers(comm, segs.nbytes(s), slots, dead, members, owner, partner)
    return comm


def _hier_transfers(comm: Comm, nbytes: float, slots, dead, members, owner, partner) -> None:
    """Reduce-scatter into each owner, one pull across groups, all-gather back."""
    reduce_into: list[tuple[int, ...]] = []
    for m, o in zip(members, owner):
        first = len(comm.transfers)
        comm.transfers += [Transfer(int(slots[j]), int(slots[o]), nbytes) for j in m if j != o and not dead[o]]
        reduce_into.append(tuple(range(first, len(comm.transfers))))
    for g, (m, o) in enumerate(zip(members, owner)):
        if dead[o]:
            continue
        deps = reduce_into[g]
        if partner is not None:
            h = partner[g]
            comm.transfers.append(Transfer(int(slots[owner[h]]), int(slots[o]), nbytes, reduce_into[h]))
            deps = deps + (len(comm.transfers) - 1,)
        comm.transfers += [Transfer(int(slots[o]), int(slots[j]), nbytes, deps) for j in m if j != o]


def run_round(name: str, state: State, view: View, segs: Segments, group_size: int,
              weights: np.ndarray | None = None) -> Comm:
    if name == "allreduce":
        return allreduce(state, view, segs, weights)
    if name == "sgp":
        return sgp(state, view, segs)
    if name == "gossip":
        return gossip(state, view, segs)
    if name == "crossover":
        return crossover(state, view, segs)
    if name == "crossover-unbalanced":
        return crossover(state, view, segs, balanced=False)
    if name == "crossover-whole":
        return crossover(state, view, _whole(state, segs))
    if name == "random-pull":
        return crossover(state, view, _whole(state, segs), balanced=False)
    if name == "hierarchical":
        return hierarchical(state, view, segs, group_size)
    raise ValueError(f"unknown algorithm {name!r}; choose from {', '.join(ALGORITHMS)}")


def _whole(state: State, segs: Segments) -> Segments:
    return Segments((Span(0, state.x.shape[1]),), segs.bytes_per_param)


ALGORITHMS = (
    "allreduce", "sgp", "gossip", "crossover", "crossover-unbalanced",
    "crossover-whole", "random-pull", "hierarchical",
)
