"""The pure plan of the end consensus by parts (peerd.core.endplan)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peerd.core.endplan import (
    MAX_ATTEMPTS, EndPlan, Next, Refusal, after_attempt, end_parts, part_traffic, plan_end, plan_id, plan_size,
    reachable, refusal, refusal_round, shrunk_to,
)

IDS = st.lists(st.text("abcdefgh-.0123456789", min_size=1, max_size=6), min_size=1, max_size=40, unique=True)


@given(numel=st.integers(0, 5000), tail=st.integers(0, 64), parts=st.integers(1, 70))
def test_the_parts_cover_the_vector_evenly_and_keep_the_integer_tail_whole(numel, tail, parts):
    tail = min(tail, numel)
    spans = end_parts(numel, tail, parts)
    assert len(spans) == parts
    assert spans[0].start == 0 and spans[-1].stop == numel
    assert all(a.stop == b.start for a, b in zip(spans, spans[1:]))
    floats = [s.size for s in spans[:-1]] + [spans[-1].size - tail]
    assert max(floats) - min(floats) <= 1 and min(floats) >= 0
    assert spans[-1].stop - tail >= spans[-1].start  # the integer pieces all in the last part


def test_bad_cuts_are_refused():
    for args in ((10, 0, 0), (10, 11, 2), (10, -1, 2)):
        with pytest.raises(ValueError):
            end_parts(*args)


@given(IDS, st.randoms(use_true_random=False))
def test_a_plan_id_names_the_set_whatever_the_order_and_carries_its_size(ids, rnd):
    shuffled = list(ids)
    rnd.shuffle(shuffled)
    assert plan_id(ids) == plan_id(shuffled) == plan_id(ids + ids[:1])
    assert plan_size(plan_id(ids)) == len(ids)
    assert 0 < plan_id(ids) < 1 << 63  # a signed 64-bit round holds it (the bulk lane's refusal)
    if len(ids) > 1:
        assert plan_id(ids[1:]) != plan_id(ids)


def test_ids_of_different_sets_differ():
    sets = [frozenset(c) for k in range(1, 6) for c in itertools.combinations("abcdefgh", k)]
    assert len({plan_id(s) for s in sets}) == len(sets)
    assert plan_size(0) == plan_size(-1) == 0


def test_a_plan_is_sorted_and_each_member_owns_its_part():
    plan = plan_end("c", ["a", "d", "b"], 103, 8)
    assert plan.members == ("a", "b", "c", "d") and plan.size == 4 and not plan.alone
    assert plan.part_of("c") == plan.parts[2] and plan.index("d") == 3
    assert plan.parts[-1].stop == 103 and plan.id == plan_id("abcd")
    assert plan.without({"b", "d"}) == EndPlan(("a", "c"), 103, 8)
    assert plan_end("a", [], 10).alone
    for members in (("b", "a"), ("a", "a"), ()):
        with pytest.raises(ValueError):
            EndPlan(members, 10)


@settings(max_examples=200)
@given(n=st.integers(1, 64), numel=st.integers(0, 100_000), tail=st.integers(0, 32))
def test_each_member_moves_about_two_model_sizes_in_and_out(n, numel, tail):
    tail = min(tail, numel)
    plan = EndPlan(tuple(f"p{k:02d}" for k in range(n)), numel, tail)
    moved = [part_traffic(plan, p) for p in plan.members]
    assert sum(i for i, _ in moved) == sum(o for _, o in moved)  # what one sends, another takes
    bound = 2 * (n - 1) / n * numel + (n - 1) * (1 + tail)  # a part's rounding, and the tail in the last part
    for taken, sent in moved:
        assert taken == sent <= bound
    if n > 1:  # against pulling every whole model: n − 1 model sizes in and out
        assert max(t for t, _ in moved) <= (n - 1) * numel


def test_a_refusal_says_whether_to_ask_again():
    four, three = plan_id("abcd"), plan_id("abc")
    # The refusing member names the asked plan while it may still serve it.
    assert refusal_round(four, four, done=False) == four  # its part is not averaged yet
    assert refusal_round(three, four, done=False) == three  # its set may still shrink to the asked one
    assert refusal_round(four, three, done=False) == three  # sets only shrink: never
    assert refusal_round(three, four, done=True) == four  # it holds another set's average
    assert refusal_round(four, -1, done=False) == -1  # still training, or it left
    assert refusal(four, four) is Refusal.NOT_YET
    assert refusal(four, three) is Refusal.OTHER_SET
    assert refusal(four, -1) is refusal(four, 0) is Refusal.NO_PLAN
    assert reachable(three, four) and reachable(four, four) and not reachable(four, three)
    assert not reachable(plan_id("abd"), three)  # the same size, another set


def test_an_owners_smaller_set_is_learned_when_it_lacks_a_member_or_two_but_not_this_one():
    plan = EndPlan(tuple("abcde"), 100)
    assert shrunk_to(plan, "a", plan_id("abce")) == {"d"}
    assert shrunk_to(plan, "a", plan_id("ace")) == {"b", "d"}
    assert shrunk_to(plan, "a", plan_id("bcde")) is None  # without this member: not its set
    assert shrunk_to(plan, "a", plan_id("ab")) is None  # lacks three
    assert shrunk_to(plan, "a", plan_id("abcx")) is None  # not a subset
    assert shrunk_to(plan, "a", plan_id("abcdef")) is None  # larger


def test_after_an_attempt_the_plan_ends_shrinks_or_gives_way_to_whole_models():
    plan = EndPlan(tuple("abcd"), 100)
    assert after_attempt(plan, "a", {}, 0, 1) == (Next.DONE, plan)
    assert after_attempt(plan, "a", {"c": "gone"}, 0, 1) == (Next.REPLAN, plan.without({"c"}))
    assert after_attempt(plan, "a", {}, plan_id("abd"), 1) == (Next.REPLAN, plan.without({"c"}))
    assert after_attempt(plan, "a", {"b": "gone"}, plan_id("abd"), 1) == (Next.REPLAN, EndPlan(("a", "d"), 100))
    # An owner over a set this member cannot tell: whole models, over the set it has.
    assert after_attempt(plan, "a", {"b": "x"}, plan_id("bcd"), 1) == (Next.ALL_PULL, plan.without({"b"}))
    assert after_attempt(plan, "a", {"c": "x"}, 0, MAX_ATTEMPTS) == (Next.ALL_PULL, plan.without({"c"}))
    # Left alone, it keeps its own model whatever the tries.
    assert after_attempt(plan, "a", dict.fromkeys("bcd", "x"), 0, MAX_ATTEMPTS) == (Next.REPLAN, EndPlan(("a",), 100))
