"""End to end: a job secret keeps an outsider out of the averaging.

Three real daemons on 127.0.0.1 run the same job (same fingerprint); two hold
the same secret, the third another one. The two train together; the third is
refused by both, both ways, and is never averaged with.
"""

from __future__ import annotations

import torch

from peerd.security.auth import new_secret_file
from peerd.examples.mnist import make_model
from peerd.settings.jobspec import parse_job
from peerd.worker.train.trainer import init_seed

import pytest

from conftest import all_finished, example_job, first_jobs, peerctl, wait_for, wait_for_discovery
from e2e_helpers import flat_params, rel_distance

pytestmark = pytest.mark.e2e


def test_peers_with_the_job_secret_train_together_and_never_average_with_a_wrong_secret(local_cluster):
    cluster = local_cluster(3)
    wait_for_discovery(cluster)
    # The secret path is relative: each peer's file sits next to its job file.
    # The three start together (min_peers: the outsider is ready as any member is),
    # so the two sides meet however quick the machine is.
    text = example_job(job={"name": "guarded", "epochs": 3, "eval_every_rounds": 20, "init": "per-peer",
                            "secret_file": "job.secret", "min_peers": 3})
    spec = parse_job(text, "guarded job")
    for peer, holder in zip(cluster.peers, ("lab", "lab", "outsider")):
        directory = cluster.out / holder
        if not directory.exists():
            directory.mkdir()
            new_secret_file(directory / "job.secret")
            (directory / "job.toml").write_text(text)
        out = peerctl(peer, "join", str(directory / "job.toml"))
        assert out.returncode == 0, out.stderr

    history: list[tuple[str, int]] = []

    def finished():
        jobs = dict(zip((p.peer_id for p in cluster.peers), first_jobs(cluster)))
        done = all_finished(jobs.values())
        history.extend((k, j.progress.partners_reached) for k, j in jobs.items() if j.progress.step > 0)
        return done and jobs

    jobs = wait_for(finished, 400, "all three workers to finish")
    # The outsider never reached a partner; the two holders of the secret reached each other.
    assert all(reached == 0 for peer, reached in history if peer == "peer-2"), history
    assert any(reached >= 1 for peer, reached in history if peer == "peer-0")
    # Each side refused the other's requests for want of the right proof.
    for job in jobs.values():
        assert job.progress.rejected["bad_mac"] > 0, job.progress
    assert jobs["peer-0"].progress.metric > 0.6

    # They started from different random models: the two pulled together, the outsider stayed apart.
    initial, trained = [], []
    for peer in cluster.peers:
        torch.manual_seed(init_seed(spec, peer.peer_id))
        initial.append(torch.cat([p.detach().reshape(-1) for p in make_model().parameters()]))
        saved = torch.load(peer.dir / "state" / "jobs" / "guarded" / "model.pt", weights_only=True)
        trained.append(flat_params(saved))
    start = rel_distance(initial[0], initial[1])
    together = rel_distance(trained[0], trained[1])
    apart = min(rel_distance(trained[0], trained[2]), rel_distance(trained[1], trained[2]))
    assert together < 0.2 * start, (start, together)
    assert apart > 5 * together, (together, apart)
    # The end does not wait for a member it cannot authenticate with: no proof, no model, at once.
    for peer in cluster.peers:
        log = (peer.dir / "state" / "jobs" / "guarded" / "worker.log").read_text()
        assert "the end: waiting for" not in log, peer.peer_id
