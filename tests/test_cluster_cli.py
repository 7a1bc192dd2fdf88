"""The README's first command: `peerd cluster` runs a local cluster to the end."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import example_job

pytestmark = pytest.mark.e2e


def test_peerd_cluster_trains_to_the_end_and_reports_the_accuracy(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text(example_job(job={"name": "readme", "epochs": 2, "eval_every_rounds": 20}))
    out = subprocess.run(
        [sys.executable, "-m", "peerd.cli.daemon", "cluster", "--peers", "2", "--job", str(job),
         "--out", str(tmp_path / "run"), "--slowdowns", "1,1.5"],
        capture_output=True, text=True, timeout=400,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "test accuracy reached:" in out.stdout
    assert (tmp_path / "run" / "progress.png").stat().st_size > 0
    assert (tmp_path / "run" / "history.csv").read_text().count("\n") > 2


def test_peerd_cluster_with_two_workers_per_daemon(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text(example_job(job={"name": "pair", "epochs": 2, "eval_every_rounds": 20}))
    out = subprocess.run(
        [sys.executable, "-m", "peerd.cli.daemon", "cluster", "--peers", "1", "--workers", "2", "--job", str(job),
         "--out", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=400,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "peer-0.0: finished" in out.stdout and "peer-0.1: finished" in out.stdout
    assert "(mean of 2 peers)" in out.stdout
