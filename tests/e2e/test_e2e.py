"""End to end: real peerd daemons as subprocesses on 127.0.0.1, finding each
other through zeroconf, each supervising a worker, training the example job."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from peerd.errors import JobMismatch
from peerd.examples.mnist import make_model
from peerd.settings.jobspec import parse_job
from peerd.worker.train.trainer import init_seed

from conftest import all_finished, example_job, first_jobs, peerctl, round_of, wait_for, wait_for_discovery
from e2e_helpers import flat_params, rel_distance

pytestmark = pytest.mark.e2e

CHANCE_LOSS = math.log(10)  # cross-entropy of a uniform guess over the 10 classes


def test_three_daemons_discover_each_other_and_train_together(local_cluster):
    cluster = local_cluster(3)
    wait_for(lambda: all(cluster.client(p).status().peers_known == 2 for p in cluster.peers),
             30, "every daemon to see the other two through zeroconf")

    # peerctl against live daemons, human and --json.
    out = peerctl(cluster.peers[0], "peers")
    assert out.returncode == 0 and "peer-1" in out.stdout and "peer-2" in out.stdout
    status = json.loads(peerctl(cluster.peers[0], "--json", "status").stdout)
    assert status["peer_id"] == "peer-0" and status["peers_known"] == 2

    # The three start together (min_peers): each trains a third of the data and
    # only gossip makes their work one model.
    text = example_job(job={"name": "e2e", "epochs": 3, "eval_every_rounds": 15, "min_peers": 3})
    spec = parse_job(text, "e2e job")
    job_file = cluster.out / "job.toml"
    job_file.write_text(text)
    out = peerctl(cluster.peers[0], "join", str(job_file))
    assert out.returncode == 0, out.stderr
    # The others join by name, with the spec taken from peer-0 and checked against its fingerprint.
    for peer in cluster.peers[1:]:
        wait_for(lambda: any(j.name == "e2e" for j in cluster.client(peer).jobs().jobs), 30,
                 f"{peer.peer_id} to learn about the job")
        out = peerctl(peer, "join", "e2e")
        assert out.returncode == 0, out.stderr
        assert cluster.client(peer).status().jobs[0].spec_fingerprint == spec.fingerprint

    jobs = json.loads(peerctl(cluster.peers[1], "--json", "jobs").stdout)["jobs"]
    assert [j["name"] for j in jobs] == ["e2e"] and jobs[0]["local"]

    history: list[dict] = []

    def finished():
        rows = dict(zip((p.peer_id for p in cluster.peers), first_jobs(cluster)))
        history.extend({"peer": k, "loss": j.progress.loss, "reached": j.progress.partners_reached}
                       for k, j in rows.items() if j.progress.step > 0)
        return all_finished(rows.values()) and rows

    final = wait_for(finished, 300, "all three workers to finish the job")

    # Everyone gossiped with someone, and the loss fell far below chance. Against a fixed
    # reference, not the first value a poll saw: under load that first poll comes late.
    assert any(h["reached"] >= 1 for h in history)
    for peer in cluster.peers:
        losses = [h["loss"] for h in history if h["peer"] == peer.peer_id and not math.isnan(h["loss"])]
        assert losses[-1] < 0.5 * CHANCE_LOSS, (peer.peer_id, losses[-1])

    # Gossip kept the peers together: before the final average each one's own model
    # was a tiny fraction of the way training moved it from the start away from the
    # average (peers that never averaged would be about that far apart). model.pt is
    # that average, the same on every peer whatever gossip did, so it cannot show this.
    torch.manual_seed(init_seed(spec, "peer-0"))
    initial = flat_params(make_model().state_dict())
    for peer, job in final.items():
        saved = flat_params(torch.load(Path(job.log_path).parent / "model.pt", weights_only=True))
        travel = rel_distance(saved, initial)
        gap = own_gap(job.log_path)
        assert travel > 0.1 and gap < 0.01 * travel, (peer, gap, travel)
        # An accuracy a peer alone does not reach in the same steps: each took ~125
        # steps of 32; one peer alone for 125 steps (1 epoch) reaches 0.933
        # (`peerd cluster --peers 1` on this job with epochs = 1), the three 0.957.
        info = json.loads((Path(job.log_path).parent / "model.json").read_text())
        assert info["metrics"]["consensus_accuracy"] > 0.945, job
        # Healthy training (the example job sets [job] chance) is not taken for a collapse.
        assert not job.progress.collapsed and info["collapsed"] is False, job.progress.collapse_reason


def own_gap(log_path: str) -> float:
    """How far this worker's own model was from the end average (relative L2),
    from its log: the disagreement gossip left for the final exchange."""
    found = re.findall(r"consensus at the end over .*own model ([0-9.e+-]+)% from it", open(log_path).read())
    assert found, "no end consensus in " + log_path
    return float(found[-1]) / 100


def test_a_crashed_worker_is_restarted_and_the_daemon_survives(local_cluster):
    cluster = local_cluster(1)
    peer = cluster.peers[0]
    job_file = cluster.out / "job.toml"
    job_file.write_text(example_job(job={"name": "crashy", "epochs": 50}))
    assert peerctl(peer, "join", str(job_file)).returncode == 0

    def running_pid():
        job = cluster.client(peer).status().jobs[0]
        return job.state == "running" and job.worker_pid

    pid = wait_for(running_pid, 60, "the worker to start")
    os.kill(pid, signal.SIGKILL)
    new_pid = wait_for(lambda: (p := running_pid()) and p != pid and p, 60, "the worker to be restarted")
    job = cluster.client(peer).status().jobs[0]
    assert job.restarts == 1 and new_pid != pid
    assert peer.process.poll() is None  # the daemon is still up

    out = peerctl(peer, "leave", "--drain", "crashy")
    assert out.returncode == 0, out.stderr
    assert cluster.client(peer).status().jobs == []
    assert "leaving at round" in (peer.dir / "state" / "jobs" / "crashy" / "worker.log").read_text()
    with pytest.raises(ProcessLookupError):
        os.kill(new_pid, 0)


def test_a_worker_does_not_outlive_its_daemon(local_cluster):
    """By the parent-death signal or, failing it, the heartbeat (the signal alone:
    tests/control/test_lifeline.py)."""
    cluster = local_cluster(1)
    peer = cluster.peers[0]
    cluster.client(peer).join(example_job(job={"name": "orphan", "epochs": 50}))
    pid = wait_for(lambda: cluster.client(peer).status().jobs[0].worker_pid, 60, "the worker to start")
    peer.process.kill()  # kill -9: the daemon cannot clean up
    peer.process.wait()

    def gone():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_for(gone, 30, f"worker {pid} to exit after its daemon died")


def test_joining_with_another_spec_under_the_same_name_is_refused(local_cluster):
    cluster = local_cluster(2)
    first, second = cluster.peers
    cluster.client(first).join(example_job(job={"name": "same", "epochs": 50}))
    wait_for(lambda: any(j.name == "same" for j in cluster.client(second).jobs().jobs), 30,
             "the second daemon to learn about the job")
    with pytest.raises(JobMismatch, match="another spec"):
        cluster.client(second).join(example_job(job={"name": "same", "epochs": 50}, optimizer={"lr": 0.1}))
    assert cluster.client(second).status().jobs == []


def test_peerctl_without_a_daemon_says_so(tmp_path):
    out = subprocess.run([sys.executable, "-m", "peerd.cli.peerctl", "--socket", str(tmp_path / "none.sock"), "status"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 1
    assert "running" in out.stderr and "Traceback" not in out.stderr


def test_a_late_joiner_takes_the_state_from_the_running_peers(local_cluster):
    cluster = local_cluster(3)
    first, second, late = cluster.peers
    wait_for_discovery(cluster)
    text = example_job(job={"name": "elastic", "epochs": 12, "eval_every_rounds": 20})
    for peer in (first, second):
        cluster.client(peer).join(text)

    wait_for(lambda: min(round_of(cluster, first), round_of(cluster, second)) >= 40, 120,
             "the first two peers to train 40 rounds")
    # peerctl peers shows each peer's state and, per job, its phase, round, LR and global
    # batch, as of that peer's last Hello (which may be a second behind: polled).
    def peer_1_seen():
        peers = json.loads(peerctl(first, "peers", "--json").stdout)["peers"]
        other = next(p for p in peers if p["peer_id"] == "peer-1")
        [job] = other["job_states"]
        return other["state"] == "alive" and job["global_batch"] == 64 and job

    job = wait_for(peer_1_seen, 30, "peerctl peers to show peer-1 training with a global batch of 2 × 32")
    assert (job["name"], job["phase"]) == ("elastic", "training"), job
    assert float(job["lr"]) > 0 and int(job["round"]) > 0  # as of its last Hello
    assert "training" in peerctl(first, "status").stdout
    cluster.client(late).join_by_name("elastic")

    jobs = wait_for(lambda: all_finished(first_jobs(cluster)), 300, "all three to finish")
    log = (late.dir / "state" / "jobs" / "elastic" / "worker.log").read_text()
    # From both running peers in parallel (one alone if the other was too slow to answer).
    assert re.search(r"joining: took the state of round \d+ .* from peer-[01](, peer-1)? in", log), log[:3000]
    # It continued from the job's step count and schedule position, not from zero ...
    assert jobs[2].progress.step > 40
    # ... and ended as good as the others.
    assert jobs[2].progress.metric > 0.8
    assert abs(jobs[2].progress.metric - jobs[0].progress.metric) < 0.05


def test_a_newcomer_takes_the_state_between_the_donors_steps_not_at_their_round(local_cluster):
    # The donor's round never ends here (10^6 steps per round): its state must be
    # copied after the local step under way, not at its next round boundary,
    # which a newcomer used to wait for (up to half the pull's deadline, then it
    # started from scratch).
    cluster = local_cluster(2)
    donor, late = cluster.peers
    wait_for_discovery(cluster)
    text = example_job(job={"name": "midround", "epochs": 1000, "eval_every_rounds": 1000},
                       gossip={"period_steps": 1_000_000})
    cluster.client(donor).join(text)
    # (Its progress is reported at rounds, so its steps are not seen here: a
    # capture is taken after a step, so the newcomer's step count shows it.)
    wait_for(lambda: first_jobs(cluster, [donor])[0].state == "running", 120, "the donor to train")
    wait_for(lambda: any(j.name == "midround" for j in cluster.client(late).jobs().jobs), 30,
             "the newcomer's daemon to see the job")
    cluster.client(late).join_by_name("midround")
    log = late.dir / "state" / "jobs" / "midround" / "worker.log"
    wait_for(lambda: log.exists() and "training from round" in log.read_text(), 120, "the newcomer's first step")
    text = log.read_text()
    took = re.search(r"joining: took the state of round 0 \(step (\d+), .* from peer-0 in", text)
    assert took and int(took.group(1)) >= 1, text[:3000]
    assert re.search(r"training from round 0, step (?!0\b)\d+", text), text[:3000]
    assert first_jobs(cluster, [donor])[0].progress.round == 0  # it served within its first round
    served = (donor.dir / "state" / "jobs" / "midround" / "worker.log").read_text()
    assert "served state range 0+" in served and "to 'peer-1'" in served, served[-3000:]
    # SIGTERM inside that endless round: the donor leaves after the step under way,
    # with a checkpoint of its steps, not when the daemon's grace runs out (then
    # its worker is killed without one).
    donor.process.send_signal(signal.SIGTERM)
    assert donor.process.wait(timeout=60) == 0
    served = (donor.dir / "state" / "jobs" / "midround" / "worker.log").read_text()
    assert re.search(r"round 0: stopped by signal after \d+ local step\(s\) of the round", served), served[-3000:]
    assert re.search(r"checkpoint of round 0 written \(stopped by signal\)", served), served[-3000:]
    assert "killing it" not in (donor.dir / "daemon.log").read_text()


def test_a_killed_worker_rejoins_from_the_others_who_keep_training(local_cluster):
    cluster = local_cluster(3)
    wait_for_discovery(cluster)
    text = example_job(job={"name": "churn", "epochs": 12, "eval_every_rounds": 20})
    for peer in cluster.peers:
        cluster.client(peer).join(text)
    victim, survivors = cluster.peers[2], cluster.peers[:2]

    def job(peer):
        jobs = cluster.client(peer).status().jobs
        return jobs[0] if jobs else None

    pid = wait_for(lambda: (j := job(victim)) and j.progress.round >= 30 and j.worker_pid, 120,
                   "the victim to train 30 rounds")
    os.kill(pid, signal.SIGKILL)
    at_kill = {p.peer_id: job(p).progress.round for p in survivors}
    # The survivors go on completing rounds while the victim is down ...
    wait_for(lambda: all(job(p).progress.round >= at_kill[p.peer_id] + 20 for p in survivors), 120,
             "the survivors to complete 20 more rounds")
    # ... and the daemon restarts the worker, which takes the state from them.
    wait_for(lambda: (j := job(victim)).restarts == 1 and j.state == "running", 120, "the restart")
    log = victim.dir / "state" / "jobs" / "churn" / "worker.log"
    wait_for(lambda: "joining: took the state of round" in log.read_text(), 120, "the restarted worker to rejoin")
    rejoined = wait_for(lambda: (j := job(victim)).progress.step and j.progress, 30, "its first report")
    assert rejoined.step > 30  # it continued from the job's state, not from step 0
    # Within a few rounds its loss is far below chance: it trains on from the state it took.
    wait_for(lambda: job(victim).progress.round > rejoined.round + 10, 120, "10 rounds after rejoining")
    losses = [job(p).progress.loss for p in cluster.peers]
    assert losses[2] < 0.5 * CHANCE_LOSS, losses


# "relay": the daemons relay records (docs/protocol.md, "Membership relay"); the restart
# is a new incarnation that must replace the killed one's record.
@pytest.mark.parametrize("discovery", [{}, {"full_mesh_max": 1, "fanout": 1}], ids=["full-mesh", "relay"])
def test_a_daemon_killed_and_restarted_resumes_its_job_from_the_peers(local_cluster, discovery):
    cluster = local_cluster(2, settings=lambda peer: {"discovery": dict(discovery)})
    steady, victim = cluster.peers
    wait_for_discovery(cluster)
    text = example_job(job={"name": "reboot", "epochs": 30, "eval_every_rounds": 20})
    for peer in cluster.peers:
        cluster.client(peer).join(text)
    wait_for(lambda: all((cluster.client(p).status().jobs[0].progress.round or 0) >= 30 for p in cluster.peers),
             120, "both peers to train 30 rounds")
    victim.process.kill()  # kill -9 of the whole daemon: its worker dies with it
    victim.process.wait()
    cluster.start(victim)  # as systemd's Restart=on-failure would
    cluster.wait_ready()

    def resumed():
        jobs = cluster.client(victim).status().jobs
        return jobs and jobs[0].state == "running" and jobs[0].progress.step > 0 and jobs[0]
    job = wait_for(resumed, 120, "the restarted daemon to resume the job")
    log = (victim.dir / "state" / "jobs" / "reboot" / "worker.log").read_text()
    assert log.count("joining: took the state of round") >= 1, log[-3000:]
    assert job.progress.step > 30  # from the peer's state, not from scratch

    # A job left on purpose is not resumed by the next restart; one still joined
    # is, once the resume delay has passed. The daemon resumes its jobs in the order
    # of their names, so by the time "reboot-kept" is back, "reboot" would be too.
    # (min_peers 3 of 2 daemons: its worker waits at the start gate, training nothing.)
    cluster.client(victim).join(example_job(job={"name": "reboot-kept", "min_peers": 3}))
    cluster.client(victim).leave("reboot")
    victim.process.terminate()
    victim.process.wait()
    cluster.start(victim)
    cluster.wait_ready()
    resumed_names = wait_for(lambda: [j.name for j in cluster.client(victim).status().jobs], 60,
                             "the job still joined to be resumed")
    assert resumed_names == ["reboot-kept"], resumed_names


def test_hierarchical_crossover_across_two_racks_reaches_consensus(local_cluster):
    cluster = local_cluster(4, localities=["rack-a", "rack-a", "rack-b", "rack-b"])
    wait_for(lambda: all(cluster.client(p).status().peers_known == 3 for p in cluster.peers),
             30, "every daemon to see the other three")
    # The four start together (min_peers): none can finish before the others have started.
    text = example_job(job={"name": "hier", "epochs": 4, "eval_every_rounds": 20, "min_peers": 4},
                       gossip={"mode": "hierarchical", "group_size": 2, "wire": "bf16"})
    job_file = cluster.out / "job.toml"
    job_file.write_text(text)
    for peer in cluster.peers:
        out = peerctl(peer, "join", str(job_file))
        assert out.returncode == 0, out.stderr

    seen_partners = set()

    def finished():
        rows = dict(zip((p.peer_id for p in cluster.peers), first_jobs(cluster)))
        done = all_finished(rows.values())
        seen_partners.update(j.progress.partners_reached for j in rows.values())
        return done and rows

    final = wait_for(finished, 300, "all four workers to finish the job")
    for job in final.values():
        assert "hierarchical gossip in groups of ≤ 2, bf16 on the wire" in open(job.log_path).read()
    # Group of 2 plus the partner group's owner: 2 partners in a full round.
    assert max(seen_partners) >= 2, seen_partners
    for job in final.values():
        assert job.progress.metric > 0.8, job
    # Crossover across the racks kept all four together before the final average
    # (model.pt is that average: equal on every peer whatever gossip did).
    torch.manual_seed(init_seed(parse_job(text, "hier job"), "peer-0"))
    initial = flat_params(make_model().state_dict())
    for job in final.values():
        saved = flat_params(torch.load(Path(job.log_path).parent / "model.pt", weights_only=True))
        gap, travel = own_gap(job.log_path), rel_distance(saved, initial)
        assert travel > 0.1 and gap < 0.01 * travel, (job.log_path, gap, travel)
