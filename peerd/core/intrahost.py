"""The intra-host tier's decisions (DESIGN §1.3): the workers of one daemon for one
job form a torch.distributed process group and run the innermost stage of a
hierarchical round as collectives; gRPC carries only what crosses hosts.

Pure: no torch, no files. The daemon hands every worker a slot (rendezvous
directory, rank, size) on its command line and writes the group's *generation*
into that directory whenever it (re)starts one of them; a worker reads it at the
start of each round and this module says what to do:

    form      the generation changed (or no group yet): drop the old group and
              form this generation's, in the background (rounds go on meanwhile)
    use       the group is formed and the round's group is exactly the intra-host
              group: run the inner stage as collectives
    fallback  anything else: today's path (hierarchical_round over the bulk lane),
              with the reason, logged when it changes

A group that failed (a member died mid-collective, or never came to form it) is
not retried until the daemon writes a new generation, so a dead worker costs the
others one collective timeout, not one per round.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from peerd.core.workers import SEPARATOR, member_ids

GENERATION_FILE = "generation"  # in the rendezvous directory: the current generation, as text
STORE_PREFIX = "store-"  # store-<generation>: that generation's FileStore

FORM, USE, FALLBACK = "form", "use", "fallback"


@dataclass(frozen=True)
class IntraHostSlot:
    """One worker's place in its daemon's intra-host group: the same on every restart."""

    directory: str  # rendezvous directory on this host, under the job's directory
    rank: int
    size: int

    def __post_init__(self) -> None:
        if not (self.size >= 1 and 0 <= self.rank < self.size):
            raise ValueError(f"intra-host rank {self.rank} of {self.size}: expected 0 <= rank < size")

    def members(self, me: str) -> list[str]:
        """The job member ids of the group, from this worker's own ("<peer_id>.<rank>")."""
        if self.size == 1:
            return [me]
        daemon, _, rank = me.rpartition(SEPARATOR)
        if rank != str(self.rank):
            raise ValueError(f"member {me!r} is not worker {self.rank} of its daemon")
        return member_ids(daemon, self.size)

    def argv(self) -> list[str]:
        """The worker's command-line arguments for this slot."""
        return ["--intrahost", self.directory, "--intrahost-rank", str(self.rank), "--intrahost-size", str(self.size)]


def backend_for(device_type: str) -> str:
    """NCCL between GPUs, gloo otherwise (CPU workers; also how it is tested)."""
    return "nccl" if device_type == "cuda" else "gloo"


def store_name(generation: int) -> str:
    return f"{STORE_PREFIX}{generation}"


def stale_stores(names: Sequence[str], generation: int) -> list[str]:
    """The store files of generations before `generation` (the daemon removes them)."""
    stale = []
    for name in names:
        suffix = name.removeprefix(STORE_PREFIX)
        if name.startswith(STORE_PREFIX) and suffix.isdigit() and int(suffix) < generation:
            stale.append(name)
    return sorted(stale)


def parse_generation(text: str) -> int | None:
    """The generation file's content; None while the daemon has not written one."""
    text = text.strip()
    return int(text) if text.isdigit() else None


def round_key(round_: int, group: Sequence[str], owners: Sequence[str], sources: Sequence[str | None]) -> int:
    """A 62-bit digest of one round's plan as this member sees it: members that
    agree on it agree on every collective that follows (which segments are mixed
    with a partner group, which member broadcasts each)."""
    text = repr((round_, tuple(group), tuple(owners), tuple(sources)))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 2


def agreed(keys: Sequence[tuple[int, int]]) -> bool:
    """Every member gathered (round, key) pairs: use the group only if all are equal.
    Every member sees the same list, so all decide alike."""
    return len(set(map(tuple, keys))) == 1


@dataclass(frozen=True)
class Decision:
    action: str  # FORM, USE or FALLBACK
    reason: str = ""


@dataclass
class GroupState:
    """Where a worker's group stands; `decide` is called at the start of every round."""

    formed: int | None = None  # generation of the group that is up
    forming: int | None = None  # generation being formed in the background
    failed: int | None = None  # generation whose group failed: not retried

    def decide(self, generation: int | None, covers: bool) -> Decision:
        """`generation`: the daemon's current one (None: not written yet);
        `covers`: this round's group is exactly the intra-host group."""
        if generation is None:
            return Decision(FALLBACK, "no generation from the daemon yet")
        if generation != self.formed and generation != self.forming and generation != self.failed:
            return Decision(FORM, f"generation {generation}")
        if self.failed == generation:
            return Decision(FALLBACK, f"the group of generation {generation} failed; waiting for a new one")
        if self.formed != generation:
            return Decision(FALLBACK, f"the group of generation {generation} is still forming")
        if not covers:
            return Decision(FALLBACK, "this round's group is not the daemon's workers")
        return Decision(USE)

    def forming_started(self, generation: int) -> None:
        self.forming, self.formed = generation, None

    def forming_done(self, generation: int, ok: bool) -> None:
        if self.forming != generation:
            return  # a newer generation started meanwhile: this one is dropped
        self.forming = None
        if ok:
            self.formed = generation
        else:
            self.failed = generation

    def broke(self) -> None:
        """A collective of the formed group failed."""
        if self.formed is not None:
            self.failed, self.formed = self.formed, None


def covers(group: Sequence[str], members: Sequence[str]) -> bool:
    """The round's group is the intra-host group: the same members, every one of them."""
    return len(members) > 1 and sorted(group) == sorted(members)
