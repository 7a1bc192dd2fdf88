"""The standby worker: a spare process with torch imported, taken by the next join."""

from __future__ import annotations

import asyncio
import os
import re
import sys

import pytest

from peerd.daemon.standby import Standby

from conftest import example_job, until, wait_for


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead too
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def test_a_closed_standby_leaves_no_process():
    standby = Standby(2, refill_delay_s=3600)  # one per device of a 2-GPU daemon
    await standby.start()
    spares = standby.spares
    assert len(spares) == 2
    await standby.aclose()
    assert all(s.returncode is not None and not _alive(s.pid) for s in spares)
    assert standby.taken == 0
    await standby.start()  # closed: no new spare
    assert standby.spares == []
    with pytest.raises(ValueError):
        Standby(0)


async def test_a_standby_refuses_a_command_line_that_is_not_one():
    standby = Standby(refill_delay_s=3600)
    await standby.start()
    (spare,) = standby.spares
    try:
        spare.stdin.write(b'{"not": "a list"}\n')
        await spare.stdin.drain()
        spare.stdin.close()
        output = await asyncio.wait_for(spare.stdout.read(), 120)
        assert await spare.wait() != 0
        assert b"expected a JSON list" in output
    finally:
        await standby.aclose()


async def test_the_standby_runs_the_command_line_it_is_given_and_is_replaced(tmp_path):
    standby = Standby(refill_delay_s=0.5)
    await standby.start()
    try:
        # A worker command line with a job file that does not parse: the standby
        # must run it as the worker would, and fail the same way (exit code 2).
        spec = tmp_path / "job.toml"
        spec.write_text("[job]\nname = 3\n")
        process = await standby.launch([sys.executable, "-m", "peerd.worker", "--control", "unix:/nonexistent",
                                        "--spec", str(spec), "--peer-id", "p"])
        assert process is not None and standby.taken == 1
        output = await asyncio.wait_for(process.stdout.read(), 120)
        assert await process.wait() == 2, output
        assert b"name" in output
        await until(lambda: standby.spares, "a new spare after the first was taken")
        assert [s.pid for s in standby.spares] != [process.pid] and len(standby.spares) == 1
    finally:
        await standby.aclose()


@pytest.mark.e2e
def test_a_join_starts_its_worker_in_the_standby(local_cluster):
    cluster = local_cluster(1, settings=lambda peer: {"worker": {"standby": True}})
    (peer,) = cluster.peers
    log = peer.dir / "daemon.log"
    spare = int(wait_for(lambda: re.search(r"standby worker pid (\d+) started", log.read_text()), 30,
                         "the standby to start").group(1))
    cluster.client(peer).join(example_job(job={"name": "warm", "epochs": 1, "eval_every_rounds": 1000}))
    started = wait_for(lambda: re.search(r"worker \S+ pid (\d+) started on \S+ \((.*?)\)", log.read_text()), 60,
                       "the worker to start")
    assert int(started.group(1)) == spare and started.group(2) == "from the standby"
    job = wait_for(lambda: [j for j in cluster.client(peer).status().jobs if j.state == "finished"], 300,
                   "the job to finish")[0]
    assert job.progress.metric > 0.5
    cluster.close()
    assert not _alive(spare)
