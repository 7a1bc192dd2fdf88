"""End to end: two real daemons under mutual TLS ([tls], one lab CA) train a job
together, their segments over the bulk lane inside TLS."""

from __future__ import annotations

import pytest

from certs import make_ca, needs_openssl, settings
from conftest import all_finished, example_job, first_jobs, peerctl, wait_for, wait_for_discovery

pytestmark = [pytest.mark.e2e, needs_openssl]


def test_daemons_under_tls_train_together_over_the_bulk_lane(local_cluster, tmp_path):
    pki = tmp_path / "pki"
    make_ca(pki, "lab")
    tls = {i: settings(pki, "lab", f"peer-{i}") for i in range(2)}
    cluster = local_cluster(2, settings=lambda peer: {"tls": {
        "cert_file": str(tls[peer.index].cert_file), "key_file": str(tls[peer.index].key_file),
        "ca_file": str(tls[peer.index].ca_file)}})
    wait_for_discovery(cluster)
    text = example_job(job={"name": "sealed", "epochs": 2, "eval_every_rounds": 20, "min_peers": 2})
    job_file = cluster.out / "job.toml"
    job_file.write_text(text)
    for peer in cluster.peers:
        out = peerctl(peer, "join", str(job_file))
        assert out.returncode == 0, out.stderr
    reached: list[int] = []

    def finished():
        jobs = first_jobs(cluster)
        reached.extend(j.progress.partners_reached for j in jobs if j.progress.step > 0)
        return all_finished(jobs) and jobs

    jobs = wait_for(finished, 300, "both workers to finish")
    assert max(reached) >= 1 and all(j.progress.metric > 0.6 for j in jobs), jobs
    for peer, other in zip(cluster.peers, reversed(cluster.peers)):
        log = (peer.dir / "state" / "jobs" / "sealed" / "worker.log").read_text()
        # Each fetched its partner's segments over the partner's lane, under TLS (a failed
        # lane fetch is a miss, never a fall back to gRPC), and nothing was refused.
        assert ", TLS)" in log and "over its bulk lane (port" in log, log[-3000:]
        assert "over gRPC" not in log and "TLS handshake failed" not in log
        assert "TLS handshake failed" not in (peer.dir / "daemon.log").read_text()
