"""Operations end to end, with real daemons and workers: SIGTERM mid-round
(bounded, checkpointed, the others go on), resume from a checkpoint when alone,
Prometheus metrics that move as rounds complete, one-line logs."""

from __future__ import annotations

import signal
import subprocess
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from peerd.errors import PeerdError
from peerd.settings.jobspec import parse_job
from peerd.worker.state.checkpoint import CheckpointDir
from peerd.worker.train.trainer import Trainer

from conftest import example_job, free_port, wait_for, wait_for_discovery

pytestmark = pytest.mark.e2e
STOP_TIMEOUT_S = 20.0


def checkpoints_of(peer, text: str) -> CheckpointDir:
    """The peer's checkpoints of the job, read as its worker reads them (the layout
    of the whole training state: parameters, SGD momentum, the extra part)."""
    spec = parse_job(text, "job")
    state = Trainer(spec, peer.peer_id).state
    return CheckpointDir(peer.dir / "state" / "jobs" / spec.name / "checkpoints", spec.name,
                         state.fingerprint(spec.fingerprint), state.numel)


def job_of(cluster, peer):
    try:
        jobs = cluster.client(peer).status().jobs
    except PeerdError:  # not serving yet
        return None
    return jobs[0] if jobs else None


def test_sigterm_mid_round_checkpoints_and_a_lone_restart_resumes_from_it(local_cluster):
    cluster = local_cluster(2, settings=lambda peer: {"daemon": {"stop_timeout_s": STOP_TIMEOUT_S}})
    steady, victim = cluster.peers
    wait_for_discovery(cluster)
    text = example_job(job={"name": "sigterm", "epochs": 50}, checkpoint={"every_rounds": 10})
    for peer in cluster.peers:
        cluster.client(peer).join(text)
    wait_for(lambda: all((j := job_of(cluster, p)) and j.progress.round >= 25 for p in cluster.peers), 120,
             "both peers to train 25 rounds")

    # SIGTERM while training: the daemon stops in order and exits 0 within its bound.
    victim.process.send_signal(signal.SIGTERM)
    try:
        code = victim.process.wait(timeout=STOP_TIMEOUT_S + 15)  # slack for a loaded machine
    except subprocess.TimeoutExpired:
        pytest.fail(f"the daemon did not stop within {STOP_TIMEOUT_S}s of SIGTERM")
    assert code == 0
    ckpt = checkpoints_of(victim, text).load_newest()
    assert ckpt is not None and ckpt.meta.round >= 25 and ckpt.meta.step > 0
    log = (victim.dir / "state" / "jobs" / "sigterm" / "worker.log").read_text()
    assert "leaving at round" in log and "stopped by signal" in log
    daemon_log = (victim.dir / "daemon.log").read_text()
    assert "logger=peerd.worker job=sigterm" in daemon_log  # the worker's records reach the daemon's stderr
    assert "stopping: health NOT_SERVING" in daemon_log

    # The other peer goes on training without it.
    at_stop = job_of(cluster, steady).progress.round
    wait_for(lambda: job_of(cluster, steady).progress.round >= at_stop + 10, 120, "the other peer to go on")

    # Alone again (the other daemon stopped too), the restarted peer resumes the
    # job from its own checkpoint, not from scratch.
    steady.process.send_signal(signal.SIGTERM)
    assert steady.process.wait(timeout=STOP_TIMEOUT_S + 15) == 0
    cluster.start(victim)
    job = wait_for(lambda: (j := job_of(cluster, victim)) and j.state == "running" and j.progress.step and j, 120,
                   "the restarted daemon to resume the job")
    log = (victim.dir / "state" / "jobs" / "sigterm" / "worker.log").read_text()
    assert f"resumed from checkpoint {ckpt.path.name}: round {ckpt.meta.round}, step {ckpt.meta.step}" in log
    assert job.progress.step >= ckpt.meta.step and job.progress.round >= ckpt.meta.round
    assert job.progress.checkpoint_round >= ckpt.meta.round


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        assert reply.status == 200
        text = reply.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_metrics_are_served_and_move_as_rounds_complete(local_cluster):
    ports = {0: free_port(), 1: free_port()}
    cluster = local_cluster(2, settings=lambda peer: {"metrics": {"port": ports[peer.index]}})
    wait_for_discovery(cluster)
    port = ports[0]
    before = scrape(port)
    assert before[("peerd_peers_known", ())] == 1
    assert before[("peerd_peers_suspected", ())] == 0
    text = example_job(job={"name": "metered", "epochs": 50})
    for peer in cluster.peers:
        cluster.client(peer).join(text)
    job = (("job", "metered"),)
    # Served bytes move once the partner's view holds this peer (Hello, about a second):
    # on a quiet machine that is many rounds after the first ones.
    wait_for(lambda: (m := scrape(port)).get(("peerd_rounds_total", job), 0) >= 5
             and m.get(("peerd_bytes_sent_total", job), 0) > 0, 120, "5 rounds and served bytes in the metrics")
    first = scrape(port)
    wait_for(lambda: scrape(port)[("peerd_rounds_total", job)] >= first[("peerd_rounds_total", job)] + 5, 120,
             "5 more rounds")
    second = scrape(port)
    for name in ("peerd_rounds_total", "peerd_bytes_sent_total", "peerd_bytes_received_total",
                 "peerd_exchange_seconds_count", "peerd_samples_total"):
        assert second[(name, job)] > first[(name, job)] > 0, name
    assert second[("peerd_exchange_seconds_bucket", (("job", "metered"), ("le", "+Inf")))] == \
        second[("peerd_exchange_seconds_count", job)]
    assert second[("peerd_membership_size", job)] == 2
    # The last step's batch: 32, or less for an epoch's last step (a peer that trained
    # part of an epoch alone reads a tail of any length).
    assert 0 < second[("peerd_local_batch", job)] <= 32
    assert second[("peerd_global_batch", job)] == 64
    assert second[("peerd_learning_rate", job)] > 0 and second[("peerd_loss", job)] > 0
    assert second[("peerd_samples_per_second", job)] > 0
    # The DBS step model's parts, timed apart by peerd's own loop.
    assert second[("peerd_step_fixed_seconds", job)] > 0 and second[("peerd_step_seconds_per_sample", job)] > 0
    # Where the time went: steps and the waits between them, within the wall time
    # since training started (each read at the same round's report).
    waits = {cause: second[("peerd_waited_seconds_total", (("cause", cause), ("job", "metered")))]
             for cause in ("round", "evaluate", "checkpoint")}
    training = second[("peerd_training_seconds_total", job)]
    assert second[("peerd_training_seconds_total", job)] > first[("peerd_training_seconds_total", job)]
    assert 0 < second[("peerd_compute_seconds_total", job)] < training
    assert waits["round"] > 0 and all(w >= 0 for w in waits.values())
    assert second[("peerd_compute_seconds_total", job)] + sum(waits.values()) <= training
    assert second[("peerd_job_state", (("job", "metered"), ("state", "running")))] == 1
    with pytest.raises(urllib.error.HTTPError, match="404"):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/nothing", timeout=10)


def test_status_shows_the_steps_of_a_round_still_under_way(local_cluster):
    """A round of many local steps (a big model's, minutes long): the status moves
    with each heartbeat, not only when a round ends. Here no round ends at all
    before the job does (period_steps is larger than the whole job)."""
    cluster = local_cluster(1)
    peer = cluster.peers[0]
    cluster.client(peer).join(example_job(job={"name": "long-rounds", "epochs": 2},
                                          gossip={"period_steps": 100_000}))
    job = wait_for(lambda: (j := job_of(cluster, peer)) and j.progress.phase == "training"
                   and j.progress.step >= 10 and j, 120, "the status to show steps before any round ends")
    p = job.progress
    assert p.round == 0 and p.rounds_done == 0
    assert p.samples >= 10 * 32 and p.compute_s > 0 and 0 < p.compute_s <= p.training_s
