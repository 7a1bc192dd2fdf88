"""The pure parts of bench/bandwidth.py: utilisation, time to target (an accuracy's
or a loss's), bytes per round and per sample, the join goal, the report's table and
the variants' job texts for both jobs (no namespaces, no processes)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from bandwidth import (  # noqa: E402
    VARIANTS, Result, busy_share, bytes_per_round, bytes_per_sample, ddp_steps, deadline_ceiling_s, host_cpu,
    JOB_KINDS, job_text, join_goal_s,
    link_seconds, refused, table, targets, time_to_target, utilisation,
)

from peerd.settings.jobspec import parse_job  # noqa: E402


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


def test_bytes_per_sample_counts_every_peers_bytes_both_ways_over_the_samples():
    before, after = {0: (0, 0), 1: (100, 100)}, {0: (300, 100), 1: (400, 500)}
    assert bytes_per_sample(before, after, 128) == (400 + 700) / 128
    assert math.isnan(bytes_per_sample(before, after, 0))


def test_ddp_trains_whole_epochs_of_global_batches():
    assert ddp_steps(4000, 4, 2) == 2 * 31  # 1000 samples a rank, 32 a step
    assert ddp_steps(4000, 4, 0) == 0  # no end: until the target or the budget


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
                  steps_per_round=1 if variant == "ddp" else 8, wall_s=60.0, host_busy=0.97,
                  bytes_per_sample=4.5e6 if variant == "ddp" else 3.4e5)


def test_table_gives_ratios_to_the_same_caps_ddp_and_bounds_when_ddp_missed():
    rows = table([_result("ddp", 1000, 100.0), _result("overlap", 1000, 40.0),
                  _result("ddp", 100, None), _result("overlap", 100, 30.0), _result("peerd", 100, None)],
                 target=0.92, budget=150.0).splitlines()
    assert rows[2] == "| 1000 | ddp | 100 | — | 0.80 / 0.85 | 3.0 | 4500 | 1 | 0.97 |"
    assert rows[3] == "| 1000 | overlap | 40 | 0.40 | 0.80 / 0.85 | 3.0 | 340 | 8 | 0.97 |"
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


def test_a_variant_stopped_by_the_budget_gets_its_last_metric_marked_unfinished():
    done, stopped, short = _result("outer-8", 20, 50.0), _result("peerd-p1", 20, None), _result("outer-32", 20, None)
    done.final, done.consensus, short.final, short.consensus = 0.93, 0.94, 0.88, 0.9
    rows = table([done, stopped, short], target=0.9, budget=120.0, baseline="outer-8", finals=True).splitlines()
    assert "| 0.9300 / 0.9400 |" in rows[2]
    assert rows[3].startswith("| 20 | peerd-p1 | > 120 (not reached) |")
    assert "| unfinished: 0.5000 at the stop |" in rows[3]
    # Its epochs ended before the target: not the budget's doing.
    assert rows[4].startswith("| 20 | outer-32 | not reached (ended at 60) | n/a |") and "| 0.8800 / 0.9000 |" in rows[4]


def _parsed(variant: str):
    return parse_job(job_text(f"bw-{variant}", VARIANTS[variant], epochs=2, min_peers=4), variant)


def test_plain_variants_set_the_rounds_period_and_the_outer_ones_set_outer_every():
    assert _parsed("peerd").gossip.period_steps == 8 and not _parsed("peerd").outer.enabled
    assert _parsed("peerd-p1").gossip.period_steps == 1 and _parsed("peerd-p32").gossip.period_steps == 32
    for variant, every in (("outer-8", 8), ("outer-32", 32)):
        spec = _parsed(variant)
        assert (spec.outer.every, spec.gossip.period_steps) == (every, every)
        assert (spec.outer.lr, spec.outer.momentum, spec.outer.nesterov) == (0.7, 0.5, True)
        assert (spec.gossip.wire, spec.gossip.overlap) == ("fp32", False)
        assert "period_steps" not in job_text("x", VARIANTS[variant])  # refused with [outer]
    outer = parse_job(job_text("x", VARIANTS["outer-8"], outer=(1.0, 0.0)), "x").outer
    assert (outer.lr, outer.momentum) == (1.0, 0.0)


def test_the_exchange_deadline_fits_a_whole_model_through_slow_links():
    assert deadline_ceiling_s(1000) == deadline_ceiling_s(100) == 10.0  # the default: 3.8 s a model at 100
    assert deadline_ceiling_s(20) == pytest.approx(1.5 * 47.54e6 * 8 / 20e6, abs=0.1)  # 28.5 s
    assert parse_job(job_text("x", VARIANTS["outer-8"], cap=20), "x").gossip.deadline_ceiling_s == 28.5


def test_evaluations_and_rebalances_come_every_16_local_steps_or_every_round():
    assert [_parsed(v).eval_every_rounds for v in ("peerd-p1", "peerd", "outer-8", "outer-32")] == [16, 2, 2, 1]
    assert [_parsed(v).rebalance_rounds for v in ("peerd-p1", "peerd", "outer-32")] == [16, 2, 1]


def test_every_variant_is_a_job_this_build_takes_and_a_refused_one_says_why():
    for variant in ("outer-8-int8", "outer-32-int8", "outer-8-overlap-int8"):
        assert VARIANTS[variant].wire == "int8" and VARIANTS[variant].outer
    assert not any(refused(v) for v in VARIANTS)
    # A job the parser refuses (an outer momentum of 1) is skipped with the parser's words.
    assert "outer.momentum = 1.0" in refused("outer-8", (0.7, 1.0))


def test_a_loss_reaches_its_target_from_above_and_by_default_the_target_is_the_baselines_final_plus_1_percent():
    curve = [(10.0, 2.4), (20.0, 2.02), (30.0, 2.05), (40.0, 1.98)]
    assert time_to_target(curve, 2.02, "min") == 20.0 and time_to_target(curve, 2.02) == 10.0
    assert math.isnan(time_to_target(curve, 1.9, "min")) and math.isnan(time_to_target(curve, None, "min"))
    ddp = Result("ddp", 20, [(30.0, 2.0)], [], [], 1, 30.0, final=2.0, mode="min")
    other = Result("outer-8", 20, curve, [], [], 8, 40.0, final=1.98, consensus=1.97, mode="min")
    assert targets([ddp, other], None, "ddp") == {20: pytest.approx(2.02)}
    assert targets([ddp, other], 2.5, "ddp") == {20: 2.5}
    assert math.isnan(targets([other], None, "ddp")[20])  # no baseline at that cap
    rows = table([ddp, other], None, budget=300.0, finals=True).splitlines()
    assert "time to ddp's final + 1 % (s)" in rows[0] and rows[0].endswith("| final ÷ ddp's |")
    assert rows[3].startswith("| 20 | outer-8 | 20 | 0.67 |") and rows[3].endswith("| 0.990 |")


def test_the_language_model_job_is_the_example_file_in_fp32_at_the_benchs_global_batch():
    charlm = JOB_KINDS["charlm"]
    spec = parse_job(job_text("x", VARIANTS["outer-8"], epochs=1, min_peers=4, cap=20, job=charlm), "x")
    assert (spec.module, spec.metric, spec.metric_mode) == ("peerd.examples.charlm", "val_loss", "min")
    assert (spec.optimizer.name, spec.optimizer.lr, spec.optimizer.reference_batch) == ("adamw", 0.003, 128)
    assert (spec.optimizer.schedule, spec.optimizer.warmup_steps) == ("cosine", 20)
    assert (spec.train.precision, spec.train.grad_clip_norm) == ("fp32", 1.0)
    assert spec.gossip.deadline_ceiling_s == 10.0  # 2.5 MB: 1 s a model at 20 Mbit/s
    assert (spec.eval_every_rounds, spec.outer.every, spec.global_batch) == (1, 8, 128)  # every 8 steps
    assert not any(refused(v, job=charlm) for v in VARIANTS)
