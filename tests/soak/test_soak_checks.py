"""The soak harness's pure parts: schedule parsing and the checks on synthetic
runs (the real short soak is tests/e2e/test_soak.py)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from peerd.errors import ConfigError
from peerd.soak import checks as ck
from peerd.soak import schedule as sch
from peerd.soak.checks import EventRecord, Sample
from peerd.soak.netns import Loopback, Unsupported

# ---- schedules ----------------------------------------------------------------


def test_schedule_from_toml_sorted_with_defaults():
    events = sch.parse_schedule(
        """
        [[event]]
        at = 40
        kind = "partition"
        peer = 2
        [[event]]
        at = 10
        kind = "kill_worker"
        peer = 0
        [[event]]
        at = 50
        kind = "join"
        [[event]]
        at = 60
        kind = "slowdown"
        peer = 1
        factor = 3
        """, "s.toml")
    assert [e.kind for e in events] == ["kill_worker", "partition", "join", "slowdown"]
    assert events[1].down_s == 10.0  # the default outage
    assert events[2].peer == -1  # a new peer
    assert events[3].factor == 3.0


def test_schedule_from_json():
    events = sch.parse_schedule('{"events": [{"at": 5, "kind": "kill_daemon", "peer": 1, "down_s": 3}]}',
                                "s.json", json_format=True)
    assert events == [sch.Event(5.0, "kill_daemon", 1, 3.0, 1.0)]


@pytest.mark.parametrize("text, message", [
    ('[[event]]\nat = 1\nkind = "explode"\npeer = 0', "unknown event kind 'explode'"),
    ('[[event]]\nkind = "leave"\npeer = 0', "at is required"),
    ('[[event]]\nat = -1\nkind = "leave"\npeer = 0', "at = -1"),
    ('[[event]]\nat = 1\nkind = "leave"', "peer must be a peer index"),
    ('[[event]]\nat = 1\nkind = "slowdown"\npeer = 0', "factor is required"),
    ('[[event]]\nat = 1\nkind = "slowdown"\npeer = 0\nfactor = 0.5', "factor = 0.5"),
    ('[[event]]\nat = 1\nkind = "leave"\npeer = 0\nwhen = 3', "unknown key(s) when"),
    ('[[event]]\nat = true\nkind = "leave"\npeer = 0', "at = True"),
    ('events = 3', "expected only a list of events under 'event'"),
    ('[[event', "not valid TOML"),
])
def test_schedule_errors_name_the_problem(text, message):
    with pytest.raises(ConfigError, match="s.toml") as info:
        sch.parse_schedule(text, "s.toml")
    assert message in str(info.value)


def test_load_schedule_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read schedule"):
        sch.load_schedule(tmp_path / "nope.toml")


def test_seeded_schedule_is_reproducible_and_bounded():
    a = sch.seeded(7, 8, 600, 20, 60)
    assert a == sch.seeded(7, 8, 600, 20, 60)
    assert a != sch.seeded(8, 8, 600, 20, 60)
    assert [e.at_s for e in a] == [20.0 * i for i in range(1, 28)]  # none in the last 60 s
    assert {e.kind for e in a} == set(sch.SEEDED_KINDS) == set(sch.KINDS) - {sch.FREEZE}  # freeze when asked
    members = set(range(8))
    for e in a:
        if e.kind == sch.JOIN:
            assert e.peer not in members
            members.add(e.peer)
        else:
            assert e.peer in members  # events only hit peers in the job
            if e.kind == sch.LEAVE:
                members.remove(e.peer)
        assert len(members) >= 4
    targets = [e.peer for e in a if e.kind != sch.JOIN]
    assert all(x != y for x, y in zip(targets, targets[1:]))  # never the same peer twice in a row
    assert all(e.down_s == 10.0 for e in a if e.kind in (sch.KILL_DAEMON, sch.PARTITION))


def test_seeded_schedule_only_given_kinds():
    events = sch.seeded(0, 3, 200, 10, 0, kinds=(sch.KILL_WORKER, sch.LEAVE))
    assert {e.kind for e in events} <= {sch.KILL_WORKER, sch.LEAVE}
    assert sum(e.kind == sch.LEAVE for e in events) <= 1  # 3 peers: never fewer than 2 in the job
    with pytest.raises(ConfigError, match="unknown event kind"):
        sch.seeded(0, 3, 100, 10, 0, kinds=("nap",))


def test_a_freeze_names_the_process_it_stops_and_lasts_down_s():
    events = sch.parse_schedule(
        """
        [[event]]
        at = 30
        kind = "freeze"
        peer = 1
        process = "daemon"
        down_s = 4
        [[event]]
        at = 50
        kind = "freeze"
        peer = 2
        process = "worker"
        """, "s.toml")
    assert events == [sch.Event(30.0, sch.FREEZE, 1, 4.0, 1.0, "daemon"),
                      sch.Event(50.0, sch.FREEZE, 2, 10.0, 1.0, "worker")]
    assert [e.describe() for e in events] == ["freeze peer-1 daemon for 4s", "freeze peer-2 worker for 10s"]
    assert sch.parse_schedule('{"events": [{"at": 5, "kind": "freeze", "peer": 0, "process": "worker", "down_s": 2}]}',
                              "s.json", json_format=True) == [sch.Event(5.0, sch.FREEZE, 0, 2.0, 1.0, "worker")]
    assert sch.FREEZE in sch.RESTARTS and sch.FREEZE in sch.OUTAGES  # judged like a restart, after down_s


@pytest.mark.parametrize("text, message", [
    ('[[event]]\nat = 1\nkind = "freeze"\npeer = 0', "process is required for a freeze (daemon or worker"),
    ('[[event]]\nat = 1\nkind = "freeze"\npeer = 0\nprocess = "kernel"',
     "process = 'kernel': expected daemon or worker"),
    ('[[event]]\nat = 1\nkind = "freeze"\nprocess = "worker"', "peer must be a peer index"),
    ('[[event]]\nat = 1\nkind = "freeze"\npeer = 0\nprocess = "worker"\ndown_s = -1', "down_s = -1"),
    ('[[event]]\nat = 1\nkind = "kill_worker"\npeer = 0\nprocess = "worker"', "process is for a freeze only"),
])
def test_freeze_errors_name_the_problem(text, message):
    with pytest.raises(ConfigError, match="s.toml: event 1") as info:
        sch.parse_schedule(text, "s.toml")
    assert message in str(info.value)


def test_a_seeded_schedule_freezes_only_when_asked_for():
    kinds = (sch.KILL_WORKER, sch.FREEZE)
    events = sch.seeded(3, 4, 400, 10, 0, kinds=kinds, down_s=6.0)
    assert events == sch.seeded(3, 4, 400, 10, 0, kinds=kinds, down_s=6.0)
    freezes = [e for e in events if e.kind == sch.FREEZE]
    assert len(freezes) == len(events) // 2  # shuffled rounds of the two kinds
    assert {e.process for e in freezes} == {"daemon", "worker"} and all(e.down_s == 6.0 for e in freezes)
    assert all(e.process == "" for e in events if e.kind != sch.FREEZE)
    assert sch.FREEZE not in {e.kind for e in sch.seeded(3, 4, 400, 10, 0)}


def test_kinds_option_defaults_to_every_kind_but_freeze():
    import argparse

    from peerd.soak.cli import add_arguments, settings_from

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert settings_from(parser.parse_args([])).kinds == sch.SEEDED_KINDS
    assert settings_from(parser.parse_args(["--kinds", "freeze, kill_worker"])).kinds == (sch.FREEZE, sch.KILL_WORKER)
    for bad, message in (("nap", "--kinds: unknown event kind 'nap'"), (",", "name at least one event kind")):
        with pytest.raises(ConfigError, match=message):
            settings_from(parser.parse_args(["--kinds", bad]))


# ---- checks on synthetic runs ------------------------------------------------

PEERS = ("peer-0", "peer-1", "peer-2")


def healthy(t: float, peer: str, **changes) -> Sample:
    base = Sample(t=t, peer=peer, expected_up=True, up=True, linked=True, in_job=True, state="running",
                  phase="training", step=int(10 * t) + 1, round=int(10 * t) + 1, loss=1.0 / (1 + t),
                  metric=0.95, exchange_s=0.2, reached=2, planned=2, view=frozenset(PEERS))
    return replace(base, **changes)


def run_of(seconds: int, change=lambda t, peer: {}) -> list[Sample]:
    return [healthy(float(t), p, **change(t, p)) for t in range(seconds) for p in PEERS]


def test_a_healthy_run_passes_every_check():
    results = ck.run_checks(run_of(60), [], ceiling_s=10, stall_s=20, converge_s=10, goal=ck.Goal(0.9), checkpoints=None)
    verdicts = {c.name: c.verdict for c in results}
    assert list(verdicts.values()) == ["pass", "pass", "skip", "skip", "skip", "skip", "pass"], verdicts


def test_daemon_death_fails_unless_killed_on_purpose():
    died = run_of(30, lambda t, p: {"up": False, "state": "down"} if p == "peer-1" and t > 10 else {})
    check = ck.daemons_alive(died)
    assert check.verdict == "fail" and "peer-1 found dead at 11s" in check.details[0]
    killed = [replace(s, expected_up=False) if s.peer == "peer-1" and s.t > 10 else s for s in died]
    assert ck.daemons_alive(killed).verdict == "pass"


def test_late_exchange_and_stalled_round_fail():
    late = run_of(30, lambda t, p: {"exchange_s": 12.5} if (t, p) == (5, "peer-0") else {})
    check = ck.rounds_within_deadline(late, ceiling_s=10, stall_s=20)
    assert check.verdict == "fail" and "exchange 12.50s" in check.details[0]
    stalled = run_of(60, lambda t, p: {"round": 99} if p == "peer-2" and t >= 20 else {})
    check = ck.rounds_within_deadline(stalled, ceiling_s=10, stall_s=20)
    assert check.verdict == "fail" and "peer-2: round 99" in check.details[0]
    # A partitioned peer's rounds are not its partners' business.
    cut = [replace(s, linked=False) if s.peer == "peer-2" and s.t >= 20 else s for s in stalled]
    assert ck.rounds_within_deadline(cut, ceiling_s=10, stall_s=20).verdict == "pass"


def _restarted(t_back: float, round_back: int, loss_back: float) -> list[Sample]:
    def change(t, p):
        if p != "peer-1" or t < 20:
            return {}
        if t < t_back:
            return {"state": "restarting", "phase": "", "step": 0, "round": 0, "loss": math.nan}
        return {"round": round_back + int(10 * (t - t_back)), "loss": loss_back}
    return run_of(60, change)


def test_restarted_peer_must_resume_from_the_job_and_reach_its_loss():
    event = [EventRecord(20.0, 20.0, sch.KILL_WORKER, "peer-1")]
    good = ck.restarted_resumed(_restarted(30, 300, 0.03), event)
    assert good.verdict == "pass", good.details
    from_scratch = ck.restarted_resumed(_restarted(30, 1, 0.03), event)
    assert from_scratch.verdict == "fail" and "back at round 1" in from_scratch.details[0]
    lagging = ck.restarted_resumed(_restarted(30, 300, 2.0), event)
    assert lagging.verdict == "fail" and "never reached the others'" in lagging.details[0]
    never = ck.restarted_resumed(_restarted(99, 300, 0.03), event)
    assert never.verdict == "fail" and "never trained again" in never.details[0]
    cut = ck.restarted_resumed(_restarted(30, 1, 0.03), [*event, EventRecord(25.0, 35.0, sch.PARTITION, "peer-1")])
    assert cut.verdict == "pass" and cut.evidence == "0/0 restarted peers resumed (1 not judged)"
    assert "not judged, the next event on it came 5s later" in cut.details[0]
    assert ck.restarted_resumed(run_of(10), []).verdict == "skip"


def test_a_frozen_peer_is_judged_like_a_restarted_one():
    def change(t, p):  # peer-1's worker frozen from 20 s to 30 s: its round stands still, then catches up
        if p != "peer-1" or t < 20:
            return {}
        if t < 30:
            return {"round": 201, "frozen": True}
        return {"round": 300 + int(10 * (t - 30)), "loss": 0.03}
    samples = run_of(60, change)
    freeze = [EventRecord(20.0, 30.0, sch.FREEZE, "peer-1", "worker pid 7 stopped (SIGSTOP) for 10.0s")]
    check = ck.restarted_resumed(samples, freeze)
    assert check.verdict == "pass" and check.details[0].startswith("freeze peer-1 at 20s: training at 0s after")
    # Its round stood still for the freeze's 10 s: no stall; the same run unfrozen is one.
    assert ck.rounds_within_deadline(samples, ceiling_s=10, stall_s=5).verdict == "pass"
    thawed = [replace(s, frozen=False) for s in samples]
    assert ck.rounds_within_deadline(thawed, ceiling_s=10, stall_s=5).details == (
        "peer-1: round 201 stood still from 20s to 29s",)
    # A peer that never trains again after its freeze fails the check, as a restarted one does.
    stuck = [replace(s, round=201, phase="syncing") if s.peer == "peer-1" and s.t >= 30 else s for s in samples]
    never = ck.restarted_resumed(stuck, freeze)
    assert never.verdict == "fail" and never.details == ("freeze peer-1 at 20s: never trained again",)

def test_membership_convergence_is_timed_from_each_event():
    def change(t, p):  # peer-2 left at 10 s; peer-0 still sees it until 14 s
        if t < 10:
            return {}
        if p == "peer-2":
            return {"in_job": False, "state": "", "phase": "", "view": frozenset(PEERS[:2])}
        return {"view": frozenset(PEERS if p == "peer-0" and t < 14 else PEERS[:2])}
    samples = run_of(30, change)
    leave = [EventRecord(8.0, 10.0, sch.LEAVE, "peer-2")]
    assert ck.convergence_times(samples, leave) == [4.0]
    assert ck.membership_converged(samples, leave, bound_s=10).verdict == "pass"
    assert ck.membership_converged(samples, leave, bound_s=3).verdict == "fail"
    stuck = [replace(s, view=frozenset(PEERS)) if s.peer == "peer-0" else s for s in samples]
    check = ck.membership_converged(stuck, leave, bound_s=10)
    assert check.verdict == "fail" and "never" in check.details[0]


def test_partition_heals_only_when_views_merge_and_exchanges_resume():
    def change(t, p, gossip=True):
        if 10 <= t < 20:  # peer-2 cut off: alone on its side
            if p == "peer-2":
                return {"linked": False, "view": frozenset({"peer-2"}), "reached": 0}
            return {"view": frozenset(PEERS[:2])}
        if 20 <= t < 23:
            return {"view": frozenset(PEERS[:2] if p != "peer-2" else {"peer-2"})}
        return {} if gossip or p != "peer-2" else {"reached": 0}
    heal = [EventRecord(10.0, 20.0, sch.PARTITION, "peer-2")]
    good = ck.partitions_healed(run_of(40, change), heal, bound_s=10)
    assert good.verdict == "pass" and "one view after 3s" in good.details[0]
    silent = ck.partitions_healed(run_of(40, lambda t, p: change(t, p, gossip=False)), heal, bound_s=10)
    assert silent.verdict == "fail" and "exchanged with no partner" in silent.details[0]
    split = ck.partitions_healed(run_of(40, lambda t, p: change(min(t, 21), p)), heal, bound_s=10)
    assert split.verdict == "fail" and "views did not merge" in split.details[0]


def test_heal_followed_by_another_event_on_the_peer_is_not_judged_past_it():
    def change(t, p):  # peer-2 healed at 20 s, then drained out at 22 s before any exchange
        if 10 <= t < 22 and p == "peer-2":
            return {"linked": t >= 20, "view": frozenset({"peer-2"}), "reached": 0}
        if t >= 22:
            if p == "peer-2":
                return {"in_job": False, "state": "", "phase": "", "view": frozenset(PEERS[:2])}
            return {"view": frozenset(PEERS[:2])}
        return {"view": frozenset(PEERS[:2])} if 10 <= t < 22 else {}
    events = [EventRecord(10.0, 20.0, sch.PARTITION, "peer-2"), EventRecord(22.0, 23.0, sch.LEAVE, "peer-2")]
    check = ck.partitions_healed(run_of(40, change), events, bound_s=10)
    assert check.verdict == "pass" and "not judged, the next event on it came 2s later" in check.details[0]


def test_a_stall_is_reported_once_with_its_length():
    stalled = run_of(60, lambda t, p: {"round": 99} if p == "peer-2" and t >= 20 else {})
    check = ck.rounds_within_deadline(stalled, ceiling_s=10, stall_s=20)
    assert check.details == ("peer-2: round 99 stood still from 20s to 59s",)


def test_checkpoint_check_skips_without_support_and_fails_bad_files():
    assert ck.checkpoints_valid(None).evidence == "skipped: no checkpoints in this build"
    assert ck.checkpoints_valid([]).verdict == "fail"
    bad = ck.checkpoints_valid([("a.ckpt", True, ""), ("b.ckpt", False, "checksum mismatch")])
    assert bad.verdict == "fail" and bad.details == ("b.ckpt: checksum mismatch",)


def test_target_uses_the_peers_in_the_job_at_the_end():
    samples = run_of(20, lambda t, p: {"metric": 0.5} if p == "peer-2" else {})
    assert ck.reached_target(samples, 0.9).verdict == "fail"  # mean (0.95 + 0.95 + 0.5) / 3
    gone = [replace(s, in_job=False) if s.peer == "peer-2" and s.t > 15 else s for s in samples]
    assert ck.reached_target(gone, 0.9).verdict == "pass"


def test_accuracy_target_is_higher_is_better_with_a_default_of_0_9():
    check = ck.reached_target(run_of(20, lambda t, p: {"metric": 0.91} if p == "peer-2" else {}), None)
    assert check.name == "the job reached test accuracy ≥ 0.9"
    assert check.evidence == "mean last test accuracy 0.9367 over 3 peers (best 0.9500; higher is better)"
    assert check.verdict == "pass"


def val_loss_run(values: dict[str, float]) -> list[Sample]:
    """A language-model job: its metric is a validation loss, lower is better."""
    return run_of(20, lambda t, p: {"metric": values[p] + 1.0 / (1 + t)})  # falling, to values[p] + 0.05


def test_a_min_mode_metric_passes_at_or_below_its_target():
    samples = val_loss_run({"peer-0": 1.55, "peer-1": 1.60, "peer-2": 1.70})
    check = ck.reached_target(samples, 1.75, "val_loss", "min")
    assert check.verdict == "pass"
    assert check.name == "the job reached val_loss ≤ 1.75"
    # best is the lowest; nothing says accuracy
    assert check.evidence == "mean last val_loss 1.6667 over 3 peers (best 1.6000; lower is better)"
    assert check.details == ("peer-0: 1.6000 at 19s", "peer-1: 1.6500 at 19s", "peer-2: 1.7500 at 19s")
    checks = ck.run_checks(samples, [], ceiling_s=10, stall_s=20, converge_s=10, goal=ck.Goal(1.75, "val_loss", "min"),
                           checkpoints=None)
    assert [(c.name, c.verdict) for c in checks][-1] == ("the job reached val_loss ≤ 1.75", "pass")


def test_a_min_mode_metric_fails_above_its_target():
    samples = val_loss_run({"peer-0": 1.55, "peer-1": 1.60, "peer-2": 1.70})
    check = ck.reached_target(samples, 1.6, "val_loss", "min")  # a higher-is-better check would pass this
    assert check.verdict == "fail"
    assert check.evidence == "mean last val_loss 1.6667 over 3 peers (best 1.6000; lower is better)"
    assert "accuracy" not in check.name + check.evidence


def test_a_metric_without_a_target_is_reported_not_judged():
    check = ck.reached_target(val_loss_run({"peer-0": 1.5, "peer-1": 1.5, "peer-2": 1.5}), None, "val_loss", "min")
    assert (check.name, check.verdict) == ("the job's val_loss (no target)", "skip")
    assert check.evidence == "mean last val_loss 1.5500 over 3 peers (best 1.5500; lower is better); no --target given"


def test_target_option_and_its_old_name():
    import argparse

    from peerd.soak.cli import add_arguments, settings_from

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert settings_from(parser.parse_args(["--target", "1.7"])).target == 1.7
    assert settings_from(parser.parse_args(["--target-accuracy", "0.8"])).target == 0.8
    assert settings_from(parser.parse_args([])).target is None  # the job's metric decides: 0.9 for accuracy


def test_report_and_live_line_name_the_jobs_metric(tmp_path):
    from peerd.settings.jobspec import parse_job
    from peerd.soak.report import write_report
    from peerd.soak.runner import Run, SoakSettings, _line

    path = Path(__file__).resolve().parents[2] / "peerd" / "examples" / "charlm.toml"
    spec = parse_job(path.read_text(), str(path))
    samples = val_loss_run({"peer-0": 1.55, "peer-1": 1.60, "peer-2": 1.70})
    line = _line(19.0, [s for s in samples if s.t == 19], spec)
    assert line.endswith("best val_loss 1.600")
    run = Run(SoakSettings(target=1.75, out=tmp_path), spec, "127.0.0.1 (test)", "", samples=samples)
    checks = ck.run_checks(samples, [], ceiling_s=10, stall_s=20, converge_s=10,
                           goal=ck.Goal(1.75, spec.metric, spec.metric_mode), checkpoints=None)
    text = write_report(run, checks, tmp_path).read_text()
    assert "metric val_loss (lower is better)" in text
    assert "| peer | state | round | loss | val_loss |" in text
    assert "![val_loss and loss per peer](progress.png)" in text
    assert "accuracy" not in text
    header = (tmp_path / "samples.csv").read_text().splitlines()[0].split(",")
    assert "metric" in header and "accuracy" not in header


def test_loopback_has_no_partitions():
    net = Loopback("t")
    assert net.add_peer(3, 10.0).address == "127.0.0.1"
    with pytest.raises(Unsupported):
        net.set_link(3, up=False)
