"""The Prometheus exporter: every metric read from a daemon's jobs and view,
rendered by prometheus_client and parsed back with its parser."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from peerd.settings.config import DaemonConfig
from peerd.daemon.app import Daemon
from peerd.daemon.jobs import LocalJob, RestartPolicy, WorkerLaunch
from peerd.daemon.metrics import make_registry
from peerd.settings.jobspec import parse_job
from peerd.control.progress import EXCHANGE_BUCKETS_S, empty_progress
from peerd.proto.v1 import control_pb2

from conftest import example_job


def job(tmp_path: Path) -> LocalJob:
    spec = parse_job(example_job(job={"name": "m"}), "job")
    launch = WorkerLaunch("unix:x", "me", "127.0.0.1", 1, tmp_path / "job.toml", "", tmp_path / "worker.log")
    j = LocalJob.create(spec, tmp_path, [launch], RestartPolicy(1.0, 2.0))
    j.first.state, j.first.restarts = "running", 2
    p = empty_progress()
    p.MergeFrom(control_pb2.Progress(
        step=120, round=130, epoch=1, loss=0.25, samples_per_s=900.0, lr=0.05, lr_scale=1.155, samples=3840, segment_misses=3,
        metric=0.9, disagreement=0.01, global_batch=64, local_batch=32, rounds_done=100,
        bytes_sent=4000, bytes_received=5000, exchange_sum_s=2.0, exchange_count=100,
        exchange_buckets=[0, 0, 10, 60, 90, 100, 100, 100, 100, 100, 100], checkpoint_round=120,
        checkpoints_written=4,
    ))
    if "rejected" in control_pb2.Progress.DESCRIPTOR.fields_by_name:
        p.rejected["bad_signature"] = 7
    j.first.progress = p
    return j


def samples(daemon: Daemon) -> dict:
    text = generate_latest(make_registry(daemon)).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_every_job_metric_comes_from_the_workers_progress(tmp_path):
    daemon = Daemon(DaemonConfig(state_dir=tmp_path, peer_id="me", control_socket=tmp_path / "s.sock"))
    daemon.jobs["m"] = job(tmp_path)
    got = samples(daemon)
    m = (("job", "m"),)
    expected = {
        "peerd_rounds_total": 100, "peerd_bytes_sent_total": 4000, "peerd_bytes_received_total": 5000,
        "peerd_segment_failures_total": 3, "peerd_deadline_misses_total": 3,  # the old name, deprecated
        "peerd_samples_total": 3840, "peerd_steps_total": 120, "peerd_checkpoints_written_total": 4,
        "peerd_worker_restarts_total": 2, "peerd_round": 130, "peerd_epoch": 1, "peerd_local_batch": 32, "peerd_global_batch": 64, "peerd_learning_rate": 0.05,
        "peerd_lr_scale": 1.155,
        "peerd_loss": 0.25, "peerd_samples_per_second": 900.0, "peerd_metric": 0.9,
        "peerd_disagreement": 0.01, "peerd_checkpoint_round": 120, "peerd_membership_size": 1,
        "peerd_exchange_seconds_count": 100, "peerd_exchange_seconds_sum": 2.0,
    }
    assert {name: got[(name, m)] for name in expected} == pytest.approx(expected)
    assert got[("peerd_exchange_seconds_bucket", (("job", "m"), ("le", "0.025")))] == 10
    assert got[("peerd_exchange_seconds_bucket", (("job", "m"), ("le", "+Inf")))] == 100
    assert got[("peerd_job_state", (("job", "m"), ("state", "running")))] == 1
    assert got[("peerd_build_info", (("peer_id", "me"), ("realm", "default"), ("version", "0.1.0")))] == 1
    assert got[("peerd_peers_known", ())] == 0
    assert got[("peerd_training", ())] == 1
    if "rejected" in control_pb2.Progress.DESCRIPTOR.fields_by_name:
        assert got[("peerd_rejected_messages_total", (("job", "m"), ("reason", "bad_signature")))] == 7
    else:
        assert not any(name == "peerd_rejected_messages_total" for name, _ in got)


def test_a_worker_that_has_not_reported_yet_gives_empty_buckets_and_nan(tmp_path):
    daemon = Daemon(DaemonConfig(state_dir=tmp_path, peer_id="me", control_socket=tmp_path / "s.sock"))
    j = job(tmp_path)
    j.first.progress = empty_progress()
    daemon.jobs["m"] = j
    got = samples(daemon)
    assert got[("peerd_exchange_seconds_count", (("job", "m"),))] == 0
    assert len([k for k in got if k[0] == "peerd_exchange_seconds_bucket"]) == len(EXCHANGE_BUCKETS_S) + 1
    assert got[("peerd_loss", (("job", "m"),))] != got[("peerd_loss", (("job", "m"),))]  # NaN


def test_several_workers_have_a_series_each(tmp_path):
    config = DaemonConfig(state_dir=tmp_path, peer_id="me", control_socket=tmp_path / "s.sock",
                          worker_devices=("cpu", "cpu"))
    daemon = Daemon(config)
    spec = parse_job(example_job(job={"name": "m"}), "job")
    launches = [WorkerLaunch("unix:x", member, "127.0.0.1", 1, tmp_path / "job.toml", "", tmp_path / f"{k}.log")
                for k, member in enumerate(daemon.members)]
    j = LocalJob.create(spec, tmp_path, launches, RestartPolicy(1.0, 2.0))
    j.workers[1].restarts = 3
    daemon.jobs["m"] = j
    got = samples(daemon)
    assert daemon.members == ["me.0", "me.1"]
    assert got[("peerd_worker_restarts_total", (("job", "m"), ("worker", "me.0")))] == 0
    assert got[("peerd_worker_restarts_total", (("job", "m"), ("worker", "me.1")))] == 3
    assert got[("peerd_membership_size", (("job", "m"),))] == 2


def test_a_collapsed_worker_is_a_1_in_peerd_collapsed(tmp_path):
    daemon = Daemon(DaemonConfig(state_dir=tmp_path, peer_id="me", control_socket=tmp_path / "s.sock"))
    daemon.jobs["m"] = j = job(tmp_path)
    assert samples(daemon)[("peerd_collapsed", (("job", "m"),))] == 0
    j.first.progress.collapsed, j.first.progress.collapse_reason = True, "training collapsed at round 50 (…)"
    assert samples(daemon)[("peerd_collapsed", (("job", "m"),))] == 1
