"""End to end: every machine that took part in a job ends with the job's model
(docs/operations.md, "When a member comes back after the end"). A member that
was away at the end (its machine down, its daemon or its worker frozen) or a
newcomer after the end trains nothing alone and ends with the model the job's
members agreed on, byte for byte, taken from their daemons."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
import torch

from conftest import all_finished, example_job, first_jobs, peerctl, round_of, wait_for, wait_for_discovery

pytestmark = pytest.mark.e2e

JOBCODE = Path(__file__).parents[1] / "jobcode"


def model_bytes(peer, job: str) -> bytes:
    return (peer.dir / "state" / "jobs" / job / "model.pt").read_bytes()


def record(peer, job: str) -> dict:
    return json.loads((peer.dir / "state" / "jobs" / job / "model.json").read_text())


def worker_log(peer, job: str) -> str:
    return (peer.dir / "state" / "jobs" / job / "worker.log").read_text()


def test_a_member_back_after_the_end_takes_the_jobs_model_not_its_checkpoints(local_cluster):
    cluster = local_cluster(2)
    steady, victim = cluster.peers
    wait_for_discovery(cluster)
    text = example_job(job={"name": "ended", "epochs": 3, "eval_every_rounds": 20},
                       checkpoint={"every_rounds": 5, "every_s": 0})
    for peer in cluster.peers:
        cluster.client(peer).join(text)
    log_path = victim.dir / "state" / "jobs" / "ended" / "worker.log"
    wait_for(lambda: log_path.exists() and re.search(r"checkpoint of round \d+ written", log_path.read_text()),
             300, "a checkpoint of the victim's")
    victim.process.kill()  # the machine goes down mid-job, an early checkpoint on its disk
    victim.process.wait()
    wait_for(lambda: all_finished(first_jobs(cluster, [steady])), 600, "the other peer to finish the job")

    cluster.start(victim)  # it comes back after the job's end
    cluster.wait_ready()
    [job] = wait_for(lambda: (jobs := cluster.client(victim).status().jobs) and all_finished(jobs[:1]), 180,
                     "the restarted worker to end")
    log = worker_log(victim, "ended")
    assert "the job finished on peer-0 while this worker was away" in log, log[-3000:]
    assert "took the job's model from peer-0" in log, log[-3000:]
    assert "training from round" not in log.split("while this worker was away")[-1]  # nothing trained alone
    assert model_bytes(victim, "ended") == model_bytes(steady, "ended")
    assert record(victim, "ended")["taken_from"] == "peer-0"
    assert record(victim, "ended")["consensus_digest"] == record(steady, "ended")["consensus_digest"]
    assert job.workers[0].progress.model_source == "the job's, from peer-0", job


def test_a_newcomer_after_the_end_trains_nothing_and_takes_the_jobs_model(local_cluster):
    """A script job: the newcomer's script goes on, once its loader is done, with
    the job's model in its own module, not the one it started from."""
    cluster = local_cluster(2)
    first, late = cluster.peers
    wait_for_discovery(cluster)
    text = ('[job]\nname = "over"\nscript = "after_end_script.py"\nepochs = 1\nlocal_batch = 32\n'
            'eval_every_rounds = 1000\n')
    cluster.client(first).join(text, str(JOBCODE))
    wait_for(lambda: all_finished(first_jobs(cluster, [first])), 300, "the first peer to finish the job")
    cluster.client(late).join(text, str(JOBCODE))
    [job] = wait_for(lambda: all_finished(first_jobs(cluster, [late])), 300, "the newcomer to end")
    log = worker_log(late, "over")
    assert "the job finished on peer-0 before this worker came: nothing left to train here" in log, log[-3000:]
    assert job.progress.step == 0
    assert model_bytes(late, "over") == model_bytes(first, "over")
    assert record(late, "over")["taken_from"] == "peer-0"
    jobs = late.dir / "state" / "jobs" / "over"
    held = torch.load(jobs / "after.pt", weights_only=True)
    saved = torch.load(jobs / "model.pt", weights_only=True)
    assert held.keys() == saved.keys() and all(torch.equal(held[k], saved[k]) for k in held)


def _frozen(pid: int, seconds: float) -> None:
    """SIGSTOP for `seconds`, then SIGCONT: the event under test, not a wait for a race."""
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        os.kill(pid, signal.SIGCONT)


@pytest.mark.parametrize("frozen, seconds", [("daemon", 25.0), ("worker", 20.0)])
def test_a_frozen_member_trains_on_and_ends_with_the_jobs_model(local_cluster, frozen, seconds):
    """Whether the job ends during the freeze or after it (the machine's speed
    decides), both members end with one model: an end that left out a member
    that had finished takes that member's model."""
    cluster = local_cluster(2)
    steady, victim = cluster.peers
    wait_for_discovery(cluster)
    text = example_job(job={"name": "frozen", "epochs": 6, "eval_every_rounds": 1000, "min_peers": 2})
    for peer in cluster.peers:
        cluster.client(peer).join(text)
    wait_for(lambda: round_of(cluster, victim) >= 5, 300, "the job to be under way")
    [before] = first_jobs(cluster, [victim])
    _frozen(victim.process.pid if frozen == "daemon" else before.worker_pid, seconds)
    done = wait_for(lambda: all_finished(first_jobs(cluster)), 600, "both peers to finish the job")
    assert model_bytes(victim, "frozen") == model_bytes(steady, "frozen")
    log = worker_log(victim, "frozen")
    # It trained through the freeze (no restart, no lost daemon) and agreed on the end.
    assert "lost the daemon" not in log, log[-3000:]
    assert done[1].worker_pid in (0, before.worker_pid) and done[1].restarts == 0, done[1]
    assert record(victim, "frozen")["consensus_digest"] == record(steady, "frozen")["consensus_digest"]


def test_a_daemon_frozen_through_the_jobs_end_ends_with_the_jobs_model(local_cluster):
    """Frozen until the other member has finished (an event, not a duration): the
    frozen member's worker trains to its own end meanwhile and, having left out a
    member that finished first, takes that member's model instead of its own."""
    cluster = local_cluster(2)
    steady, victim = cluster.peers
    wait_for_discovery(cluster)
    text = example_job(job={"name": "thaw", "epochs": 8, "eval_every_rounds": 1000, "min_peers": 2})
    for peer in cluster.peers:
        cluster.client(peer).join(text)
    wait_for(lambda: round_of(cluster, victim) >= 3, 300, "the job to be under way")
    os.kill(victim.process.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: all_finished(first_jobs(cluster, [steady])), 600, "the other member to finish")
    finally:
        os.kill(victim.process.pid, signal.SIGCONT)
    wait_for(lambda: (jobs := cluster.client(victim).status().jobs) and jobs[0].state == "finished", 600,
             "the frozen member to end")
    assert model_bytes(victim, "thaw") == model_bytes(steady, "thaw")
    assert record(victim, "thaw")["taken_from"] == "peer-0"


def test_a_member_paused_until_after_the_end_takes_the_jobs_model(local_cluster):
    cluster = local_cluster(2)
    steady, owned = cluster.peers
    wait_for_discovery(cluster)
    text = example_job(job={"name": "paused", "epochs": 3, "eval_every_rounds": 1000, "min_peers": 2})
    for peer in cluster.peers:
        cluster.client(peer).join(text)
    wait_for(lambda: round_of(cluster, owned) >= 5, 300, "the job to be under way")
    out = peerctl(owned, "pause")  # the owner needs the machine: the worker leaves with a checkpoint
    assert out.returncode == 0, out
    wait_for(lambda: all_finished(first_jobs(cluster, [steady])), 600, "the other member to finish")
    assert peerctl(owned, "resume").returncode == 0
    wait_for(lambda: (jobs := cluster.client(owned).status().jobs) and jobs[0].state == "finished", 300,
             "the paused member to end")
    assert model_bytes(owned, "paused") == model_bytes(steady, "paused")
    assert record(owned, "paused")["taken_from"] == "peer-0"
    assert "took the job's model from peer-0" in worker_log(owned, "paused")


def _in_its_end_while_the_other_is_frozen(cluster, name: str):
    """Both members train; the steady one's worker is frozen (SIGSTOP), so the
    other trains to its end and waits there in its end consensus for the frozen
    one, which its daemon still lists. Returns (steady, victim, the frozen pid)."""
    steady, victim = cluster.peers
    wait_for_discovery(cluster)
    text = example_job(job={"name": name, "epochs": 2, "eval_every_rounds": 1000, "min_peers": 2})
    for peer in cluster.peers:
        cluster.client(peer).join(text)
    wait_for(lambda: round_of(cluster, victim) >= 5, 300, "the job to be under way")
    [frozen] = first_jobs(cluster, [steady])
    os.kill(frozen.worker_pid, signal.SIGSTOP)
    return steady, victim, frozen.worker_pid


def _phase(cluster, peer) -> str:
    jobs = cluster.client(peer).status().jobs
    return jobs[0].progress.phase if jobs else ""


def test_a_member_paused_during_its_end_consensus_takes_the_jobs_model(local_cluster):
    cluster = local_cluster(2)
    steady, owned, pid = _in_its_end_while_the_other_is_frozen(cluster, "endpause")
    try:
        wait_for(lambda: _phase(cluster, owned) == "consensus", 600, "the paused member's end consensus")
        assert peerctl(owned, "pause").returncode == 0  # its owner arrives during the end
        wait_for(lambda: first_jobs(cluster, [owned])[0].worker_pid == 0, 120, "the paused member's worker to stop")
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_for(lambda: all_finished(first_jobs(cluster, [steady])), 600, "the other member to finish")
    assert not (owned.dir / "state" / "jobs" / "endpause" / "model.pt").exists()  # none of its own meanwhile
    assert peerctl(owned, "resume").returncode == 0
    wait_for(lambda: all_finished(first_jobs(cluster, [owned])), 300, "the paused member to end")
    assert model_bytes(owned, "endpause") == model_bytes(steady, "endpause")
    assert record(owned, "endpause")["taken_from"] == steady.peer_id


def test_a_daemon_killed_during_its_end_and_restarted_after_takes_the_jobs_model(local_cluster):
    cluster = local_cluster(2)
    steady, victim, pid = _in_its_end_while_the_other_is_frozen(cluster, "endkill")
    try:
        wait_for(lambda: _phase(cluster, victim) == "consensus", 600, "the victim's end consensus")
        victim.process.kill()  # its worker dies with it (the parent-death signal)
        victim.process.wait()
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_for(lambda: all_finished(first_jobs(cluster, [steady])), 600, "the other member to finish")
    cluster.start(victim)  # back after the job's end
    cluster.wait_ready()
    wait_for(lambda: (jobs := cluster.client(victim).status().jobs) and all_finished(jobs[:1]), 300,
             "the restarted member to end")
    assert model_bytes(victim, "endkill") == model_bytes(steady, "endkill")
    assert record(victim, "endkill")["taken_from"] == steady.peer_id
