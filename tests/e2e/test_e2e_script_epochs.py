"""End to end: a plain script converted the natural way — its epoch loop kept
around peer.loader(), BatchNorm, a per-batch OneCycleLR as long as
peerd.total_steps() — trains to the end on 3 peers and alone, through real
daemons (docs/operations.md, "Script jobs")."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import textwrap
from pathlib import Path

import pytest
import torch

from conftest import all_finished, wait_for
from peerd.examples.mnist import make_datasets

pytestmark = pytest.mark.e2e

JOBCODE = Path(__file__).parents[1] / "jobcode"
EPOCHS = 3  # the job's, and the script's own outer loop's


def epoch_job(name: str, peers: int, local_batch: int) -> str:
    return textwrap.dedent(f"""
        [job]
        name = "{name}"
        script = "epoch_script.py"
        epochs = {EPOCHS}
        local_batch = {local_batch}
        min_peers = {peers}
        eval_every_rounds = 1000
        metric = "accuracy"
        [optimizer]
        reference_batch = 32
        [gossip]
        period_steps = 1
    """)


def accuracy(path: Path) -> float:
    """The test accuracy of a saved model.pt, evaluated here by the script's own code."""
    spec = importlib.util.spec_from_file_location("epoch_script_under_test", JOBCODE / "epoch_script.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    model = script.make_model()
    model.load_state_dict(torch.load(path, weights_only=True))
    return script.evaluate(model, make_datasets()[1])


def test_a_script_with_an_epoch_loop_and_onecycle_finishes_on_three_peers_and_alone(local_cluster):
    cluster = local_cluster(3)
    wait_for(lambda: all(cluster.client(p).status().peers_known == 2 for p in cluster.peers), 30,
             "the three daemons to discover each other")
    # The script's loader and schedule take the job's local_batch: 3 peers × 11 is
    # about the single process's 32, the global batch its LR was chosen for.
    for peer in cluster.peers:
        cluster.client(peer).join(epoch_job("epochs3", 3, 11), str(JOBCODE))
    # The same script alone on one peer: the single-process run to compare with.
    cluster.client(cluster.peers[0]).join(epoch_job("epochs1", 1, 32), str(JOBCODE))

    def jobs():
        return [j for p in cluster.peers for j in cluster.client(p).status().jobs]

    final = wait_for(lambda: all_finished(jobs()), 240, "the four script workers to finish")
    assert sorted(j.name for j in final) == ["epochs1", "epochs3", "epochs3", "epochs3"]
    assert all(j.restarts == 0 for j in final), final

    dirs = [p.dir / "state" / "jobs" / "epochs3" for p in cluster.peers]
    alone = cluster.peers[0].dir / "state" / "jobs" / "epochs1"
    for d, batch in [*((d, 11) for d in dirs), (alone, 32)]:
        summary = json.loads((d / "summary.json").read_text())
        # The script ran in its worker's own directory: its relative writes are its own.
        assert Path(summary["cwd"]) == d.resolve() and (d / "last.pt").is_file(), summary
        assert Path(summary["script"]) == (JOBCODE / "epoch_script.py").resolve()
        # Its epoch loop ended: every pass made a loader, the first took the job to its end,
        # through each epoch from the one it joined in (a late starter takes the others' position).
        seen = summary["epochs_seen"]
        assert summary["passes"] == EPOCHS and seen == list(range(seen[0], EPOCHS)), summary
        # The schedule ran to its end and never past it (OneCycleLR would have raised).
        assert summary["total_steps"] - EPOCHS <= summary["last_epoch"] <= summary["total_steps"], summary
        assert not [w for w in summary["warnings"] if "requires_grad" in w], summary["warnings"]
        log = (d / "worker.log").read_text()
        # The LR law saw the planned global batch (local_batch × the trainers), never a short step's.
        batches = [int(b) for b in re.findall(r"global batch now (\d+)", log)]
        assert all(b % batch == 0 for b in batches) and len(batches) <= 3, batches
        assert (d / "model.pt").is_file()
    # Alone: one process's steps, each epoch's short last one included, and no more.
    assert seen == [0, 1, 2] and summary["steps"] == summary["total_steps"], summary

    digests = {hashlib.sha256((d / "model.pt").read_bytes()).hexdigest() for d in dirs}
    assert len(digests) == 1, "the three peers saved different models"
    together, single = accuracy(dirs[0] / "model.pt"), accuracy(alone / "model.pt")
    assert abs(together - single) <= 0.005, (together, single)
