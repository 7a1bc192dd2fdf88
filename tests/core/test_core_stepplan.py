"""The plan of a worker's next local steps (peerd.core.stepplan)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from peerd.core.shares import BatchPlan
from peerd.core.stepplan import StepPlan, own_view, step_plan

FAST = settings(max_examples=200, deadline=None)


def test_the_worker_is_in_its_own_view_at_its_address():
    assert own_view({"b": "B"}, "a", "A") == {"b": "B", "a": "A"}
    assert own_view({"a": "", "b": "B"}, "a", "A") == {"a": "A", "b": "B"}


def test_the_members_are_the_serving_peers_sorted_and_they_are_the_trainers():
    plan = step_plan({"c": "C", "a": "A", "b": "B"}, None, False, {}, {})
    assert plan.members == ["a", "b", "c"] and plan.trainers == 3 and not plan.stop


def test_a_peer_whose_data_size_is_not_known_yet_counts_zero_and_others_are_left_out():
    plan = step_plan({"a": "A", "b": "B"}, None, False, {"a": 100, "gone": 5}, {"gone": 0.5})
    assert plan.data_sizes == {"a": 100, "b": 0}
    assert plan.terms == {"gone": 0.5}  # every member's term of the job's clock, ever


def test_without_a_dbs_plan_every_member_takes_the_period_and_with_one_its_steps():
    assert StepPlan(["a"], 1, None).round_steps("a", 4) == 4
    dbs = BatchPlan((("a", 8), ("b", 24)), steps=(("a", 2), ("b", 4)))
    plan = step_plan({"a": "A", "b": "B"}, dbs, False, {}, {})
    assert plan.round_steps("a", 4) == 2 and plan.round_steps("b", 4) == 4


def test_a_stop_is_carried_to_the_training_side():
    assert step_plan({"a": "A"}, None, True, {}, {}).stop


ids = st.sampled_from("abcdefgh")


@FAST
@given(st.dictionaries(ids, st.text(max_size=3)), ids, st.text(max_size=3))
def test_the_worker_is_always_a_member_of_its_own_plan(view, me, address):
    plan = step_plan(own_view(view, me, address), None, False, {}, {})
    assert me in plan.members and plan.members == sorted(set(view) | {me})
    assert plan.trainers == len(plan.members)
