"""The daemon's page: the JSON it polls (built from the control API's replies and
the curves), why a member is not training, the page's files, and the JSON's
size for a job of 100 members."""

from __future__ import annotations

import asyncio
import json
import math
import time
from pathlib import Path

import pytest

from peerd.settings.config import DaemonConfig
from peerd.core.membership import JobEntry, PeerRecord
from peerd.daemon.app import Daemon
from peerd.daemon.history import CAPACITY, Point
from peerd.daemon.jobs import LocalJob, RestartPolicy, WorkerLaunch
from peerd.daemon.web import STATIC, page_routes, status_route
from peerd.daemon.web.status import BUDGET, job_views, natural_key, page_status, why
from peerd.settings.jobspec import parse_job
from peerd.control.jsonform import message_json
from peerd.control.progress import empty_progress
from peerd.proto.v1 import control_pb2, peer_pb2

from conftest import example_job, free_port

NAN = math.nan


def progress(**values) -> control_pb2.Progress:
    p = empty_progress()
    p.MergeFrom(control_pb2.Progress(**values))
    return p


def daemon_with_job(tmp_path: Path, name: str = "big") -> Daemon:
    daemon = Daemon(DaemonConfig(state_dir=tmp_path, peer_id="peer-0", control_socket=tmp_path / "s.sock"))
    spec = parse_job(example_job(job={"name": name}), "job")
    launch = WorkerLaunch("unix:x", "peer-0", "127.0.0.1", 1, tmp_path / "job.toml", "", tmp_path / "worker.log")
    job = LocalJob.create(spec, tmp_path, [launch], RestartPolicy(1.0, 2.0))
    w = job.first
    w.state, w.restarts, w.message = "restarting", 1, "RuntimeError: boom\nTraceback (most recent call last):"
    w.progress = progress(round=41, job_progress=1.25, loss=0.5, metric=0.9, metric_name="accuracy", lr=0.05,
                          global_batch=3200, local_batch=32, samples_per_s=900.0, segment_misses=3, phase="training")
    w.progress.rejected["bad_signature"] = 2
    daemon.jobs[name] = job
    return daemon


def add_peers(daemon: Daemon, job: str, count: int, now: float) -> None:
    """`count` other daemons, one worker each in `job`, with a full history each."""
    for k in range(1, count + 1):
        entry = JobEntry(job, daemon.jobs[job].spec.fingerprint, f"127.0.0.1:{20000 + k}", 40 + k % 3, "running",
                         "training", 0.05, 3200, 800.0 + k, 32, 0.01, progress=1.2, loss=0.5 + k / 1000, metric=0.9,
                         disagreement=0.01, segment_misses=k, rejected=0)
        daemon.membership.observe(PeerRecord(f"peer-{k}", f"127.0.0.1:{30000 + k}", "rack-a", "0.1.0", (entry,),
                                             now - 0.3))
        for i in range(CAPACITY):
            daemon.history.record(job, f"peer-{k}", Point(now - CAPACITY + i, i, i / 100, 2.0 - i / 200, 0.5 + i / 1000,
                                                          0.05, 800.0 + k, 32))


def test_why_a_member_is_not_training():
    assert why("running", "training") == ""
    assert why("running", "joining") == "joining: before its first round"
    assert why("running", "syncing").startswith("catching up")
    assert why("running", "waiting for peers (2 of 3 members ready)").startswith("waiting for peers (2 of 3")
    assert why("restarting", "training", "RuntimeError: boom\n  File x") == "restarting after a crash: RuntimeError: boom"
    assert why("starting", "", "", restarts=2) == "restarting after a crash"  # relaunched, not serving yet
    assert why("starting", "") == "starting its worker"
    assert why("failed", "", "crashed 5 times in 600s, not restarted; last: boom") == \
        "failed: crashed 5 times in 600s, not restarted; last: boom"
    assert why("stopped", "").startswith("left") and why("left", "").startswith("left")
    assert why("running", "draining") == "leaving after this round"
    assert why("finished", "finished") == "finished the job"


def test_the_json_carries_the_control_replies_as_peerctl_prints_them(tmp_path):
    daemon = daemon_with_job(tmp_path, "j")
    now = time.monotonic()
    add_peers(daemon, "j", 2, now)
    data = page_status(daemon, now)
    expected = message_json(daemon.status())  # peerctl --json status
    assert {**data["status"], "uptime_s": 0} == {**expected, "uptime_s": 0}
    assert data["peers"]["peers"][0]["job_states"][0]["loss"] == pytest.approx(0.501)  # peerctl --json peers
    assert data["jobs"] == message_json(daemon.list_jobs())
    [job] = data["view"]
    assert (job["name"], job["here"], job["round"], job["epochs"]) == ("j", True, 42, 1.25)
    assert job["metric_name"] == "accuracy" and job["consensus"] is None
    me = job["members"][0]
    assert (me["member"], me["state"], me["why"], me["rejected"], me["restarts"]) == \
        ("peer-0", "restarting", "restarting after a crash: RuntimeError: boom", 2, 1)
    assert me["message"].startswith("RuntimeError: boom\nTraceback")
    other = job["members"][1]
    assert (other["member"], other["daemon"], other["local"], other["why"], other["seen_s"]) == \
        ("peer-1", "peer-1", False, "", pytest.approx(0.3, abs=0.1))
    assert set(data["history"]["j"]) == {"peer-1", "peer-2"}


def test_the_job_says_the_lr_law_in_force_and_each_worker_here_its_factor(tmp_path):
    daemon = daemon_with_job(tmp_path, "j")
    law = "sqrt law against the reference batch 1600, cap 2"
    daemon.jobs["j"].first.progress.MergeFrom(progress(lr_law=law, lr_scale=2 ** 0.5))
    add_peers(daemon, "j", 1, time.monotonic())
    [job] = page_status(daemon, time.monotonic())["view"]
    assert job["lr_law"] == law
    assert [(m["member"], m["lr_scale"]) for m in job["members"]] == [("peer-0", 2 ** 0.5), ("peer-1", None)]
    json.dumps(job, allow_nan=False)
    daemon.jobs["j"].first.progress.lr_scale = NAN  # before the first step
    assert page_status(daemon, time.monotonic())["view"][0]["members"][0]["lr_scale"] is None


def test_the_job_says_the_outer_step_in_force(tmp_path):
    daemon = daemon_with_job(tmp_path, "j")
    assert page_status(daemon, time.monotonic())["view"][0]["outer"] == ""
    said = "outer SGD every 8 local steps: lr 0.7, Nesterov momentum 0.5"
    daemon.jobs["j"].first.progress.MergeFrom(progress(outer=said))
    assert page_status(daemon, time.monotonic())["view"][0]["outer"] == said


def test_a_member_known_only_to_the_curves_has_left_and_the_end_shows_the_consensus(tmp_path):
    daemon = daemon_with_job(tmp_path, "j")
    w = daemon.jobs["j"].first
    w.state, w.message = "finished", ""
    w.progress.phase = "finished"
    w.progress.metrics["consensus_accuracy"], w.progress.metrics["consensus_peers"] = 0.97, 3
    daemon.history.record("j", "peer-7", Point(100.0, 12, 0.5, 0.8, NAN, 0.05, 700.0, 16))
    [job] = page_status(daemon, now=130.0)["view"]
    gone = next(m for m in job["members"] if m["member"] == "peer-7")
    assert (gone["state"], gone["round"], gone["local_batch"], gone["seen_s"]) == ("left", 12, 16, 30.0)
    assert gone["why"].startswith("left the job")
    assert (job["consensus"], job["consensus_peers"]) == (0.97, 3)


def test_a_job_only_the_peers_run_is_shown_too():
    peers = control_pb2.ListPeersReply(peers=[control_pb2.PeerInfo(
        peer_id="b", state="suspected", last_seen_s=4.0,
        job_states=[control_pb2.PeerJob(name="theirs", state="running", phase="syncing", round=5, lr=NAN, loss=NAN,
                                        metric=NAN, share=NAN, samples_per_s=NAN, disagreement=NAN)])])
    from peerd.daemon.history import History

    [job] = job_views(control_pb2.StatusReply(peer_id="a"), peers, History(), now=0.0)
    assert (job["name"], job["here"], job["metric_name"], job["round"]) == ("theirs", False, "metric", 5)
    [m] = job["members"]
    assert m["suspected"] and m["why"].startswith("catching up") and m["loss"] is None
    json.dumps(job, allow_nan=False)  # NaN never reaches the JSON


def test_a_hello_carries_what_the_page_plots_of_a_remote_member(tmp_path):
    sender = daemon_with_job(tmp_path / "a", "j")
    receiver = Daemon(DaemonConfig(state_dir=tmp_path / "b", peer_id="peer-9", control_socket=tmp_path / "b.sock"))
    reply = peer_pb2.HelloReply.FromString(sender.hello_reply().SerializeToString())
    receiver.hello._observe(reply, "127.0.0.1:1")
    [j] = receiver.list_peers().peers[0].job_states
    assert (j.round, j.epochs, j.loss, j.metric, j.segment_misses, j.rejected) == (41, 1.25, 0.5, 0.9, 3, 2)


def test_a_collapse_shows_with_its_reason_here_and_as_a_flag_through_a_hello(tmp_path):
    sender = daemon_with_job(tmp_path / "a", "j")
    why = "training collapsed at round 50 (loss blow-up): loss 76.2 (first step 2.3) over the last 50 steps"
    p = sender.jobs["j"].first.progress
    p.collapsed, p.collapse_reason = True, why
    [job] = page_status(sender, time.monotonic())["view"]
    [me] = job["members"]
    assert me["collapsed"] is True and me["collapse_reason"] == why
    receiver = Daemon(DaemonConfig(state_dir=tmp_path / "b", peer_id="peer-9", control_socket=tmp_path / "b.sock"))
    receiver.hello._observe(peer_pb2.HelloReply.FromString(sender.hello_reply().SerializeToString()), "127.0.0.1:1")
    assert receiver.list_peers().peers[0].job_states[0].collapsed
    [job] = page_status(receiver, time.monotonic())["view"]
    [them] = job["members"]
    assert them["collapsed"] is True and them["collapse_reason"] == ""  # the reason stays on its own daemon's page


def test_members_sort_naturally():
    assert sorted(["peer-10", "peer-2", "peer-1.1", "peer-1.0"], key=natural_key) == \
        ["peer-1.0", "peer-1.1", "peer-2", "peer-10"]


def test_the_json_of_a_job_of_100_members_stays_small(tmp_path):
    daemon = daemon_with_job(tmp_path)
    now = time.monotonic()
    add_peers(daemon, "big", 99, now)
    route = status_route(daemon, clock=lambda: now)
    started = time.perf_counter()
    body, kind = route({})
    took = time.perf_counter() - started
    data = json.loads(body)
    [job] = data["view"]
    assert kind == "application/json" and len(job["members"]) == 100 and len(data["peers"]["peers"]) == 99
    assert [m["member"] for m in job["members"][:3]] == ["peer-0", "peer-1", "peer-2"]
    curves = data["history"]["big"]
    # 240 points each, thinned to the job's budget over its members
    assert len(curves) == 99 and all(len(c["t"]) == BUDGET // 99 for c in curves.values())
    small, _ = status_route(daemon, clock=lambda: now)({"points": "20"})
    assert all(len(c["loss"]) == 20 for c in json.loads(small)["history"]["big"].values())
    assert route({})[0] is body  # built once for pages polling together
    print(f"/api/status for 100 members: {len(body) / 1024:.0f} KiB in {took * 1000:.0f} ms; "
          f"20 points a curve: {len(small) / 1024:.0f} KiB")
    assert len(body) < 1024 * 1024 and len(small) < len(body)


def test_the_page_files_ship_with_the_package_and_fetch_nothing_from_elsewhere():
    routes = page_routes(Daemon(DaemonConfig(peer_id="x", state_dir=Path("/nonexistent"))))
    assert set(STATIC) | {"/api/status"} == set(routes)
    html = routes["/"]({})[0].decode()
    assert 'src="app.js"' in html and 'href="style.css"' in html
    for path in STATIC:
        body, kind = routes[path]({})
        text = body.decode()
        assert body and kind.endswith("charset=utf-8")
        assert "http://" not in text.replace("http://www.w3.org/2000/svg", "") and "https://" not in text
        assert "<script>" not in text  # the page's CSP runs only its own files


async def test_the_metrics_port_serves_the_page_its_json_and_the_metrics(daemons):
    port = free_port()
    await daemons("alpha", zeroconf=False, metrics_port=port)

    async def get(path: str) -> tuple[str, dict[str, str], bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        data = await reader.read()
        writer.close()
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        return lines[0], dict(line.split(": ", 1) for line in lines[1:]), body

    status, headers, body = await get("/")
    assert status == "HTTP/1.0 200 OK" and headers["Content-Type"].startswith("text/html")
    assert "default-src 'self'" in headers["Content-Security-Policy"] and b"app.js" in body
    status, headers, body = await get("/api/status?points=5")
    assert status == "HTTP/1.0 200 OK" and json.loads(body)["peer_id"] == "alpha"
    assert headers["Cache-Control"] == "no-store"
    status, _, body = await get("/metrics")
    assert status == "HTTP/1.0 200 OK" and b"peerd_peers_known" in body
    assert (await get("/nope"))[0] == "HTTP/1.0 404 Not Found"
