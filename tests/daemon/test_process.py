"""Whose heartbeat a daemon believes: its worker's process or a descendant of it
(peerd.daemon.process.descends_from), read from /proc."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from peerd.daemon.app import Daemon
from peerd.daemon.jobs import LocalJob, RestartPolicy, WorkerLaunch
from peerd.daemon.process import descends_from
from peerd.errors import UnknownJob
from peerd.settings.jobspec import parse_job
from peerd.proto.v1 import control_pb2

from conftest import daemon_config, example_job


def test_a_process_descends_from_itself_and_its_ancestors_not_from_a_stranger():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert descends_from(child.pid, child.pid)
        assert descends_from(child.pid, os.getpid())  # a script job's child reports: still ours
        assert not descends_from(os.getpid(), child.pid)  # the daemon's worker is the child, not us
        assert not descends_from(child.pid, 0)  # no worker process started: nobody's heartbeat is its
    finally:
        child.kill()
        child.wait()
    assert not descends_from(child.pid, os.getpid())  # gone: its heartbeat cannot be believed


async def test_a_daemon_believes_only_its_own_workers_heartbeat(tmp_path):
    """After a kill -9 and a restart, the daemon's worker left from before may still
    run and beat against the same control socket: the new daemon refuses it (so
    it leaves) instead of taking its report for its new worker's."""
    daemon = Daemon(daemon_config(tmp_path, "alpha", zeroconf=False))
    spec = parse_job(example_job(job={"name": "reboot"}), "test")
    launch = WorkerLaunch("unix:/nowhere", "alpha", "127.0.0.1", 1, tmp_path / "job.toml", "", tmp_path / "w.log")
    job = LocalJob.create(spec, tmp_path, [launch], RestartPolicy(1.0, 1.0))
    daemon.jobs[spec.name] = job
    worker = job.first
    ours = await asyncio.create_subprocess_exec(sys.executable, "-c", "import time; time.sleep(30)")
    # The daemon runs this worker itself: its process is `ours` (as _supervise leaves it).
    worker._process, worker._task = ours, asyncio.ensure_future(ours.wait())
    try:
        report = dict(job=spec.name, address="127.0.0.1:9", fingerprint=spec.fingerprint)
        with pytest.raises(UnknownJob, match="not this daemon's worker"):
            daemon.worker_heartbeat(control_pb2.WorkerReport(pid=os.getpid(), **report))
        assert worker.address == ""  # the stranger's report changed nothing
        daemon.worker_heartbeat(control_pb2.WorkerReport(pid=ours.pid, **report))
        assert worker.address == "127.0.0.1:9"
    finally:
        ours.kill()
        await worker._task
