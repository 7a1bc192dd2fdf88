"""End to end: at the job's end the peers agree on one model (issue 17)."""

from __future__ import annotations

import hashlib
import json

import pytest

from conftest import example_job, peerctl, wait_for

pytestmark = pytest.mark.e2e


def test_every_peer_saves_the_same_exact_average_and_reports_its_accuracy(local_cluster):
    cluster = local_cluster(2)
    wait_for(lambda: all(cluster.client(p).status().peers_known == 1 for p in cluster.peers),
             30, "both daemons to see each other")
    # A constant LR and models that start apart: the peers' own models still differ at the end.
    text = example_job(job={"name": "one", "epochs": 3, "eval_every_rounds": 1000, "init": "per-peer"},
                       optimizer={"schedule": "constant"}, gossip={"deadline_ceiling_s": 30.0})
    job_file = cluster.out / "job.toml"
    job_file.write_text(text)
    for peer in cluster.peers:
        out = peerctl(peer, "join", str(job_file))
        assert out.returncode == 0, out.stderr

    def all_finished():
        rows = {p.peer_id: cluster.client(p).status().jobs[0] for p in cluster.peers}
        assert all(j.state not in ("failed", "restarting") for j in rows.values()), rows
        return all(j.state == "finished" for j in rows.values()) and rows

    final = wait_for(all_finished, 300, "both workers to finish the job")
    models = [p.dir / "state" / "jobs" / "one" / "model.pt" for p in cluster.peers]
    digests = {hashlib.sha256(m.read_bytes()).hexdigest() for m in models}
    assert len(digests) == 1, "the saved model files differ"
    for model, job in zip(models, final.values()):
        info = json.loads(model.with_suffix(".json").read_text())
        assert info["consensus"] == ["peer-0", "peer-1"]
        metrics = dict(job.progress.metrics)
        assert metrics["consensus_peers"] == 2
        assert metrics["consensus_accuracy"] > 0.8 and metrics["accuracy"] > 0.8, metrics
        assert info["metrics"]["consensus_accuracy"] == metrics["consensus_accuracy"]
        assert "consensus at the end over 2 peer(s): peer-0, peer-1" in open(job.log_path).read()
    # Both evaluated the same model on the same test set.
    assert len({dict(j.progress.metrics)["consensus_accuracy"] for j in final.values()}) == 1
