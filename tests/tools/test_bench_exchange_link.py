"""The pure parts of bench/exchange.py --netns-cap: its arguments and the
capped-link table (no namespaces, no processes)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from exchange import parse_args  # noqa: E402
from harness.netlink import link_seconds, link_table  # noqa: E402


def test_capped_links_default_to_the_plain_and_tls_lanes_and_a_socket():
    args = parse_args(["--mib", "32", "--netns-cap", "1000,100"])
    assert args.caps == [1000.0, 100.0]
    assert args.methods == ["peerd", "peerd-tls", "tcp"]
    assert parse_args([]).caps == [] and "gloo" in parse_args([]).methods


@pytest.mark.parametrize("argv", [["--netns-cap", "100", "--methods", "peerd,gloo"], ["--netns-cap", "0"],
                                  ["--netns-cap", "fast"]])
def test_gloo_and_caps_that_are_not_rates_are_refused(argv):
    with pytest.raises(SystemExit):
        parse_args(argv)


def test_the_link_floor_is_the_busier_direction_over_the_rate():
    assert link_seconds(12.5e6, 100) == pytest.approx(1.0)
    run = {"times": [1.1, 1.2, 1.3], "split": {"cpu": [0.05, 0.06, 0.07], "cpu_wait": [0.001, 0.002, 0.004]},
           "bytes": [(12.5e6, 10e6), (9e6, 12.4e6)]}
    tls = {**run, "times": [1.3, 1.32, 1.5], "split": {"cpu": [0.12, 0.12, 0.12]}}  # no waits measured
    lines = link_table({"peerd": run, "peerd-tls": tls}, 100).splitlines()
    assert lines[2] == "| peerd | 1200 | 1100–1300 | 60 | 2 | 1.00 | 1.00 | 12.5 | 1000 | 1.20 |"
    assert lines[3] == "| peerd-tls | 1320 | 1300–1500 | 120 | nan | 1.10 | 2.00 | 12.5 | 1000 | 1.32 |"


def test_a_clock_with_waits_keeps_one_cpu_wait_per_kept_repeat():
    from harness.ranks import RepeatClock

    clock = RepeatClock(warmup=1, waits=True)
    for _ in range(3):
        clock.start()
        sum(range(10_000))
        clock.stop()
    assert len(clock.waited) == 2 and all(w >= 0 for w in clock.waited)
