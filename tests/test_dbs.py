"""Dynamic batch size end to end: real daemons, one of them slowed down by the
testing knob, find each other, publish their measured speeds through Hello, and
the slow peer ends up with a clearly smaller batch and data share."""

from __future__ import annotations

import json

import pytest

from conftest import example_job, wait_for
from test_e2e import peerctl

pytestmark = pytest.mark.e2e


def test_a_slowed_peer_gets_a_smaller_batch_and_share(local_cluster):
    cluster = local_cluster(3, slowdowns=(1.0, 1.0, 3.0))
    wait_for(lambda: all(cluster.client(p).status().peers_known == 2 for p in cluster.peers),
             30, "every daemon to see the other two")
    text = example_job(job={"name": "dbs", "epochs": 12, "eval_every_rounds": 1000, "global_batch": 96,
                            "min_local_batch": 4, "rebalance_rounds": 5, "rebalance_threshold": 0.1})
    for peer in cluster.peers:
        with cluster.client(peer) as c:
            c.join(text, "")

    def progress():
        rows = {}
        for p in cluster.peers:
            job = cluster.client(p).status().jobs[0]
            assert job.state not in ("failed", "restarting"), (p.peer_id, job)
            rows[p.peer_id] = job.progress
        return rows

    def rebalanced():
        rows = progress()
        shares = [rows[f"peer-{i}"].share for i in range(3)]
        # Epoch ≥ 1 everywhere: the split was made from measured speeds, not the equal
        # start. On a loaded machine the speeds may reach the others an epoch late, so
        # wait for the split to show them (it must, within the limit).
        # local_batch is the last step's: the tail of an epoch may be short, so this
        # is polled too rather than read once.
        batches = [rows[f"peer-{i}"].local_batch for i in range(3)]
        return (all(r.epoch >= 1 for r in rows.values()) and all(s == s for s in shares)
                and shares[2] * 1.5 < min(shares[:2]) and batches[2] * 1.5 < min(batches[:2]) and rows)

    rows = wait_for(rebalanced, 240, "every peer to start an epoch split by measured speeds")
    fast, slow = [rows["peer-0"], rows["peer-1"]], rows["peer-2"]
    assert slow.samples_per_s < min(p.samples_per_s for p in fast)
    # Every peer's plan adds up to the job's global batch, which its LR is scaled for.
    assert all(r.global_batch == 96 for r in rows.values()), rows

    # Another peer sees the same through its daemon's Hello view: `peerctl peers`
    # (as of each peer's last Hello, a second or so behind: polled).
    def seen_through_hello():
        out = peerctl(cluster.peers[0], "--json", "peers")
        assert out.returncode == 0, out.stderr
        seen = {p["peer_id"]: p["job_states"][0] for p in json.loads(out.stdout)["peers"]}
        return (seen["peer-2"]["local_batch"] < seen["peer-1"]["local_batch"]
                and seen["peer-2"]["samples_per_s"] < seen["peer-1"]["samples_per_s"])

    wait_for(seen_through_hello, 30, "peerctl peers to show peer-2 with a smaller batch and speed than peer-1")
    table = peerctl(cluster.peers[0], "peers").stdout
    assert "samples/s" in table and "share" in table and "%" in table
