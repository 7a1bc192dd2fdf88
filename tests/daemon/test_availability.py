"""A shared machine's owner comes first: the daemon's shell around
peerd.core.availability (the pause, its file, the transitions), the samplers
(/proc, NVML against a stand-in with the same calls), and pause and resume
through the control API of in-process daemons."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from peerd.core.availability import WHEN_FREE, Settings, Use
from peerd.daemon.availability import Availability
from peerd.daemon.usage import CpuSampler, GpuSampler, open_sampler, read_proc

from conftest import until


class Jobs:
    """The daemon as the availability loop sees it: counts what it was told."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def hold_jobs(self, reason: str) -> int:
        self.calls.append(f"hold: {reason}")
        return 1

    async def release_jobs(self) -> int:
        self.calls.append("release")
        return 1


class Clocks:
    def __init__(self) -> None:
        self.mono, self.wall = 1000.0, 1_772_625_600.0  # a Wednesday, noon UTC

    def tick(self, s: float) -> None:
        self.mono += s
        self.wall += s


class Samples:
    """A sampler that reports what the test says the owner runs."""

    what = "a stand-in"

    def __init__(self) -> None:
        self.uses: list[Use] | None = []

    def sample(self) -> list[Use] | None:
        return self.uses


def availability(tmp_path, jobs, clocks, settings=Settings(), sampler=None) -> Availability:
    return Availability(settings, tmp_path, jobs, clock=lambda: clocks.mono, wall=lambda: clocks.wall,
                        sampler=sampler)


async def test_a_pause_makes_the_jobs_leave_and_its_end_brings_them_back(tmp_path):
    jobs, clocks = Jobs(), Clocks()
    a = availability(tmp_path, jobs, clocks)
    assert a.training and await a.check() and jobs.calls == []
    reason = await a.pause(20.0)
    assert reason.startswith("paused by owner until ") and jobs.calls == [f"hold: {reason}"]
    clocks.tick(19.0)
    assert not (await a.check()).train
    clocks.tick(1.0)
    assert (await a.check()).train and jobs.calls[-1] == "release" and len(jobs.calls) == 2


async def test_resume_ends_a_pause_early_and_a_pause_without_end_waits_for_it(tmp_path):
    jobs, clocks = Jobs(), Clocks()
    a = availability(tmp_path, jobs, clocks)
    assert await a.pause(0) == "paused by owner"
    clocks.tick(10 * 86400)
    assert not (await a.check()).train
    assert await a.resume() == "" and a.training and jobs.calls == ["hold: paused by owner", "release"]


async def test_a_pause_outlives_a_restart_of_the_daemon_and_an_ended_one_is_forgotten(tmp_path):
    jobs, clocks = Jobs(), Clocks()
    await availability(tmp_path, jobs, clocks).pause(60.0)
    assert not availability(tmp_path, Jobs(), clocks).training, "restarted within the pause"
    clocks.tick(61.0)
    assert availability(tmp_path, Jobs(), clocks).training, "restarted after it"


async def test_the_owners_process_makes_the_jobs_leave_and_the_hold_off_brings_them_back(tmp_path):
    jobs, clocks, samples = Jobs(), Clocks(), Samples()
    a = availability(tmp_path, jobs, clocks, Settings(mode=WHEN_FREE, hold_off_s=5.0), samples)
    assert not a.training, "a daemon that has not looked does not know the machine is free"
    await a.check()
    clocks.tick(5.0)
    assert (await a.check()).train and jobs.calls == ["release"]
    samples.uses = [Use(4242, "python", cores=1.3)]
    clocks.tick(1.0)
    assert (await a.check()).reason == "busy: pid 4242 python uses 1.3 cores"
    assert jobs.calls[-1] == "hold: busy: pid 4242 python uses 1.3 cores"
    samples.uses = []
    for _ in range(5):  # free from the first check that saw it free: for 0 s, then 1 s, ... 4 s
        clocks.tick(1.0)
        assert not (await a.check()).train
    clocks.tick(1.0)
    assert (await a.check()).train and jobs.calls[-1] == "release" and len(jobs.calls) == 3


# ---- the samplers -------------------------------------------------------------------


def test_proc_is_read_for_parents_start_and_cpu_time_even_with_odd_names(tmp_path):
    (tmp_path / "uptime").write_text("350.25 600.00\n")
    (tmp_path / "77").mkdir()
    # comm may hold spaces and parentheses: it ends at the last ')'.
    (tmp_path / "77" / "stat").write_text("77 (my (odd) prog) R 12 77 77 0 -1 4194304 1 0 0 0 "
                                          "150 30 0 0 20 0 1 0 9000 0 0\n")
    (tmp_path / "77" / "cmdline").write_bytes(b"python\0-m\0peerd.worker\0")
    (tmp_path / "self").mkdir()
    snapshot = read_proc(tmp_path)
    p = snapshot.procs[77]
    assert snapshot.uptime_s == 350.25 and list(snapshot.procs) == [77]
    assert (p.ppid, p.start_ticks, p.cpu_ticks, p.name, p.argv) == (12, 9000, 180, "my (odd) prog",
                                                                      ("python", "-m", "peerd.worker"))


def test_a_process_burning_a_core_is_seen_by_the_cpu_sampler_and_the_daemons_own_children_are_not():
    burn = [sys.executable, "-c", "while True: pass"]
    # A stand-in daemon whose child burns a core too: a worker, never the owner.
    daemon = subprocess.Popen([sys.executable, "-c", f"import subprocess; subprocess.run({burn!r})"])
    owner, children = None, []
    try:
        sampler = CpuSampler(own_pid=daemon.pid)
        assert sampler.sample() is None, "the first look has nothing to compare with"
        owner = subprocess.Popen(burn)
        time.sleep(1.0)
        uses = {u.pid: u for u in sampler.sample()}
        children = [pid for pid, p in read_proc().procs.items() if p.ppid == daemon.pid]
    finally:
        for process in filter(None, (owner, daemon)):
            process.kill()
            process.wait()
        for pid in children:
            os.kill(pid, 9)
    assert uses[owner.pid].cores > 0, uses[owner.pid]  # what it got of a core on a busy machine
    assert children and not set(children) & set(uses) and daemon.pid not in uses


class FakeNvml:
    """nvidia-ml-py's calls the GPU sampler makes, on two GPUs."""

    class NVMLError(Exception):
        pass

    def __init__(self, processes: dict[int, list]) -> None:
        self.processes, self.shut = processes, False

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shut = True

    def nvmlDeviceGetCount(self):
        return len(self.processes)

    def nvmlDeviceGetHandleByIndex(self, index):
        return ("handle", index)

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return [SimpleNamespace(pid=pid, usedGpuMemory=size) for pid, size in self.processes[handle[1]]]


def test_the_gpu_sampler_names_the_owners_process_on_a_gpu_and_leaves_peerds_out():
    worker = subprocess.Popen([sys.executable, "-m", "peerd.worker", "--standby"], stdin=subprocess.PIPE)
    try:
        nvml = FakeNvml({0: [(worker.pid, 2**30)], 1: [(os.getppid(), None)]})
        sampler = GpuSampler(nvml, own_pid=os.getpid())
        uses = sampler.sample()
        sampler.close()
    finally:
        worker.kill()
        worker.wait()
    assert [(u.pid, u.gpu, u.gpu_bytes) for u in uses] == [(os.getppid(), 1, 0)]
    assert sampler.what == "2 GPU(s) (NVML)" and nvml.shut


def test_without_nvml_or_without_gpus_the_cpu_is_watched():
    def missing():
        raise ImportError("No module named 'pynvml'")

    assert isinstance(open_sampler(2, missing), CpuSampler)
    assert isinstance(open_sampler(0, lambda: FakeNvml({})), CpuSampler)
    assert isinstance(open_sampler(1, lambda: FakeNvml({0: []})), GpuSampler)


# ---- through the control API --------------------------------------------------------


async def test_pause_and_resume_through_the_control_api_and_the_hello_tells_the_other_daemons(daemons):
    from peerd.proto.v1 import control_pb2
    from peerd.daemon.services import ControlServicer

    alpha = await daemons("alpha")
    beta = await daemons("beta", seeds=(alpha.peer_address,))
    control = ControlServicer(alpha)
    reply = await control.Pause(control_pb2.PauseRequest(for_s=3600), None)
    assert reply.not_training.startswith("paused by owner until ")
    assert alpha.status().not_training == reply.not_training
    await until(lambda: any(p.not_training == reply.not_training for p in beta.list_peers().peers),
                "beta to show why alpha does not train")
    assert (await control.Resume(control_pb2.ResumeRequest(), None)).not_training == ""
    await until(lambda: all(p.not_training == "" for p in beta.list_peers().peers), "beta to see alpha train again")
    assert not (alpha.config.state_dir / "pause.json").exists()
