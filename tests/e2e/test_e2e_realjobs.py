"""A lab's kind of job through real daemons: a job module with BatchNorm,
AdamW, bf16 autocast, clipping and a DataLoader worker; a late joiner takes the
whole state (BatchNorm counters included) and the model file is plain PyTorch."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch import nn

from conftest import all_finished, first_jobs, peerctl, round_of, wait_for

pytestmark = pytest.mark.e2e

JOBCODE = Path(__file__).parents[1] / "jobcode"
JOB = """
[job]
name = "lab"
module = "real_job"
local_batch = 8
epochs = 300
epoch_chunks = 2
drop_last = true          # BatchNorm cannot train on an epoch's 1-sample remainder
eval_every_rounds = 10

[optimizer]
name = "adamw"
lr = 0.01
betas = [0.9, 0.95]
weight_decay = 0.05
schedule = "cosine"
warmup_steps = 20

[train]
precision = "bf16"
grad_clip_norm = 1.0

[data]
loader_workers = 1
"""


def test_a_batchnorm_adamw_bf16_job_with_a_late_joiner(local_cluster, tmp_path):
    cluster = local_cluster(3)
    first, second, late = cluster.peers
    wait_for(lambda: all(cluster.client(p).status().peers_known == 2 for p in cluster.peers), 30,
             "the three daemons to discover each other")
    for peer in (first, second):
        cluster.client(peer).join(JOB, str(JOBCODE))

    wait_for(lambda: min(round_of(cluster, first), round_of(cluster, second)) >= 30, 120,
             "the first two peers to train 30 rounds")
    cluster.client(late).join(JOB, str(JOBCODE))

    # peerctl export: the model of now, loadable by plain PyTorch, while the job runs.
    out = peerctl(first, "export", "lab", str(tmp_path / "now.pt"))
    assert out.returncode == 0 and "wrote the model of lab at round" in out.stdout, out.stderr
    model = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
    model.load_state_dict(torch.load(tmp_path / "now.pt", weights_only=True))
    assert (tmp_path / "now.json").exists()
    out = peerctl(first, "export", "lab", str(tmp_path / "no" / "such" / "dir.pt"))
    assert out.returncode != 0 and "no such directory" in out.stderr

    jobs = wait_for(lambda: all_finished(first_jobs(cluster)), 300, "all three peers to finish the job")
    log = (late.dir / "state" / "jobs" / "lab" / "worker.log").read_text()
    assert re.search(r"joining: took the state of round \d+", log), log[:3000]
    for peer, job in zip(cluster.peers, jobs):
        p = job.progress
        # The own model's metrics, and the consensus model's beside them.
        assert p.metric_name == "accuracy" and set(p.metrics) == {
            "accuracy", "loss", "consensus_accuracy", "consensus_loss", "consensus_peers"}
        assert p.metric > 0.6, (peer.peer_id, p.metric)  # chance is below 0.5 on three classes
        assert p.skipped_steps == 0
        # A plain state_dict; BatchNorm's counter came with the state: it counts
        # the job's steps, the donor's before the join and its own after it.
        saved = torch.load(peer.dir / "state" / "jobs" / "lab" / "model.pt", weights_only=True)
        model = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
        model.load_state_dict(saved)
        # The model at the end takes the largest of the members' counters.
        assert int(saved["1.num_batches_tracked"]) == max(j.progress.step for j in jobs), (peer.peer_id, p.step)
    assert jobs[2].progress.step > 30


def test_overlapped_rounds_through_real_daemons_with_a_late_joiner(local_cluster):
    """[gossip] overlap: each round's exchange runs while the next steps compute;
    the job still mixes (every peer reached partners), a newcomer takes the
    state, and all end far above chance."""
    from conftest import example_job

    cluster = local_cluster(3)
    first, second, late = cluster.peers
    wait_for(lambda: all(cluster.client(p).status().peers_known == 2 for p in cluster.peers), 30,
             "the three daemons to discover each other")
    text = example_job(job={"name": "overlap", "epochs": 6, "eval_every_rounds": 20}, gossip={"overlap": True})
    for peer in (first, second):
        cluster.client(peer).join(text)
    wait_for(lambda: all((j := cluster.client(p).status().jobs) and j[0].progress.round >= 20
                         for p in (first, second)), 120, "the first two peers to train 20 rounds")
    cluster.client(late).join(text)

    reached = set()

    def finished():
        jobs = first_jobs(cluster)
        done = all_finished(jobs)
        reached.update(p.peer_id for p, j in zip(cluster.peers, jobs) if j.progress.partners_reached >= 1)
        return done

    jobs = wait_for(finished, 300, "all three peers to finish the overlapped job")
    assert reached == {p.peer_id for p in cluster.peers}
    log = (late.dir / "state" / "jobs" / "overlap" / "worker.log").read_text()
    assert re.search(r"joining: took the state of round \d+", log), log[:3000]
    for job in jobs:
        assert job.progress.metric > 0.8, job  # chance is 0.1
