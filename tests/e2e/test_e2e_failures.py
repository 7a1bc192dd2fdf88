"""A job whose training raises, through a real daemon: the exception's message and
the end of its traceback reach where the user looks, `peerctl status` (table and
--json), the live page and `peerd cluster`'s end summary (docs/operations.md,
"When a worker crashes")."""

from __future__ import annotations

import io
import json
import sys
import urllib.request
from pathlib import Path

import pytest
from rich.console import Console

from conftest import peerctl, wait_for
from peerd.cli.cluster import _poll, _summary
from peerd.settings.jobspec import parse_job

pytestmark = pytest.mark.e2e

JOBCODE = Path(__file__).parents[1] / "jobcode"
sys.path.insert(0, str(JOBCODE))
from raise_job import MESSAGE  # noqa: E402

JOB = '[job]\nname = "raises"\nmodule = "raise_job"\nlocal_batch = 8\nepochs = 4\n'


def test_a_job_that_raises_at_step_3_says_why_in_status_on_the_page_and_in_the_cluster_summary(
        local_cluster, tmp_path):
    cluster = local_cluster(1, metrics=True, settings=lambda peer: {"worker": {"max_crashes": 1}})
    [peer] = cluster.peers
    cluster.client(peer).join(JOB, str(JOBCODE))
    job = wait_for(lambda: (j := cluster.client(peer).status().jobs) and j[0].state == "failed" and j[0], 120,
                   "the raising job to fail")
    first, *traceback = job.message.splitlines()
    assert first == f"crashed once in 600s, not restarted; last: RuntimeError: {MESSAGE}"
    assert traceback[-1] == f"RuntimeError: {MESSAGE}" and "raise RuntimeError(MESSAGE)" in traceback[-2]
    assert len(traceback) == 10 and "Traceback (most recent call last):" not in traceback  # its end only

    [shown] = json.loads(peerctl(peer, "status", "--json").stdout)["jobs"]
    assert shown["message"] == job.message and shown["workers"][0]["message"] == job.message
    table = peerctl(peer, "status").stdout
    assert f"raises/peer-0: failed: {first}\n" in table and f"\n    RuntimeError: {MESSAGE}" in table, table

    with urllib.request.urlopen(peer.page_url + "api/status", timeout=10) as reply:
        [view] = json.loads(reply.read())["view"]
    [member] = view["members"]
    assert member["why"] == f"failed: {first}" and member["message"] == job.message

    rows = _poll(cluster, "raises", 0.0)
    out = io.StringIO()
    code = _summary(rows, tmp_path, 1.0, Console(file=out, width=100), parse_job(JOB, "job"))
    lines = out.getvalue().splitlines()
    assert code == 1 and lines[0].startswith("peer-0: failed, ")
    assert lines[1:3] == [f"  why: {first}", f"    {traceback[0]}"]
    assert lines[11] == f"    RuntimeError: {MESSAGE}" and lines[12].startswith("history: ")
