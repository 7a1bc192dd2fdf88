"""End to end, collapse is never silent (docs/operations.md, "When training
collapses"): a job made to diverge, on two real daemons, ends finished and
collapsed in every place a user looks: the worker log, the daemon's status and
peerctl, the live page's JSON, the metrics endpoint and model.json."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest

from peerd.core.health import BLOWUP, LOSS_RISE, NEVER_LEARNED, NONFINITE

from conftest import all_finished, example_job, first_jobs, peerctl, wait_for

pytestmark = pytest.mark.e2e

# "training collapsed at round R (RULE): VALUES", as peerd.core.health.describe words it.
# Which rule sees it first depends on how the loss explodes (finite or not, how far).
RULES = (BLOWUP, NONFINITE, LOSS_RISE, NEVER_LEARNED)
COLLAPSED = re.compile(rf"training collapsed at round \d+ \(({'|'.join(RULES)})\): \S")


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return reply.read().decode()


def test_a_job_made_to_diverge_ends_finished_and_marked_collapsed_everywhere(local_cluster):
    # An absurd LR: the loss explodes at the first updates (to ~1e20, finite or not).
    # Two epochs of two peers are 125 steps each; the blow-up rule sees it at step 50,
    # the never-learned rule at the end.
    cluster = local_cluster(2, metrics=True)
    text = example_job(job={"name": "diverge", "epochs": 2, "min_peers": 2, "eval_every_rounds": 40},
                       optimizer={"lr": 50.0})
    for peer in cluster.peers:
        cluster.client(peer).join(text)
    jobs = wait_for(lambda: all_finished(first_jobs(cluster)), 300, "both workers to finish the diverging job")

    for peer, job in zip(cluster.peers, jobs):
        p = job.progress
        # The job ended (its epochs are done); the flag says how.
        assert job.state == "finished" and p.collapsed, (peer.peer_id, p)
        assert COLLAPSED.match(p.collapse_reason), p.collapse_reason
        folder = Path(job.log_path).parent
        log = (folder / "worker.log").read_text()
        # One warning, at the transition, naming the round, the rule and the values.
        warnings = [line for line in log.splitlines() if "training collapsed at round" in line
                    and "finished" not in line]
        assert len(warnings) == 1 and p.collapse_reason in warnings[0], warnings
        # The end's summary line says it beside "finished".
        assert f"finished, collapsed ({p.collapse_reason}): " in log
        info = json.loads((folder / "model.json").read_text())
        assert info["collapsed"] is True and info["collapse_reason"] == p.collapse_reason

        # peerctl, human and --json.
        status = peerctl(peer, "status")
        assert status.returncode == 0 and "finished, collapsed" in status.stdout
        assert f"diverge/{peer.peer_id}: {p.collapse_reason}" in status.stdout
        [shown] = json.loads(peerctl(peer, "--json", "status").stdout)["jobs"]
        assert shown["progress"]["collapsed"] is True
        assert shown["progress"]["collapse_reason"] == p.collapse_reason

        # The live page's JSON (this worker's reason; the other one's flag from its Hello)
        # and the metrics endpoint.
        def members() -> dict[str, dict]:
            [view] = json.loads(get(peer.page_url + "api/status"))["view"]
            return {m["member"]: m for m in view["members"]}

        mine = members()[peer.peer_id]
        assert mine["collapsed"] and mine["collapse_reason"] == p.collapse_reason
        other = next(q.peer_id for q in cluster.peers if q is not peer)
        wait_for(lambda: members().get(other, {}).get("collapsed"), 10, f"{other}'s Hello to say it collapsed")
        metrics = get(peer.page_url + "metrics")
        assert 'peerd_collapsed{job="diverge"} 1.0' in metrics, metrics
