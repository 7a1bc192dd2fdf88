"""The end consensus by parts: who averages which part of the final vector
(docs/algorithms.md, "One model at the end").

Pulling every member's whole final model costs each peer (n − 1) model sizes.
Instead the set S, sorted by id, cuts the final vector into n contiguous parts,
part i owned by the i-th member: each owner pulls its part from every member
(stage 4), averages it, and serves the average (stage 5), which every member
pulls. Each member then takes in and sends out 2·(n − 1)/n model sizes.

A request names its plan by `plan_id`: the set's size and a digest of its
sorted ids. The size tells a member serving a part how the vector is cut; the
digest lets an owner refuse a reader that averages over another set, so that
no member puts parts averaged over different sets into one model.

Sets only shrink while a consensus runs (a member that fails is left out; none
is added), so a server can refuse at once a plan it can never come to.

Pure: no torch, no clock.
"""

from __future__ import annotations

import enum
import hashlib
import itertools
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from peerd.core.segments import Span

SIZE_SHIFT = 48  # a plan id: the set's size above bit 48, 48 bits of digest below
MAX_MEMBERS = (1 << 15) - 1  # so that an id fits a signed 64-bit round (the bulk lane's refusal)
MAX_ATTEMPTS = 3  # plans tried (each without the members the last one lost) before pulling whole models


def plan_id(members: Iterable[str]) -> int:
    """The id of the set: its size, then the first 48 bits of the sha256 of its
    sorted ids joined by newlines."""
    ordered = sorted(set(members))
    digest = hashlib.sha256("\n".join(ordered).encode()).digest()
    return (len(ordered) << SIZE_SHIFT) | int.from_bytes(digest[:6], "big")


def plan_size(id_: int) -> int:
    """How many members the plan `id_` has (0 for no plan)."""
    return max(id_, 0) >> SIZE_SHIFT


def end_parts(numel: int, int_tail: int, parts: int) -> list[Span]:
    """The final vector (`numel` elements, the last `int_tail` integer pieces)
    cut into `parts` contiguous parts: the floats as evenly as can be (sizes
    differ by at most 1; a part is empty when there are fewer floats than
    parts), the last part running on over the integer tail, which stays whole
    (four pieces make one value)."""
    if parts < 1 or not 0 <= int_tail <= numel:
        raise ValueError(f"cannot cut {numel} elements ({int_tail} integer) into {parts} parts")
    floats = numel - int_tail
    bounds = [floats * k // parts for k in range(parts)] + [numel]
    return [Span(a, b) for a, b in zip(bounds, bounds[1:])]


@dataclass(frozen=True)
class EndPlan:
    """One set's reduce-scatter: members sorted, part i owned by members[i]."""

    members: tuple[str, ...]
    numel: int
    int_tail: int = 0
    id: int = field(init=False)

    def __post_init__(self) -> None:
        if not self.members or list(self.members) != sorted(set(self.members)):
            raise ValueError(f"a plan's members must be distinct and sorted: {self.members}")
        if len(self.members) > MAX_MEMBERS:
            raise ValueError(f"at most {MAX_MEMBERS} members in one end consensus, got {len(self.members)}")
        object.__setattr__(self, "id", plan_id(self.members))

    @property
    def size(self) -> int:
        return len(self.members)

    @property
    def alone(self) -> bool:
        return self.size == 1

    @property
    def parts(self) -> list[Span]:
        return end_parts(self.numel, self.int_tail, self.size)

    def index(self, peer: str) -> int:
        return self.members.index(peer)

    def part_of(self, peer: str) -> Span:
        return self.parts[self.index(peer)]

    def without(self, gone: Collection[str]) -> EndPlan:
        """The plan of the set left when `gone` are left out."""
        return EndPlan(tuple(p for p in self.members if p not in gone), self.numel, self.int_tail)


def plan_end(me: str, others: Iterable[str], numel: int, int_tail: int = 0) -> EndPlan:
    """The first plan: this member and every other it knows of in the job."""
    return EndPlan(tuple(sorted({me, *others})), numel, int_tail)


def part_traffic(plan: EndPlan, peer: str) -> tuple[int, int]:
    """Elements `peer` takes in and sends out under `plan` when nothing fails:
    its part from each other member and every other part's average in; every
    other part of its own model to that part's owner and its average to each
    other member out. Both are 2·(n − 1)/n model sizes, give or take a part's
    rounding (and the integer tail, in the last part)."""
    mine = plan.part_of(peer).size
    others = plan.numel - mine
    return (plan.size - 1) * mine + others, others + (plan.size - 1) * mine


class Refusal(enum.Enum):
    """What a refused request for a part's average (stage 5) says, read from
    the round the refusing member named (`refusal_round`)."""

    NOT_YET = "not yet"  # it may still serve that part: ask the owner again, or another member
    OTHER_SET = "other set"  # it averages, or averaged, over another set and never will
    NO_PLAN = "no plan"  # it averages over no set (still training, or it left)


def refusal_round(asked: int, working: int, done: bool) -> int:
    """The round a member names when it refuses a part of plan `asked`
    (`working`: the id of the plan it averages over, -1 for none; `done`: it
    holds that plan's whole average): `asked` while it may still serve it (its
    part is not averaged yet, or its set may still shrink to the asked one),
    its own plan's id once it never will."""
    if working < 0:
        return -1
    return asked if not done and reachable(asked, working) else working


def refusal(asked: int, current: int) -> Refusal:
    """Read a refusal of plan `asked`'s part by the round the member named."""
    if current == asked:
        return Refusal.NOT_YET
    return Refusal.OTHER_SET if plan_size(current) > 0 else Refusal.NO_PLAN


def reachable(asked: int, working: int) -> bool:
    """Whether a member now averaging over plan `working` may still come to
    plan `asked`: sets only shrink, so only to a smaller one (or that one)."""
    return asked == working or 0 < plan_size(asked) < plan_size(working)


LEARN_MISSING = 2  # an owner's smaller set is recognised when it lacks at most this many members


def shrunk_to(plan: EndPlan, me: str, other: int) -> frozenset[str] | None:
    """The members `plan` lacks in the set whose id is `other`, when that set
    is `plan`'s without at most LEARN_MISSING members and still holds `me`
    (an owner left out a member this one has not seen fail); else None."""
    missing = plan.size - plan_size(other)
    if not 0 < missing <= LEARN_MISSING:
        return None
    others = [p for p in plan.members if p != me]
    for gone in itertools.combinations(others, missing):
        if plan_id(set(plan.members) - set(gone)) == other:
            return frozenset(gone)
    return None


class Next(enum.Enum):
    DONE = "done"  # every part averaged over the plan's set
    REPLAN = "replan"  # members failed: try again without them
    ALL_PULL = "all-pull"  # parts over an unknown set, or too many tries: pull the whole models


def after_attempt(plan: EndPlan, me: str, failed: Collection[str], other_set: int, attempt: int
                  ) -> tuple[Next, EndPlan]:
    """What follows an attempt under `plan` (`attempt` counts from 1) in which
    `failed` failed and, when `other_set` is not 0, an owner named that plan
    instead. The plan again without the members that failed, or without those
    the owner's set lacks; when that set is not one of those (views differ, or
    a failure reached members one way) or the tries are spent, every
    member's whole model, over the set that is left."""
    gone = set(failed)
    if other_set:
        lacking = shrunk_to(plan, me, other_set)
        if lacking is None:
            return Next.ALL_PULL, plan.without(gone)
        gone |= lacking
    if not gone:
        return Next.DONE, plan
    smaller = plan.without(gone)
    if attempt >= MAX_ATTEMPTS and not smaller.alone:
        return Next.ALL_PULL, smaller
    return Next.REPLAN, smaller
