"""End to end: the int8 wire with error feedback on real daemons, a late joiner
taking the state in fp32, and one exact model at the end."""

from __future__ import annotations

import hashlib
import json
import re

import pytest

from conftest import all_finished, example_job, first_jobs, round_of, wait_for, wait_for_discovery

pytestmark = pytest.mark.e2e


def test_the_int8_wire_trains_with_a_late_joiner_and_ends_in_one_model(local_cluster):
    cluster = local_cluster(3)
    first, second, late = cluster.peers
    wait_for_discovery(cluster)
    text = example_job(job={"name": "narrow", "epochs": 6, "eval_every_rounds": 20, "min_peers": 2},
                       optimizer={"schedule": "constant"}, gossip={"wire": "int8", "deadline_ceiling_s": 30.0})
    for peer in (first, second):
        cluster.client(peer).join(text)

    wait_for(lambda: min(round_of(cluster, first), round_of(cluster, second)) >= 20, 120,
             "the first two peers to train 20 rounds")
    cluster.client(late).join_by_name("narrow")
    jobs = wait_for(lambda: all_finished(first_jobs(cluster)), 300, "all three to finish")

    logs = [(p.dir / "state" / "jobs" / "narrow" / "worker.log").read_text() for p in cluster.peers]
    assert all("int8 on the wire" in log for log in logs)
    assert re.search(r"joining: took the state of round \d+ .* from peer-[01](, peer-[01])? in", logs[2]), logs[2][:3000]
    assert not any("non-finite" in log for log in logs)
    assert jobs[2].progress.step > 20  # the joiner went on from the job's position
    # About a byte a value on the wire: a flat round fetches one model's worth of
    # segments, 4 bytes a value in fp32 (the end consensus's fp32 included here).
    numel = int(re.search(r"; (\d+) parameters in", logs[0]).group(1))
    for job in jobs[:2]:
        fp32_bytes = job.progress.round * numel * 4
        assert 0.2 < job.progress.bytes_received / fp32_bytes < 0.3, (job.progress.bytes_received, fp32_bytes)
    models = [p.dir / "state" / "jobs" / "narrow" / "model.pt" for p in cluster.peers]
    assert len({hashlib.sha256(m.read_bytes()).hexdigest() for m in models}) == 1, "the saved models differ"
    for model, job in zip(models, jobs):
        info = json.loads(model.with_suffix(".json").read_text())
        assert info["consensus"] == ["peer-0", "peer-1", "peer-2"]
        metrics = dict(job.progress.metrics)
        assert metrics["consensus_accuracy"] > 0.8 and metrics["accuracy"] > 0.8, metrics
