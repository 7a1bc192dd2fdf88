"""The pure parts of bench/bandwidth.py: utilisation, time to target, bytes per
round, the join goal and the report's table (no namespaces, no processes)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from bandwidth import (  # noqa: E402
    Result, busy_share, bytes_per_round, host_cpu, join_goal_s, link_seconds, table, time_to_target, utilisation,
)


def test_utilisation_is_compute_over_the_window_between_first_and_last_sample():
    # 10 s of wall between the samples, 8.5 s more of compute: 0.85; the compute
    # before the first sample (startup) does not count.
    assert utilisation([(2.0, 5.0), (7.0, 9.0), (12.0, 13.5)]) == pytest.approx(0.85)
    assert math.isnan(utilisation([(1.0, 1.0)]))
    assert math.isnan(utilisation([(1.0, 1.0), (1.0, 2.0)]))


def test_time_to_target_is_the_first_crossing_or_nan():
    curve = [(1.0, 0.5), (2.0, 0.93), (3.0, 0.88), (4.0, 0.95)]
    assert time_to_target(curve, 0.92) == 2.0
    assert math.isnan(time_to_target(curve, 0.99))


def test_bytes_per_round_counts_sent_and_received():
    assert bytes_per_round((100, 1000), (4100, 9000), 4) == (4000 + 8000) / 4
    assert math.isnan(bytes_per_round((0, 0), (10, 10), 0))


def test_host_busy_share_is_busy_over_total_jiffies_between_readings():
    assert busy_share((100, 400), (250, 600)) == pytest.approx(0.75)
    assert math.isnan(busy_share((5, 10), (5, 10)))
    busy, total = host_cpu()  # this host's own /proc/stat
    assert 0 <= busy <= total and total > 0


def test_join_goal_is_1_2_times_the_link_time_plus_a_second():
    assert link_seconds(125e6, 1000) == pytest.approx(1.0)  # 1 Gbit/s moves 125 MB a second
    assert join_goal_s(125e6, 1000) == pytest.approx(2.2)
    assert join_goal_s(12.5e6, 100) == pytest.approx(2.2)


def _result(variant: str, cap: float, reached: float | None) -> Result:
    curve = [(5.0, 0.5)] + ([(reached, 0.95)] if reached else [])
    return Result(variant, cap, curve, utilisation=[0.9, math.nan, 0.8], bytes_per_round=[2e6, 4e6],
                  steps_per_round=1 if variant == "ddp" else 8, wall_s=60.0, host_busy=0.97)


def test_table_gives_ratios_to_the_same_caps_ddp_and_bounds_when_ddp_missed():
    rows = table([_result("ddp", 1000, 100.0), _result("overlap", 1000, 40.0),
                  _result("ddp", 100, None), _result("overlap", 100, 30.0), _result("peerd", 100, None)],
                 target=0.92, budget=150.0).splitlines()
    assert rows[2] == "| 1000 | ddp | 100 | — | 0.80 / 0.85 | 3.0 | 1 | 0.97 |"
    assert rows[3] == "| 1000 | overlap | 40 | 0.40 | 0.80 / 0.85 | 3.0 | 8 | 0.97 |"
    assert rows[4].startswith("| 100 | ddp | > 150 (not reached) | — |")
    assert rows[5].startswith("| 100 | overlap | 30 | < 0.20 |")  # DDP needs > 150 s: the ratio is a bound
    assert rows[6].startswith("| 100 | peerd | > 150 (not reached) | n/a |")


def test_table_takes_ratios_against_the_baseline_and_gives_final_accuracy_when_trained_to_the_end():
    fp32, int8 = _result("peerd", 100, 80.0), _result("peerd-int8", 100, 30.0)
    fp32.final, fp32.consensus, int8.final, int8.consensus = 0.931, 0.94, 0.929, 0.9385
    rows = table([fp32, int8], target=0.9, budget=150.0, baseline="peerd").splitlines()
    assert "× peerd" in rows[0] and "final: own / consensus" in rows[0]
    assert rows[2].startswith("| 100 | peerd | 80 | — |") and "| 0.9310 / 0.9400 |" in rows[2]
    assert rows[3].startswith("| 100 | peerd-int8 | 30 | 0.38 |") and "| 0.9290 / 0.9385 |" in rows[3]
