"""End to end: the framework examples run as their job files say, through
real daemons (docs/operations.md, "Lightning" and "Hugging Face Trainer").
examples/lightning_digits.toml and examples/hf_charlm.toml, cut to one epoch
on two peers: both peers finish with the same model.pt, better than chance."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest

from conftest import all_finished, wait_for, wait_for_discovery
from peerd.cli.localcluster import job_with

pytestmark = pytest.mark.e2e

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_example(local_cluster, job_file: str, name: str) -> list[dict]:
    """The example's job, one epoch (the script's --epochs with it), on two
    peers that start together; each peer's model.json metrics once both finish."""
    job = job_with(EXAMPLES / job_file, job={"epochs": 1, "args": ["--peerd", "--epochs", "1"], "min_peers": 2})
    cluster = local_cluster(2)
    wait_for_discovery(cluster)
    for peer in cluster.peers:
        cluster.client(peer).join(job, str(EXAMPLES))

    def finished():
        done = all_finished(j for p in cluster.peers for j in cluster.client(p).status().jobs if j.name == name)
        return done and len(done) == 2

    wait_for(finished, 300, f"the {name} example to finish on both peers")
    dirs = [p.dir / "state" / "jobs" / name for p in cluster.peers]
    assert len({hashlib.sha256((d / "model.pt").read_bytes()).hexdigest() for d in dirs}) == 1
    return [json.loads((d / "model.json").read_text())["metrics"] for d in dirs]


def test_the_lightning_digits_example_trains_on_two_peers(local_cluster):
    pytest.importorskip("lightning")
    for metrics in run_example(local_cluster, "lightning_digits.toml", "lightning-digits"):
        # Ten classes: a guess scores 0.1; one epoch of the CNN passes 0.9 alone.
        assert metrics["consensus_val_acc"] > 0.8 and metrics["consensus_peers"] == 2, metrics


def test_the_hf_charlm_example_trains_on_two_peers(local_cluster):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    for metrics in run_example(local_cluster, "hf_charlm.toml", "hf-charlm"):
        # A uniform guess over the 96 characters scores ln 96 = 4.56 nats.
        assert metrics["consensus_eval_loss"] < math.log(96) and metrics["consensus_peers"] == 2, metrics
