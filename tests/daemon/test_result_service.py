"""A finished job's model between two real daemons in one event loop (no
training: the jobs are held, alpha's worker marked finished with a saved model):
beta takes it for its worker through Peer.GetJobResult, in ranges, proving the
job secret; a model of another state layout, another secret, or no holder is
not taken, and says why (peerd/daemon/results.py)."""

from __future__ import annotations

import json
import os

import pytest

from peerd.core.codes import WorkerState
from peerd.daemon.results import NONE, PENDING, TAKEN, ResultFiles, Saved, TakeRefused, download
from peerd.proto.v1 import control_pb2
from peerd.security.auth import new_secret_file

from conftest import until

MODULE = "def make_model():\n    raise SystemExit('not run here')\n"
MODEL = os.urandom((1 << 20) + 12345)  # two ranges


def job_text(name: str) -> str:
    return f'[job]\nname = "{name}"\nmodule = "heldjob"\nsecret_file = "job.secret"\n'


def lab_dir(path, secret_from=None):
    path.mkdir()
    (path / "heldjob.py").write_text(MODULE)
    if secret_from is None:
        new_secret_file(path / "job.secret")
    else:
        (path / "job.secret").write_bytes((secret_from / "job.secret").read_bytes())
        (path / "job.secret").chmod(0o600)
    return path


def finish_with_model(daemon, name: str, fingerprint: str = "state-fp") -> dict:
    worker = daemon.registry.get(name).first
    out = worker.launch.log_path.parent
    (out / "model.pt").write_bytes(MODEL)
    info = {"job": name, "fingerprint": fingerprint, "consensus": ["alpha", "gamma"], "consensus_digest": "d1g3st",
            "metrics": {"accuracy": 0.97}}
    (out / "model.json").write_text(json.dumps(info))
    worker.state = WorkerState.FINISHED
    return info


async def two_daemons(daemons, tmp_path, same_secret: bool = True):
    a = await daemons("alpha")
    b = await daemons("beta", seeds=(a.peer_address,))
    lab_a = lab_dir(tmp_path / "lab-a")
    lab_b = lab_dir(tmp_path / "lab-b", secret_from=lab_a if same_secret else None)
    a.registry.join(job_text("held"), str(lab_a), start=False)
    b.registry.join(job_text("held"), str(lab_b), start=False)
    return a, b


def take_request(fingerprint: str = "state-fp") -> control_pb2.ResultRequest:
    return control_pb2.ResultRequest(job="held", member="beta", fingerprint=fingerprint, **{"from": ["alpha"]})


async def test_a_daemon_takes_a_finished_members_model_whole_and_verified(daemons, tmp_path):
    a, b = await two_daemons(daemons, tmp_path)
    assert (await b.take_result(take_request())).outcome == PENDING  # nobody finished yet
    info = finish_with_model(a, "held")
    await a.hello.hello_all(changed=True)
    await until(lambda: b.membership.result_holders("held", b.registry.get("held").spec.fingerprint) == ["alpha"],
                "beta to hear that alpha finished")
    reply = await b.take_result(take_request())
    assert reply.outcome == TAKEN and reply.from_peer == "alpha", reply
    out = b.registry.get("held").first.launch.log_path.parent
    assert (out / "model.pt").read_bytes() == MODEL
    taken = json.loads((out / "model.json").read_text())
    assert taken == {**info, "taken_from": "alpha"} and json.loads(reply.record) == taken

    # A model of another state layout (another model class under the same job) is not taken.
    (out / "model.pt").unlink()
    refused = await b.take_result(take_request(fingerprint="other-layout"))
    assert refused.outcome == NONE and "another state layout" in refused.detail and not (out / "model.pt").exists()


async def test_a_model_goes_only_to_a_holder_of_the_job_secret(daemons, tmp_path):
    a, b = await two_daemons(daemons, tmp_path, same_secret=False)
    finish_with_model(a, "held")
    await a.hello.hello_all(changed=True)
    await until(lambda: b.membership.result_holders("held", b.registry.get("held").spec.fingerprint),
                "beta to hear that alpha finished")
    reply = await b.take_result(take_request())
    assert reply.outcome == NONE and "alpha" in reply.detail and "refused" in reply.detail, reply
    assert not (b.registry.get("held").first.launch.log_path.parent / "model.pt").exists()


async def test_a_download_refuses_bytes_that_do_not_match_the_senders_sha256(tmp_path):
    path = tmp_path / "model.pt"
    path.write_bytes(MODEL)
    (tmp_path / "model.json").write_text('{"fingerprint": "f"}')
    files, saved = ResultFiles(), Saved(path, "alpha")

    async def honest(holder, request):
        return files.reply(saved, request.offset)

    data, record, member = await download(honest, "alpha", "held", "spec")
    assert data == MODEL and record == {"fingerprint": "f"} and member == "alpha"

    async def flipped(holder, request):
        reply = files.reply(saved, request.offset)
        if request.offset:
            reply.data = bytes([reply.data[0] ^ 1]) + reply.data[1:]
        return reply

    with pytest.raises(TakeRefused, match="sha256"):
        await download(flipped, "alpha", "held", "spec")

    async def short(holder, request):
        reply = files.reply(saved, request.offset)
        reply.data = reply.data[:-1] if request.offset else reply.data
        return reply

    with pytest.raises(TakeRefused, match="inconsistent"):
        await download(short, "alpha", "held", "spec")


async def test_a_daemon_restarted_after_the_end_still_serves_the_jobs_model(daemons, tmp_path):
    first = await daemons("alpha")
    lab_a = lab_dir(tmp_path / "lab-a")
    first.registry.join(job_text("held"), str(lab_a), start=False)
    info = finish_with_model(first, "held")
    (first.registry.get("held").job_dir / "ended").write_text("finished\n")  # as LocalJob writes it
    await first.aclose()

    a = await daemons("alpha")  # the same state directory: the finished job is kept, not resumed
    assert "held" not in a.registry.jobs and "held" in a.registry.finished
    b = await daemons("beta", seeds=(a.peer_address,))
    b.registry.join(job_text("held"), str(lab_dir(tmp_path / "lab-b", secret_from=lab_a)), start=False)
    await until(lambda: b.membership.result_holders("held", b.registry.get("held").spec.fingerprint) == ["alpha"],
                "beta to hear that alpha holds the finished job")
    reply = await b.take_result(take_request())
    assert reply.outcome == TAKEN, reply
    out = b.registry.get("held").first.launch.log_path.parent
    assert (out / "model.pt").read_bytes() == MODEL and json.loads((out / "model.json").read_text())["job"] == "held"
    assert json.loads(reply.record) == {**info, "taken_from": "alpha"}
