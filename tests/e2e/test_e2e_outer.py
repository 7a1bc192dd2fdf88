"""End to end: the outer step (docs/algorithms.md, "The outer step") through
real daemons: three peers train the built-in example job with a round and an
outer step every 8 local steps, one of them joining the running job; all end
with the same model file, within a point of the job with a round every step.
Then the same with the round overlapped and the changes on the int8 wire."""

from __future__ import annotations

import json
import re
import tomllib

import pytest
import tomli_w
import torch

from peerd.cli.localcluster import default_job
from peerd.examples.mnist import make_model
from peerd.settings.jobspec import parse_job
from peerd.worker.state.checkpoint import MAGIC, decode
from peerd.worker.train.trainer import init_seed

from conftest import all_finished, first_jobs, round_of, wait_for, wait_for_discovery

pytestmark = pytest.mark.e2e

H = 8
# The default outer momentum, set here as the test's own: DiLoCo's 0.9 is too
# much over 8 steps of this job's SGD (docs/algorithms.md, "The outer step").
MOMENTUM = 0.5


def outer_job(gossip: dict, **job: object) -> str:
    """The example job with [outer] every = H in place of [gossip] period_steps,
    `gossip`'s keys added, and a checkpoint every 10 rounds."""
    data = tomllib.loads(default_job().read_text())
    del data["gossip"]["period_steps"]
    data["gossip"].update(gossip)
    data["job"].update(job)
    data["outer"] = {"every": H, "momentum": MOMENTUM}
    data["checkpoint"] = {"every_rounds": 10, "every_s": 0}
    return tomli_w.dumps(data)


def outer_state(job_dir) -> tuple[torch.Tensor, torch.Tensor]:
    """The anchor and outer momentum buffer in a worker's newest checkpoint: the
    state vector's last two parts, each as long as the parameters."""
    newest = max((job_dir / "checkpoints").glob("ckpt-*.peerd"))
    data = bytearray(newest.read_bytes())
    header = json.loads(data[len(MAGIC) : data.index(b"\n", len(MAGIC))])
    _, vector = decode(data, header["job"], header["fingerprint"], header["numel"])
    n = sum(p.numel() for p in make_model().parameters())
    return vector[-2 * n : -n], vector[-n:]


# Rounds now; and overlapped behind the next H steps, the changes on the int8
# wire (docs/algorithms.md, "The outer step overlapped", "... on the int8 wire").
@pytest.mark.parametrize("gossip", [{}, {"wire": "int8", "overlap": True}], ids=["fp32", "int8-overlap"])
def test_three_peers_one_joining_later_end_with_one_model_through_outer_steps(local_cluster, gossip):
    cluster = local_cluster(3)
    first, second, late = cluster.peers
    wait_for_discovery(cluster)
    text = outer_job(gossip, name="outer", epochs=12, eval_every_rounds=1000, min_peers=2)
    assert parse_job(text, "outer job").gossip.period_steps == H
    for peer in (first, second):
        cluster.client(peer).join(text)
    # The newcomer comes once the first two took an outer step: it must receive
    # an anchor and a momentum buffer that have moved, not the initial ones.
    wait_for(lambda: min(round_of(cluster, first), round_of(cluster, second)) >= 1, 120,
             "the first two peers to take an outer step")
    cluster.client(late).join_by_name("outer")
    jobs = wait_for(lambda: all_finished(first_jobs(cluster)), 300, "all three to finish")

    logs = [(p.dir / "state" / "jobs" / "outer" / "worker.log").read_text() for p in cluster.peers]
    for log in logs:
        assert f"outer SGD every {H} local steps: lr 0.7, Nesterov momentum {MOMENTUM}, after each round" in log
        anchors = "; on the int8 wire every 4th round averages the anchors instead, with no outer step"
        assert (anchors in log) == (gossip.get("wire") == "int8"), log[:3000]
    took = re.search(r"joining: took the state of round (\d+) ", logs[2])
    assert took and int(took.group(1)) >= 1, logs[2][:3000]
    for job in jobs:
        # A round (and an outer step) every H local steps, not every step.
        assert job.progress.round <= job.progress.step // H + 1, job.progress
    # What only the outer step makes: each worker's state (the newcomer's too) holds
    # an anchor that moved away from the start and a momentum buffer that is not zero.
    torch.manual_seed(init_seed(parse_job(text, "outer job"), "peer-0"))
    start = torch.cat([p.detach().reshape(-1) for p in make_model().parameters()])
    for peer in cluster.peers:
        anchor, momentum = outer_state(peer.dir / "state" / "jobs" / "outer")
        assert momentum.abs().sum() > 0 and not torch.equal(anchor, start), peer.peer_id
    records = [json.loads((p.dir / "state" / "jobs" / "outer" / "model.json").read_text()) for p in cluster.peers]
    models = {(p.dir / "state" / "jobs" / "outer" / "model.pt").read_bytes() for p in cluster.peers}
    assert len(models) == 1 and len({r["consensus_digest"] for r in records}) == 1
    # Within a point of the same job with rounds only: 0.976 with a round every step, 0.978 every 8
    # (docs/algorithms.md, "The outer step"; a guess scores 0.1).
    assert records[0]["metrics"]["consensus_accuracy"] >= 0.966, records[0]["metrics"]
