"""End to end: at the job's end the peers agree on one model."""

from __future__ import annotations

import difflib
import hashlib
import json
import tomllib
from pathlib import Path

import pytest
import tomli_w

from conftest import all_finished, example_job, first_jobs, peerctl, wait_for

pytestmark = pytest.mark.e2e

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_every_peer_saves_the_same_exact_average_and_reports_its_accuracy(local_cluster):
    cluster = local_cluster(2)
    wait_for(lambda: all(cluster.client(p).status().peers_known == 1 for p in cluster.peers),
             30, "both daemons to see each other")
    # The two start together (min_peers), so that neither trains alone first.
    text = example_job(job={"name": "one", "epochs": 3, "eval_every_rounds": 1000, "min_peers": 2},
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


def test_a_script_with_evaluate_reports_its_own_and_the_consensus_model(local_cluster, tmp_path):
    """examples/mnist_peerd.py as a script job: peerd evaluates the script's model
    through attach(evaluate=...), the peers' own and the saved average."""
    cluster = local_cluster(2)
    wait_for(lambda: all(cluster.client(p).status().peers_known == 1 for p in cluster.peers),
             30, "both daemons to see each other")
    example = tomllib.loads((EXAMPLES / "mnist_script.toml").read_text())
    example["job"].update(name="script-one", script=str(EXAMPLES / "mnist_peerd.py"), epochs=2)
    job_file = tmp_path / "job.toml"
    job_file.write_text(tomli_w.dumps(example))
    for peer in cluster.peers:
        out = peerctl(peer, "join", str(job_file))
        assert out.returncode == 0, out.stderr

    final = wait_for(lambda: all_finished(first_jobs(cluster)), 300, "both script workers to finish")
    models = [p.dir / "state" / "jobs" / "script-one" / "model.pt" for p in cluster.peers]
    assert len({hashlib.sha256(m.read_bytes()).hexdigest() for m in models}) == 1, "the saved models differ"
    for model, job in zip(models, final):
        metrics = dict(job.progress.metrics)
        assert metrics["consensus_peers"] == 2, metrics
        assert metrics["accuracy"] > 0.8 and metrics["consensus_accuracy"] > 0.8, metrics
        assert json.loads(model.with_suffix(".json").read_text())["metrics"] == pytest.approx(metrics)
    assert len({dict(j.progress.metrics)["consensus_accuracy"] for j in final}) == 1


def test_the_example_script_differs_from_the_plain_one_by_at_most_ten_lines():
    plain = (EXAMPLES / "mnist_plain.py").read_text().splitlines()
    peerd_version = (EXAMPLES / "mnist_peerd.py").read_text().splitlines()
    changed = [line for line in difflib.unified_diff(plain, peerd_version, lineterm="", n=0)
               if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert 0 < len(changed) <= 10, changed
