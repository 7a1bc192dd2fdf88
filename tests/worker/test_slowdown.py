"""The slowdown knob's sleep on its two clocks (peerd.core.slowdown), and the
shell that reads them (peerd.worker.train.slowdown)."""

from __future__ import annotations

import math

import pytest

from peerd.core.slowdown import Slowdown


def test_wall_clock_sleeps_for_the_steps_wall_time():
    # A step that waited 0.3 s for the CPU on a busy machine: the wall clock
    # makes the slow device pay for that wait too.
    assert Slowdown(4.0, "wall").sleep_s(wall_s=0.5, cpu_s=0.2) == pytest.approx(1.5)


def test_cpu_clock_sleeps_for_the_steps_cpu_time_only():
    assert Slowdown(4.0, "cpu").sleep_s(wall_s=0.5, cpu_s=0.2) == pytest.approx(0.6)


def test_the_default_is_the_wall_clock_at_full_speed():
    assert Slowdown() == Slowdown(1.0, "wall")
    assert Slowdown().sleep_s(1.0, 1.0) == 0.0
    assert Slowdown(1.0, "cpu").sleep_s(1.0, 1.0) == 0.0


def test_a_clock_that_went_backwards_sleeps_nothing():
    assert Slowdown(2.0, "cpu").sleep_s(wall_s=0.1, cpu_s=-1e-6) == 0.0


@pytest.mark.parametrize("factor, clock", [(0.5, "wall"), (math.nan, "wall"), (math.inf, "cpu"), (2.0, "process")])
def test_bad_settings_are_refused(factor, clock):
    with pytest.raises(ValueError):
        Slowdown(factor, clock)


@pytest.mark.parametrize("clock, pause", [("cpu", 0.01), ("wall", 0.05)])
def test_the_shell_sleeps_after_a_step_by_the_clock_it_was_given(clock, pause):
    """A step of 0.05 s wall time that used 0.01 s of CPU (it waited for the CPU
    the rest of the time), at f = 2: the cpu clock sleeps 0.01 s after it, the
    wall clock 0.05 s; finish() returns the step's wall time with the sleep."""
    from peerd.worker.train.slowdown import SlowedSteps

    now = {"wall": 10.0, "cpu": 3.0}
    slept = []

    def sleep(s):
        slept.append(s)
        now["wall"] += s

    steps = SlowedSteps(Slowdown(2.0, clock), cpu=lambda: now["cpu"], wall=lambda: now["wall"], sleep=sleep)
    steps.start()
    now["wall"] += 0.05
    now["cpu"] += 0.01
    assert steps.finish() == pytest.approx(0.05 + pause)
    assert slept == [pytest.approx(pause)]


def test_the_cpu_clock_is_the_threads_own_with_one_torch_thread():
    import time

    import torch

    from peerd.worker.train.slowdown import cpu_clock

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert cpu_clock() is time.thread_time  # the worker's other threads are not counted
        torch.set_num_threads(2)
        assert cpu_clock() is time.process_time  # torch's pool runs the step's work
    finally:
        torch.set_num_threads(threads)


def test_the_daemon_passes_the_clock_to_its_workers(tmp_path):
    from peerd.settings.config import parse_config
    from peerd.daemon.jobs import WorkerLaunch
    from peerd.worker.main import parse_args

    config = parse_config({"worker": {"slowdown": 3.0, "slowdown_clock": "cpu"}}, "test")
    launch = WorkerLaunch("unix:/x.sock", "p", "127.0.0.1", 1, tmp_path / "job.toml", "", tmp_path / "w.log",
                          slowdown=config.slowdown, slowdown_clock=config.slowdown_clock)
    args = parse_args(launch.argv()[3:])
    assert (args.slowdown, args.slowdown_clock) == (3.0, "cpu")
    assert parse_args(WorkerLaunch("unix:/x.sock", "p", "127.0.0.1", 1, tmp_path / "job.toml", "",
                                   tmp_path / "w.log").argv()[3:]).slowdown_clock == "wall"
