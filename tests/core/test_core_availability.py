"""Whether a shared machine trains now, its owner first: pure decisions driven
with explicit clocks, samples and process tables."""

from datetime import datetime, timedelta

import pytest
from hypothesis import given, settings, strategies as st

from peerd.core.availability import (
    ALWAYS, FOREVER, WHEN_FREE, Gate, Proc, Settings, Snapshot, Use, busy_reason, cpu_uses, decide, descendants,
    gpu_uses, is_peerd, parse_duration,
)
from peerd.core.windows import parse_window

NOON = datetime(2026, 3, 4, 12, 0)  # a Wednesday
FREE = Settings(mode=WHEN_FREE, hold_off_s=30.0)


def check(s: Settings, gate: Gate, now_s: float, busy: str | None = "", local: datetime = NOON,
          paused_until: datetime | None = None):
    return decide(s, gate, now_s, local, paused_until, busy)


# ---- is the machine free, given these samples --------------------------------------


def test_a_process_above_the_cpu_share_makes_the_machine_busy_and_is_named():
    uses = [Use(10, "bash", cores=0.1), Use(4242, "python", cores=1.3), Use(7, "make", cores=0.8)]
    assert busy_reason(uses, 0.5) == "busy: pid 4242 python uses 1.3 cores"
    assert busy_reason(uses, 1.5) == ""


def test_any_process_on_a_gpu_makes_the_machine_busy():
    uses = [Use(9, "python", cores=2.0), Use(31, "blender", gpu=1, gpu_bytes=3 * 2**30)]
    assert busy_reason(uses, 0.5) == "busy: pid 31 blender holds GPU 1 (3.0 GiB)"


def test_with_commands_listed_only_those_programs_are_the_owners():
    uses = [Use(1, "pytest", cores=1.0), Use(2, "matlab", cores=0.7)]
    assert busy_reason(uses, 0.5, ("matlab",)) == "busy: pid 2 matlab uses 0.7 cores"
    assert busy_reason(uses, 0.5, ("blender",)) == ""


def test_cpu_use_is_the_time_a_process_took_over_the_time_between_two_looks():
    before = Snapshot(100.0, {5: Proc(1, 50, 1000, "python"), 6: Proc(1, 60, 10, "vim")})
    after = Snapshot(102.0, {5: Proc(1, 50, 1300, "python"), 6: Proc(1, 60, 12, "vim")})
    uses = {u.pid: u.cores for u in cpu_uses(before, after, hz=100)}
    assert uses == {5: pytest.approx(1.5), 6: pytest.approx(0.01)}


def test_a_process_started_between_two_looks_counts_all_its_time_and_a_reused_pid_is_a_new_process():
    before = Snapshot(100.0, {5: Proc(1, 50, 9000, "old")})
    after = Snapshot(101.0, {5: Proc(1, 10_050, 80, "burn"), 8: Proc(1, 10_020, 40, "cc")})
    assert {u.pid: (u.name, u.cores) for u in cpu_uses(before, after, hz=100)} == {
        5: ("burn", pytest.approx(0.8)), 8: ("cc", pytest.approx(0.4))}


def test_peerds_own_processes_and_their_children_are_never_the_owner():
    procs = {
        100: Proc(1, 1, 0, "python", ("python", "-m", "peerd.cli.daemon", "--config", "x")),
        101: Proc(100, 1, 0, "python", ("python", "-m", "peerd.worker", "--spec", "j")),
        102: Proc(101, 1, 0, "python", ("python", "-c", "from multiprocessing...")),  # a DataLoader worker
        200: Proc(1, 1, 0, "peerd", ("/usr/bin/peerd", "--config", "y")),  # another daemon (one per GPU)
        300: Proc(1, 1, 0, "python", ("python", "burn.py")),
        400: Proc(7, 1, 0, "sh", ("sh",)),
    }
    later = {pid: Proc(p.ppid, p.start_ticks, p.cpu_ticks + 100, p.name, p.argv) for pid, p in procs.items()}
    uses = cpu_uses(Snapshot(10.0, procs), Snapshot(11.0, later), hz=100, own=[400])
    assert [u.pid for u in uses] == [300]


def test_gpu_holders_are_named_from_proc_less_peerds_workers():
    argvs = {11: ("python", "-m", "peerd.worker"), 12: ("python", "train.py")}
    uses = gpu_uses([(11, 0, 2**30), (12, 0, 2**29), (13, 1, 0)], {12: "python"}, {11: 1, 12: 1, 13: 1}, argvs)
    assert uses == [Use(12, "python", gpu=0, gpu_bytes=2**29), Use(13, "?", gpu=1)]


def test_a_command_line_says_whether_a_process_is_peerd():
    assert is_peerd(["/opt/venv/bin/peerd", "--config", "/etc/peerd/peerd.toml"])
    assert is_peerd(["python3", "-m", "peerd.worker", "--standby"])
    assert is_peerd(["peerctl", "status"])
    assert not is_peerd(["python", "-m", "pytest"]) and not is_peerd([])


def test_descendants_follow_the_parent_links_down():
    assert descendants({2: 1, 3: 2, 4: 3, 5: 1, 6: 9}, [2]) == {2, 3, 4}


# ---- what to do -----------------------------------------------------------------


def test_always_trains_unless_paused_or_outside_its_windows():
    s = Settings(mode=ALWAYS)
    assert check(s, Gate(), 0.0, busy=None)[1].train
    assert check(s, Gate(), 0.0, busy="busy: pid 1 x uses 3.0 cores")[1].train, "mode always ignores the owner"


def test_a_pause_wins_and_says_until_when():
    gate, verdict = check(FREE, Gate(0.0), 100.0, paused_until=NOON + timedelta(hours=6))
    assert not verdict.train and verdict.reason == "paused by owner until 18:00" and not verdict.owner_busy
    assert check(FREE, gate, 101.0, paused_until=FOREVER)[1].reason == "paused by owner"
    assert check(FREE, gate, 101.0, paused_until=NOON - timedelta(seconds=1))[1].train, "an ended pause is none"


def test_outside_its_windows_the_machine_says_when_it_trains_again():
    s = Settings(windows=(parse_window("22:00-07:00"),))
    assert check(s, Gate(), 0.0)[1].reason == "outside its windows until 22:00"
    assert check(s, Gate(), 0.0, local=NOON.replace(hour=23))[1].train


def test_the_owner_arriving_stops_training_at_once_and_leaving_needs_the_hold_off():
    gate, verdict = check(FREE, Gate(0.0), 100.0)
    assert verdict.train
    gate, verdict = check(FREE, gate, 101.0, busy="busy: pid 4242 python uses 1.3 cores")
    assert (verdict.train, verdict.reason, verdict.owner_busy) == (False, "busy: pid 4242 python uses 1.3 cores", True)
    gate, verdict = check(FREE, gate, 102.0)
    assert not verdict.train and verdict.reason == "free for 0s of the 30s hold-off"
    gate, verdict = check(FREE, gate, 131.9)
    assert not verdict.train
    assert check(FREE, gate, 132.0)[1].train


def test_a_daemon_that_has_not_sampled_yet_waits_for_a_sample():
    gate, verdict = check(FREE, Gate(), 0.0, busy=None)
    assert not verdict.train and gate.free_since is None


def test_a_pause_does_not_reset_the_hold_off_of_a_free_machine():
    gate, _ = check(FREE, Gate(), 0.0)
    gate, verdict = check(FREE, gate, 40.0, paused_until=FOREVER)
    assert not verdict.train and check(FREE, gate, 41.0)[1].train


checks = st.lists(st.tuples(st.floats(0.1, 20.0), st.booleans()), min_size=1, max_size=40)


@settings(max_examples=200, deadline=None)
@given(checks, st.floats(0.0, 60.0))
def test_the_machine_never_trains_while_busy_nor_within_the_hold_off_after_it(samples, hold_off):
    s, gate, now, last_busy = Settings(mode=WHEN_FREE, hold_off_s=hold_off), Gate(), 0.0, 0.0
    for step, busy in samples:
        now += step
        gate, verdict = check(s, gate, now, busy="busy: pid 1 x uses 1.0 cores" if busy else "")
        last_busy = now if busy else last_busy
        if verdict.train:
            assert not busy and now - last_busy >= hold_off
        else:
            assert verdict.reason and verdict.owner_busy


# ---- peerctl pause --for ------------------------------------------------------------


@pytest.mark.parametrize("text, seconds", [("20s", 20), ("90m", 5400), ("1h30m", 5400), ("2d", 172800),
                                           ("45", 45), ("1.5h", 5400), ("250ms", 0.25)])
def test_a_duration_reads_as_people_write_it(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "soon", "20x", "-5s", "0s", "h", "1h 30"])
def test_a_duration_that_is_not_one_is_refused(text):
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)
