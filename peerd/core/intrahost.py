"""The intra-host tier's decisions (docs/algorithms.md §1.3): the workers of one daemon for one
job form a torch.distributed process group and run the innermost stage of a
hierarchical round as collectives; gRPC carries only what crosses hosts.

Pure: no torch, no files. The daemon hands every worker a slot (rendezvous
directory, rank, size) on its command line and writes the group's *generation*
into that directory whenever it (re)starts one of them; a worker reads it at the
start of each round and this module says what to do:

    form      the generation changed (or no group yet): drop the old group and
              form this generation's, in the background (rounds go on meanwhile)
    agree     the group is up: gather every member's (round, plan key)
    use       all keys equal and the round's group is exactly the intra-host
              group: run the inner stage as collectives
    fallback  anything else: today's path (hierarchical_round over the bulk lane),
              with the reason, logged when it changes

A group that failed (a member died mid-collective, or never came to form it) is
not retried under the same generation, so a dead worker costs the others one
failed collective, not one per round. The members of a group that broke move the
generation on themselves (`GroupState.rebuild`; at most MAX_REBUILDS times), so a
member that stalled past the collective timeout is taken back without a restart;
a dead one's restart writes the next generation anyway.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from peerd.core.workers import SEPARATOR, member_ids

GENERATION_FILE = "generation"  # in the rendezvous directory: the current generation, as text
STORE_PREFIX = "store-"  # store-<generation>: that generation's FileStore

FORM, AGREE, USE, FALLBACK = "form", "agree", "use", "fallback"
NOT_COVERING = 0  # the plan key of a member whose round group is not the intra-host group
START_MARGIN = 2  # a new group is used from (the highest round its members were in) + this
MAX_REBUILDS = 3  # re-formings a worker asks for after its group broke; then it waits for the daemon
# An old generation's store is removed only once untouched this long: past any forming's
# timeout (the worker's FORM_TIMEOUT_S is 120 s), so no member still reads or writes it.
STORE_IDLE_S = 600.0


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


def wanted(devices: Sequence[str], mode: str) -> bool:
    """Whether a daemon gives its workers of a job an intra-host group: several
    workers, hierarchical gossip, and one kind of device ("cuda:k" for all, NCCL;
    or "cpu" for all, gloo). "auto" and "mps" workers, or a mix, keep the bulk lane."""
    kinds = {d.partition(":")[0] for d in devices}
    return len(devices) > 1 and mode == "hierarchical" and kinds in ({"cuda"}, {"cpu"})


def store_name(generation: int) -> str:
    return f"{STORE_PREFIX}{generation}"


def stale_stores(idle_s: Mapping[str, float], generation: int) -> list[str]:
    """The store files to remove: of generations before `generation`, and untouched
    (`idle_s`: seconds since each file was last written) for STORE_IDLE_S.

    Never one a member may still use: a FileStore keeps its read position in the
    file, and one that is removed and then written again (a forming that has not
    yet seen the new generation creates it anew) reads from the middle of a record,
    which torch's FileStore loops on forever, holding the GIL (docs/operations.md,
    "The intra-host tier")."""
    stale = []
    for name, idle in idle_s.items():
        suffix = name.removeprefix(STORE_PREFIX)
        if name.startswith(STORE_PREFIX) and suffix.isdigit() and int(suffix) < generation and idle >= STORE_IDLE_S:
            stale.append(name)
    return sorted(stale)


def parse_generation(text: str) -> int | None:
    """The generation file's content; None while the daemon has not written one."""
    text = text.strip()
    return int(text) if text.isdigit() else None


def round_key(round_: int, group: Sequence[str], owners: Sequence[str], sources: Sequence[str | None]) -> int:
    """A 62-bit digest of one round's plan as this member sees it (never
    NOT_COVERING): members that agree on it agree on every collective that follows
    (which segments are mixed with a partner group, which member broadcasts each)."""
    text = repr((round_, tuple(group), tuple(owners), tuple(sources)))
    return (int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 2) | 1


def covers(group: Sequence[str], members: Sequence[str]) -> bool:
    """The round's group is the intra-host group: the same members, every one of them."""
    return len(members) > 1 and sorted(group) == sorted(members)


def start_round(rounds: Sequence[int]) -> int:
    """The first round a freshly formed group is used in: every member will start
    it after learning the group is up (each was in at most the highest of `rounds`)."""
    return max(rounds) + START_MARGIN


@dataclass(frozen=True)
class Decision:
    action: str  # FORM, AGREE, USE or FALLBACK
    reason: str = ""
    tag: str = ""  # FORM: the rendezvous tag within the generation's store


@dataclass
class GroupState:
    """Where a worker's group stands.

    Collectives pair up by their order, so every member must call the same ones:
    once a group is formed every member calls the agreement (an all_gather of
    round and plan key) in every round from `start_round` on, whatever its view,
    and all go on to the round's collectives only if all keys are equal. A member
    that skipped a round (it stepped up to a partner's round) shows up as keys of
    different rounds: then all of them, seeing the same keys, re-form under the
    same new tag and start again from a common round.
    """

    formed: tuple[int, str] | None = None  # (generation, tag) of the group that is up
    forming: tuple[int, str] | None = None  # being formed in the background
    failed: int | None = None  # generation whose group failed: not retried
    start: int = 0  # the first round the formed group is used in
    rebuilds: int = 0  # generations this member moved on after a break

    def _known(self, generation: int) -> bool:
        return generation in (self.failed, *(g for g, _ in filter(None, (self.formed, self.forming))))

    def decide(self, generation: int | None, round_: int) -> Decision:
        """At the start of a round: `generation` is the daemon's current one (None:
        not written yet)."""
        if generation is None:
            return Decision(FALLBACK, "no generation from the daemon yet")
        if not self._known(generation):
            return Decision(FORM, f"generation {generation}", "0")
        if self.failed == generation:
            return Decision(FALLBACK, f"the group of generation {generation} failed; waiting for a new one")
        if self.formed is None:
            return Decision(FALLBACK, f"the group of generation {generation} is forming")
        if round_ < self.start:
            return Decision(FALLBACK, f"the group of generation {generation} is used from round {self.start}")
        return Decision(AGREE)

    def agreement(self, keys: Sequence[tuple[int, int]]) -> Decision:
        """What every member gathered (the same list on each): go on, fall back
        this round, or re-form under a tag all of them derive alike."""
        rounds = sorted({r for r, _ in keys})
        if len(rounds) > 1:
            assert self.formed is not None
            return Decision(FORM, f"members in rounds {rounds[0]}..{rounds[-1]}: out of step",
                            f"{self.formed[1]}.{rounds[-1]}")
        if any(k == NOT_COVERING for _, k in keys):
            return Decision(FALLBACK, "this round's group is not the daemon's workers")
        if len({k for _, k in keys}) > 1:
            return Decision(FALLBACK, "the members' plans of this round differ (views differ)")
        return Decision(USE)

    def forming_started(self, generation: int, tag: str) -> None:
        self.forming, self.formed = (generation, tag), None

    def forming_done(self, generation: int, tag: str, ok: bool, start: int = 0) -> None:
        if self.forming != (generation, tag):
            return  # a newer one started meanwhile: this one is dropped
        self.forming = None
        if ok:
            self.formed, self.start = (generation, tag), start
        else:
            self.failed = generation

    def broke(self) -> None:
        """A collective of the formed group failed."""
        if self.formed is not None:
            self.failed, self.formed = self.formed[0], None

    def rebuild(self) -> int | None:
        """After a break: the generation to move the rendezvous past (every member
        asks; the first write wins, the others find it moved), or None once
        MAX_REBUILDS are spent: then only the daemon's next generation re-forms it."""
        if self.failed is None or self.rebuilds >= MAX_REBUILDS:
            return None
        self.rebuilds += 1
        return self.failed
