"""End to end, shared machines (docs/operations.md, "Shared machines"): real
daemons train a job while one machine's owner pauses it, or starts a program
of their own; its worker leaves the graceful way, the others go on, and it
joins again by itself."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from conftest import example_job, peerctl, wait_for

pytestmark = pytest.mark.e2e

# The owner's program: a core burnt under a name of its own (PR_SET_NAME), so
# that `[availability] commands` watches it and not what else runs on this machine.
OWNER = "owner-load"
LOAD = f"import ctypes\nctypes.CDLL(None).prctl(15, b'{OWNER}', 0, 0, 0)\nwhile True: pass\n"


def worker(cluster, peer):
    """(state, phase, pid) of the peer's only job's worker."""
    job = cluster.client(peer).status().jobs[0]
    return job.state, job.progress.phase, job.worker_pid


def training(cluster, peer):
    state, phase, pid = worker(cluster, peer)
    assert state not in ("failed", "restarting"), (peer.peer_id, state)
    return state == "running" and phase == "training" and pid


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def worker_log(peer) -> str:
    return (peer.dir / "state" / "jobs" / "shared" / "worker.log").read_text()


def assert_a_leave_not_a_failure(cluster, leaver, why: str, times: int = 1) -> None:
    """The leaver drained, `times` times, saying `why` (a regex: the owner's reason);
    the others saw it leave their view and never suspected it."""
    assert len(re.findall(rf"leaving at round \d+: {why}", worker_log(leaver))) == times, worker_log(leaver)[-3000:]
    for peer in cluster.peers:
        if peer is not leaver:
            log = worker_log(peer)
            assert re.search(rf"the view changed: left: {leaver.peer_id}\b", log), peer.peer_id
            assert f"suspecting {leaver.peer_id}" not in log, peer.peer_id


def start_training(cluster, text: str) -> None:
    wait_for(lambda: all(cluster.client(p).status().peers_known == len(cluster.peers) - 1 for p in cluster.peers),
             60, "discovery")
    for peer in cluster.peers:
        cluster.client(peer).join(text)


def in_one_view(cluster, text: str) -> bool:
    """Every worker's view holds every member, as a leave's "the view changed:
    left" needs: the global batch a worker trains for is the job's local batch
    per serving member in its view (these jobs plan no DBS batches)."""
    full = len(cluster.peers) * tomllib.loads(text)["job"]["local_batch"]
    return all(cluster.client(p).status().jobs[0].progress.global_batch == full for p in cluster.peers)


def test_a_paused_machine_leaves_its_job_gracefully_and_comes_back_by_itself(local_cluster):
    cluster = local_cluster(3)
    text = example_job(job={"name": "shared", "epochs": 200, "min_peers": 3})
    start_training(cluster, text)
    first, second, owned = cluster.peers
    pid = wait_for(lambda: all(training(cluster, p) for p in cluster.peers) and training(cluster, owned), 180,
                   "the three to train")
    wait_for(lambda: in_one_view(cluster, text), 60, "every worker to see the three")

    out = peerctl(owned, "pause", "--for", "20s")
    ends = time.monotonic() + 20.0  # at the latest: it answers once the workers have left
    assert out.returncode == 0 and "not training: paused by owner until " in out.stdout, out
    assert gone(pid) and worker(cluster, owned)[::2] == ("paused", 0)
    status = peerctl(owned, "status").stdout
    assert "not training: paused by owner until " in status and " paused " in status
    wait_for(lambda: "paused by owner" in peerctl(first, "peers").stdout, 30, "the others to show why")
    rounds = cluster.client(first).status().jobs[0].progress.round
    wait_for(lambda: cluster.client(first).status().jobs[0].progress.round > rounds + 20, 60,
             "the other two to go on")
    assert all(training(cluster, p) for p in (first, second))

    again = wait_for(lambda: training(cluster, owned), 120, "the paused machine to join again by itself")
    back_s = time.monotonic() - ends
    assert again != pid
    assert cluster.client(owned).status().not_training == ""
    wait_for(lambda: in_one_view(cluster, text), 60, "every worker to see the three again")

    # Without --for the pause lasts until `peerctl resume`, which ends it early.
    out = peerctl(owned, "pause")
    assert out.returncode == 0 and "not training: paused by owner; the jobs here left" in out.stdout, out
    assert gone(again) and worker(cluster, owned)[::2] == ("paused", 0)
    out = peerctl(owned, "resume")
    started = time.monotonic()
    assert out.returncode == 0 and "training again" in out.stdout, out
    wait_for(lambda: training(cluster, owned), 120, "the resumed machine to train")
    resumed_s = time.monotonic() - started
    assert_a_leave_not_a_failure(cluster, owned, "paused by owner", times=2)
    left_s = [float(s) for s in re.findall(r"job\(s\) left in ([0-9.]+)s", (owned.dir / "daemon.log").read_text())]
    print(f"\npause: the device free {' and '.join(f'{s:.1f}s' for s in left_s)} after the daemon took the pause; "
          f"training again {back_s:.1f}s after the pause ended, {resumed_s:.1f}s after `peerctl resume` returned")


def test_the_owner_arriving_makes_the_worker_leave_and_it_returns_after_the_hold_off(local_cluster, tmp_path):
    hold_off_s = 3.0
    owned_settings = {"availability": {"mode": "when-free", "hold_off_s": hold_off_s, "check_interval_s": 1.0,
                                       "cpu_share": 0.05, "commands": [OWNER]}}
    # A low cpu_share: on a busy machine the load gets what the scheduler gives it
    # (0.2 of a core seen), and `commands` keeps everything else out.
    cluster = local_cluster(2, settings=lambda peer: owned_settings if peer.index == 1 else {})
    first, owned = cluster.peers
    text = example_job(job={"name": "shared", "epochs": 200})
    start_training(cluster, text)
    pid = wait_for(lambda: training(cluster, first) and training(cluster, owned), 180, "both to train")
    # The owned worker may join by taking the state and train at once; the other's
    # view holds it a Hello later. Its leave is seen as one only from then on.
    wait_for(lambda: in_one_view(cluster, text), 60, "each worker to see the other")

    script = tmp_path / "load.py"
    script.write_text(LOAD)
    load = subprocess.Popen([sys.executable, str(script)])
    try:
        arrived = time.monotonic()
        wait_for(lambda: gone(pid), 60, "the owned machine's worker to leave", interval_s=0.05)
        free_s = time.monotonic() - arrived
        status = cluster.client(owned).status()
        assert status.not_training.startswith(f"busy: pid {load.pid} {OWNER} uses "), status.not_training
        assert status.jobs[0].state == "paused"
        wait_for(lambda: f"busy: pid {load.pid}" in peerctl(first, "peers").stdout, 30, "the other to show why")
        rounds = cluster.client(first).status().jobs[0].progress.round
        wait_for(lambda: cluster.client(first).status().jobs[0].progress.round > rounds + 20, 60,
                 "the other to go on alone")
        assert worker(cluster, owned)[0] == "paused", "the owner is still there"
    finally:
        load.kill()
        load.wait()
    left = time.monotonic()
    wait_for(lambda: training(cluster, owned), 120, "the owned machine to train again")
    back_s = time.monotonic() - left
    assert back_s >= hold_off_s, "it came back within the hold-off"
    assert_a_leave_not_a_failure(cluster, owned, r"busy: pid \d+ ")
    daemon_log = (owned.dir / "daemon.log").read_text()
    assert re.search(r"not training: busy: pid \d+ owner-load uses [0-9.]+ cores: 1 job\(s\) left in", daemon_log)
    print(f"\nowner arrives: the device was free {free_s:.1f}s after the owner's program started "
          f"(check every 1 s); training again {back_s:.1f}s after it ended (hold-off {hold_off_s:g}s)")
