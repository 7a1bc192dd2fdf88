"""The pure decisions of the final exact average (peerd.core.consensus)."""

from __future__ import annotations

import pytest

from peerd.core.consensus import consensus_timeout, describe, plan_consensus


def test_the_set_is_me_and_every_peer_reached_in_sorted_order_with_equal_weights():
    plan = plan_consensus("b", ["c", "a", "c"])
    assert plan.members == ("a", "b", "c")
    assert plan.weights == (1 / 3, 1 / 3, 1 / 3)
    assert plan.uniform and not plan.alone and plan.size == 3


def test_peers_that_reached_the_same_set_plan_the_same_sum():
    sets = {p: plan_consensus(p, {"a", "b", "c"} - {p}) for p in "abc"}
    assert len(set(sets.values())) == 1


def test_a_lone_peer_keeps_its_own_model():
    plan = plan_consensus("a", [])
    assert plan.alone and plan.members == ("a",) and plan.weights == (1.0,)


def test_weights_are_normalised_and_follow_the_sorted_order():
    plan = plan_consensus("b", ["a"], {"a": 3.0, "b": 1.0, "z": 9.0})
    assert plan.members == ("a", "b")
    assert plan.weights == (0.75, 0.25)
    assert not plan.uniform


@pytest.mark.parametrize("weights", [{"a": -1.0, "b": 2.0}, {"a": 0.0, "b": 0.0}, {"a": float("nan"), "b": 1.0}])
def test_bad_weights_are_refused(weights):
    with pytest.raises(ValueError):
        plan_consensus("a", ["b"], weights)


def test_the_timeout_waits_for_the_last_peer_then_one_transfer_per_other_peer():
    assert consensus_timeout(10.0, 2.0, 3) == 16.0
    assert consensus_timeout(10.0, 2.0, 0) == 0.0  # alone: nothing to wait for
    assert consensus_timeout(-1.0, -1.0, 2) == 0.0


def test_the_description_names_the_set_and_who_was_left_out():
    plan = plan_consensus("a", ["b"])
    assert describe(plan, ["d", "c"]) == "2 peer(s): a, b; left out: c, d"
    assert describe(plan, []) == "2 peer(s): a, b"
