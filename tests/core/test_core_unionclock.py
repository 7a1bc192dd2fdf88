"""The local-data job's clock: each peer's term grows, terms merge by max, and
the epochs are their sum, whatever order or how often terms are heard."""

from hypothesis import given, strategies as st

from peerd.core.unionclock import UnionClock


def test_a_peers_steps_count_their_samples_over_the_union():
    clock = UnionClock("a")
    clock.add(30, 300.0)
    clock.add(30, 300.0)
    assert clock.own == clock.epochs == 0.2


def test_the_others_terms_add_and_a_stale_or_repeated_term_changes_nothing():
    clock = UnionClock("a")
    clock.add(50, 100.0)
    clock.merge({"b": 0.25, "c": 1.0})
    assert clock.epochs == 1.75
    clock.merge({"b": 0.1, "c": 1.0})
    assert clock.epochs == 1.75


def test_its_own_term_before_a_restart_comes_back_with_the_state():
    before = UnionClock("a")
    before.add(40, 100.0)
    before.merge({"b": 0.5})
    after = UnionClock("a")
    after.load_state_dict(before.state_dict())
    assert after.own == 0.4 and after.epochs == before.epochs


terms = st.dictionaries(st.sampled_from("bcdefg"), st.floats(0, 100, allow_nan=False), max_size=6)


@given(st.lists(terms, max_size=8), st.randoms())
def test_any_order_and_any_repetition_of_what_is_heard_gives_the_same_clock(heard, rng):
    one, two = UnionClock("a"), UnionClock("a")
    for t in heard:
        one.merge(t)
    shuffled = heard * 2
    rng.shuffle(shuffled)
    for t in shuffled:
        two.merge(t)
    assert one.epochs == two.epochs
    assert one.epochs >= max((max(t.values(), default=0.0) for t in heard), default=0.0)
