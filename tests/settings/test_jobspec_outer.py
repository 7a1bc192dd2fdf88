"""The job file's [outer] table: the outer step's settings, their checks, the
combinations with the rounds, and the fingerprint (docs/algorithms.md, "The outer step")."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest

from peerd.errors import ConfigError
from peerd.settings.jobspec import OuterSpec, parse_job

MNIST_TEXT = Path(resources.files("peerd") / "examples" / "mnist.toml").read_text()
# The example sets [gossip] period_steps, which the outer step replaces.
BASE = "\n".join(line for line in MNIST_TEXT.splitlines() if not line.startswith("period_steps"))
SRC = "JOB.toml"


def with_outer(outer: str, gossip: str = "") -> str:
    return BASE.replace("[gossip]\n", "[gossip]\n" + gossip, 1) + "\n[outer]\n" + outer


def test_off_unless_every_is_set_and_then_the_fingerprint_is_as_before():
    base = parse_job(BASE, SRC)
    assert base.outer == OuterSpec() and not base.outer.enabled
    assert parse_job(with_outer("every = 0\n"), SRC).fingerprint == base.fingerprint


def test_defaults_and_every_sets_the_rounds_period():
    spec = parse_job(with_outer("every = 8\n"), SRC)
    assert spec.outer == OuterSpec(every=8, lr=0.7, momentum=0.5, nesterov=True)
    assert spec.gossip.period_steps == 8


@pytest.mark.parametrize("outer", [
    "every = 9\n", "every = 8\nlr = 0.5\n", "every = 8\nmomentum = 0.0\n", "every = 8\nnesterov = false\n",
])
def test_every_setting_is_in_the_fingerprint(outer):
    base = parse_job(with_outer("every = 8\n"), SRC)
    other = parse_job(with_outer(outer), SRC)
    assert other.fingerprint != base.fingerprint
    assert base.fingerprint != parse_job(BASE, SRC).fingerprint


@pytest.mark.parametrize("outer, expect", [
    ("every = -1\n", r"outer.every = -1: expected an integer ≥ 1"),
    ("every = 8\nlr = 0\n", r"outer.lr = 0.0: expected a number > 0"),
    ("every = 8\nlr = -0.5\n", r"outer.lr = -0.5: expected a number > 0"),
    ("every = 8\nlr = inf\n", r"outer.lr = inf: expected a number > 0"),
    ("every = 8\nmomentum = 1\n", r"outer.momentum = 1.0: expected a number in \[0, 1\)"),
    ("every = 8\nmomentum = -0.1\n", r"outer.momentum = -0.1: expected a number in \[0, 1\)"),
    ("every = 8\nnesterov = 1\n", r"outer.nesterov = 1: expected true or false"),
    ("lr = 0.5\n", r"outer.every ≥ 1 is required with the other \[outer\] keys"),
    ("every = 8\nbeta = 0.5\n", r"\[outer\] unknown key\(s\): beta"),
])
def test_bad_values_are_refused_naming_the_key(outer, expect):
    with pytest.raises(ConfigError, match=expect):
        parse_job(with_outer(outer), SRC)


@pytest.mark.parametrize("gossip, expect", [
    ("period_steps = 8\n", "outer.every sets the local steps between rounds; drop period_steps"),
    ("period_steps = 1\n", "drop period_steps"),
])
def test_a_period_of_its_own_is_refused_saying_so(gossip, expect):
    with pytest.raises(ConfigError, match=expect):
        parse_job(with_outer("every = 8\n", gossip), SRC)
    parse_job(BASE.replace("[gossip]\n", "[gossip]\n" + gossip, 1), SRC)  # fine without the outer step


@pytest.mark.parametrize("gossip", ['mode = "hierarchical"\n', 'mode = "whole"\n', 'wire = "bf16"\n',
                                    "average_buffers = true\n", 'wire = "int8"\n', "overlap = true\n",
                                    'wire = "int8"\noverlap = true\n'])
def test_the_rounds_as_they_are_run_under_the_outer_step(gossip):
    assert parse_job(with_outer("every = 4\n", gossip), SRC).gossip.period_steps == 4
