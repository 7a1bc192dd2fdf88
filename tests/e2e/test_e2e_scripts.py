"""Script jobs through real daemons: a user's own loop under peerd.attach,
joined by name, killed and restarted, drained, joined late; and scripts that
go wrong: before attach, or again and again after it."""

from __future__ import annotations

import json
import os
import re
import signal
import textwrap
from pathlib import Path

import pytest

from conftest import peerctl, wait_for

pytestmark = pytest.mark.e2e

JOBCODE = Path(__file__).parents[1] / "jobcode"


def script_job(name: str, script: Path, epochs: int = 800, args: list[str] | None = None) -> str:
    return textwrap.dedent(f"""
        [job]
        name = "{name}"
        script = "{script}"
        args = {json.dumps(args if args is not None else ["--flag", "value"])}
        local_batch = 8
        epochs = {epochs}
        epoch_chunks = 2
        drop_last = true
        eval_every_rounds = 10
        [optimizer]
        reference_batch = 16
        [checkpoint]
        every_rounds = 50
    """)


def attached(log: Path) -> list[tuple[int, int, int]]:
    """(step, counter, scheduler position) at each attach in the script's log."""
    text = log.read_text() if log.exists() else ""
    return [tuple(map(int, m)) for m in re.findall(r"attached: step (\d+) counter (\d+) last_epoch (\d+)", text)]


def test_a_script_job_joined_by_name_killed_drained_and_joined_late(local_cluster, tmp_path):
    cluster = local_cluster(4)
    first, second, third, late = cluster.peers
    wait_for(lambda: all(cluster.client(p).status().peers_known == 3 for p in cluster.peers), 30,
             "the four daemons to discover each other")
    # A relative path: each daemon takes it from the directory it was given (the job
    # file's, or `peerctl join --dir` joining by name).
    # 400 epochs: the kill, the late join and the drain are over by about a quarter of them.
    job = script_job("byo", Path("script_train.py"), epochs=400)
    cluster.client(first).join(job, str(JOBCODE))
    # Each daemon hears of the job on its own schedule: join by name only once it has.
    wait_for(lambda: all(any(j.name == "byo" for j in cluster.client(p).jobs().jobs) for p in (second, third, late)),
             30, "the other three daemons to hear of the job")
    cluster.client(second).join_by_name("byo", str(JOBCODE))
    cluster.client(third).join_by_name("byo", str(JOBCODE))

    def job_of(peer):
        jobs = cluster.client(peer).status().jobs
        return jobs[0] if jobs else None

    wait_for(lambda: all((j := job_of(p)) and j.progress.round >= 30 for p in (first, second, third)), 120,
             "three script workers to train 30 rounds")
    logs = {p.peer_id: p.dir / "state" / "jobs" / "byo" / "worker.log" for p in cluster.peers}

    # kill -9 of a script worker: restarted, it takes the others' state, its own object included.
    victim = job_of(second)
    os.kill(victim.worker_pid, signal.SIGKILL)
    # Meanwhile a newcomer joins: it starts from the running peers' registered state.
    # Joined by name from a directory without the script, it is refused, naming the path.
    out = peerctl(late, "join", "byo", "--dir", str(tmp_path))
    assert out.returncode != 0 and f"no such file {tmp_path / 'script_train.py'}" in out.stderr, out.stderr
    cluster.client(late).join_by_name("byo", str(JOBCODE))
    wait_for(lambda: len(attached(logs["peer-1"])) >= 2, 90, "peer-1's script to attach again after the kill")
    step, counter, position = attached(logs["peer-1"])[-1]
    assert step > 30 and counter == step and position > 0, attached(logs["peer-1"])
    wait_for(lambda: attached(logs["peer-3"]), 90, "the late script to attach")
    step, counter, position = attached(logs["peer-3"])[0]
    assert step > 30 and counter == step and position > 0, attached(logs["peer-3"])

    # A drained script worker leaves after its round, with a checkpoint; the others go on.
    pid = job_of(first).worker_pid
    cluster.client(first).leave("byo", drain=True)
    assert job_of(first) is None
    assert re.search(r"leaving at round \d+: the operator asked", logs["peer-0"].read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)

    def finished():
        jobs = [job_of(p) for p in (second, third, late)]
        assert all(j.state not in ("failed",) for j in jobs), jobs
        return all(j.state == "finished" for j in jobs) and jobs

    for j in wait_for(finished, 300, "the three remaining script workers to finish"):
        assert j.progress.metric_name == "accuracy" and j.progress.metric > 0.6, j
    # The script's scheduler followed the job: on a 4-peer job each local step moves it ~3-4 steps.
    assert "never called peer.step" not in logs["peer-2"].read_text()


@pytest.mark.parametrize("body, expect_state, message", [
    ("import no_such_package\n", "failed",
     "the script broken.py failed before peerd.attach(): ModuleNotFoundError: No module named 'no_such_package'"),
    ("print('no attach here')\n", "failed",
     "the script broken.py ended without calling peerd.attach(): a script job must attach its model and optimizer"),
])
def test_a_broken_script_fails_with_a_clear_message_and_the_daemon_stays_up(local_cluster, tmp_path, body,
                                                                            expect_state, message):
    cluster = local_cluster(1)
    [peer] = cluster.peers
    (tmp_path / "broken.py").write_text(body)
    cluster.client(peer).join(script_job("broken", tmp_path / "broken.py", args=[]), str(tmp_path))

    def settled():
        jobs = cluster.client(peer).status().jobs
        return jobs and jobs[0].state == expect_state and jobs[0]

    job = wait_for(settled, 90, f"the job to be {expect_state}")
    # The message: the error line, then the last lines of the traceback, if any.
    assert job.message.splitlines()[0] == message and job.workers[0].message == job.message
    assert job.restarts == 0  # it would fail the same way again
    assert cluster.client(peer).status().peer_id == peer.peer_id  # the daemon answers


def test_a_script_that_never_steps_is_told_so(local_cluster, tmp_path):
    cluster = local_cluster(1)
    [peer] = cluster.peers
    (tmp_path / "lazy.py").write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(JOBCODE)!r})
        import torch
        import peerd
        from real_job import make_model
        model = make_model()
        peer = peerd.attach(model, torch.optim.SGD(model.parameters(), lr=0.1))
    """))
    cluster.client(peer).join(script_job("lazy", tmp_path / "lazy.py", args=[]), str(tmp_path))
    job = wait_for(lambda: (j := cluster.client(peer).status().jobs) and j[0].state == "finished" and j[0], 90,
                   "the lazy script to end")
    log = Path(job.log_path).read_text()
    assert "the script lazy.py never called peer.step(): nothing was averaged" in log


def test_a_script_that_always_raises_fails_after_the_crash_limit_and_says_why(local_cluster, tmp_path):
    limit = {"worker": {"max_crashes": 3, "crash_window_s": 600, "restart_backoff_s": 0.2,
                        "restart_backoff_max_s": 0.4}}
    cluster = local_cluster(1, settings=lambda peer: limit)
    [peer] = cluster.peers
    (tmp_path / "boom.py").write_text(textwrap.dedent("""
        import torch
        import peerd
        model = torch.nn.Linear(4, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        peer = peerd.attach(model, optimizer)
        print(f"attached: step {peer.source.step_count}", flush=True)
        for _ in range(3):
            loss = model(torch.ones(8, 4)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            peer.step(batch_size=8, loss=loss.item())
        raise ValueError(f"boom after step {peer.source.step_count}")
    """))
    cluster.client(peer).join(script_job("boom", tmp_path / "boom.py", args=[]), str(tmp_path))
    job = wait_for(lambda: (j := cluster.client(peer).status().jobs) and j[0].state == "failed" and j[0], 180,
                   "the always-raising script job to fail")
    assert job.restarts == 2 and job.worker_pid == 0, job  # crashed 3 times: restarted twice, then not
    first, *traceback = job.message.splitlines()
    assert re.fullmatch(r"crashed 3 times in 600s, not restarted; last: the script boom\.py failed: "
                        r"ValueError: boom after step \d+", first), first
    assert re.fullmatch(r"ValueError: boom after step \d+", traceback[-1]), job.message
    assert any('raise ValueError(f"boom after step' in line for line in traceback), job.message
    assert job.workers[0].message == job.message and job.workers[0].state == "failed"

    # peerctl shows it too; the daemon still answers; the job ended here (a restarted daemon leaves it).
    out = peerctl(peer, "status")
    assert out.returncode == 0 and f"boom/peer-0: failed: {first}" in out.stdout, out.stdout + out.stderr
    assert f"\n    {traceback[-1]}" in out.stdout, out.stdout
    [shown] = json.loads(peerctl(peer, "status", "--json").stdout)["jobs"]
    assert shown["state"] == "failed" and shown["message"] == job.message, shown
    assert cluster.client(peer).status().peer_id == peer.peer_id
    job_dir = peer.dir / "state" / "jobs" / "boom"
    assert (job_dir / "ended").read_text() == "failed\n"
    daemon_log = (peer.dir / "daemon.log").read_text()
    assert re.search(r"job boom: worker peer-0 crashed 3 times in 600s; not restarting it: the job failed here "
                     r"\(last error: the script boom\.py failed: ValueError: boom after step \d+; see ", daemon_log)

    # Every restart went on from the checkpoint of the run before (written at its first
    # round), not from step 0.
    steps = [int(s) for s in re.findall(r"attached: step (\d+)", (job_dir / "worker.log").read_text())]
    assert len(steps) == 3 and steps[0] == 0 and 0 < steps[1] < steps[2], steps
