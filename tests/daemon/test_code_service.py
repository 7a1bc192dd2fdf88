"""Peer.GetJobCode between two real daemons in one event loop (no training: the
job is held): a realm secret and the job secret proved together, the bundle in
ranges, and refusals for another secret, a job held without one, another code."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from peerd.security.auth import Authenticator, load_secret, new_secret_file
from peerd.cli import peerctl
from peerd.core.bundle import Limits, digest, unpack
from peerd.core.codes import WorkerState
from peerd.errors import ConfigError, PeerUnavailable, Unauthenticated
from peerd.proto.v1 import peer_pb2

from conftest import until

MODULE = "def make_model():\n    raise SystemExit('not run here')\n"


def job_text(name: str, secret: bool) -> str:
    return (f'[job]\nname = "{name}"\nmodule = "heldjob"\nfiles = ["big.bin"]\n'
            + ('secret_file = "job.secret"\n' if secret else ""))


@pytest.fixture
def lab(tmp_path):
    lab = tmp_path / "lab"
    lab.mkdir()
    (lab / "heldjob.py").write_text(MODULE)
    (lab / "big.bin").write_bytes(bytes(range(256)) * 6000)  # 1.5 MiB: two ranges
    new_secret_file(lab / "job.secret")
    new_secret_file(tmp_path / "realm.secret")
    return lab


async def test_a_peer_sends_a_job_s_code_only_to_a_holder_of_the_job_secret(daemons, lab, tmp_path):
    realm = {"realm_secret_file": tmp_path / "realm.secret"}
    a = await daemons("alpha", **realm)
    b = await daemons("beta", seeds=(a.peer_address,), **realm)
    await until(lambda: b.membership.get("alpha"), "beta to know alpha")
    spec = a.registry.join(job_text("held", secret=True), str(lab), start=False)
    bare = a.registry.join(job_text("bare", secret=False), str(lab), start=False)
    assert spec.code == bare.code and digest(a.registry.code.tar(spec.code).read_bytes()) == spec.code
    holder = Authenticator(load_secret(lab / "job.secret"))

    async def fetch(name: str, code: str, auth: Authenticator, offset: int = 0) -> peer_pb2.JobCodeReply:
        request = peer_pb2.JobCodeRequest(name=name, code=code, offset=offset)
        return await b.hello.job_code("alpha", request, auth)

    first = await fetch("held", spec.code, holder)
    rest = await fetch("held", spec.code, holder, len(first.data))
    assert first.total == len(first.data) + len(rest.data) and len(first.data) == 1 << 20
    files = unpack(first.data + rest.data, spec.code)
    assert sorted(files) == ["big.bin", "heldjob.py"] and files["heldjob.py"] == MODULE.encode()

    new_secret_file(tmp_path / "other.secret")
    with pytest.raises(Unauthenticated, match="proof does not match"):
        await fetch("held", spec.code, Authenticator(load_secret(tmp_path / "other.secret")))
    with pytest.raises(Unauthenticated, match="has no job secret here"):
        await fetch("bare", spec.code, holder)
    with pytest.raises(PeerUnavailable, match="NOT_FOUND: this peer holds no code bundle"):
        await fetch("held", "0" * 64, holder)
    assert a.peer_servicer.rejections.counts["bad_mac"] == 1 and a.peer_servicer.rejections.counts["no_secret"] == 1


async def test_a_bundle_over_the_limit_is_refused_before_it_is_kept(daemons, lab):
    a = await daemons("alpha")
    b = await daemons("beta", seeds=(a.peer_address,))
    await until(lambda: b.membership.get("alpha"), "beta to know alpha")
    spec = a.registry.join(job_text("held", secret=True), str(lab), start=False)
    b.registry.code.limits = Limits(max_bytes=1 << 20)  # the bundle is 1.5 MiB
    with pytest.raises(PeerUnavailable, match=r"alpha offers a code bundle of 1\.5 MiB, over the limit of 1\.0 MiB"):
        await b.by_name.fetch(spec, ["alpha"], Authenticator(load_secret(lab / "job.secret")))
    assert not b.registry.code.root.exists()


async def test_a_job_whose_code_came_from_peers_resumes_from_the_store_checked_again(daemons, lab, tmp_path):
    a = await daemons("alpha")
    b = await daemons("beta")
    spec = a.registry.join(job_text("held", secret=True), str(lab), start=False)
    text = (a.registry.jobs["held"].job_dir / "job.toml").read_text()
    b.registry.code.keep(a.registry.code.tar(spec.code).read_bytes(), spec.code, {"peer": "alpha"})
    await b.pause(0)  # the owner's pause: the job is held, no worker starts
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "job.secret").write_bytes((lab / "job.secret").read_bytes())
    (mine / "job.secret").chmod(0o600)
    await b.join(text, str(mine), fetched=True)
    job_dir = b.registry.jobs["held"].job_dir
    assert json.loads((job_dir / "joined.json").read_text()) == {"spec_dir": str(mine), "fetched": True,
                                                                  "by_name": True}
    run_dir = b.registry.code.dir(spec.code)
    assert b.registry.jobs["held"].first.launch.spec_dir == str(run_dir)
    # Changed in the store after the check: the resume writes the bundle's files again.
    (run_dir / "heldjob.py").write_text("import os\n")
    await b._rejoin(job_dir, "resumed")
    assert (run_dir / "heldjob.py").read_text() == MODULE
    # A bundle changed in the store is refused, and the job is not joined again.
    tar = b.registry.code.tar(spec.code)
    tar.write_bytes(tar.read_bytes()[:-1] + b"\1")
    del b.registry.jobs["held"]
    await b._rejoin(job_dir, "resumed")
    assert "held" not in b.registry.jobs


async def test_a_join_refused_after_its_code_is_bundled_leaves_nothing_in_the_store(daemons, lab):
    # A local-data job without a job secret is refused by the data check, which
    # runs after the bundle is made: the store must not keep it.
    a = await daemons("alpha")
    text = job_text("local", secret=False) + 'data_mode = "local"\n'
    with pytest.raises(ConfigError, match="needs a job secret"):
        a.registry.join(text, str(lab), start=False)
    assert "local" not in a.registry.jobs
    assert not a.registry.code.root.exists() or list(a.registry.code.root.iterdir()) == []


async def test_the_code_shown_before_the_confirmation_is_where_the_notice_says(daemons, lab, tmp_path):
    # peerctl join NAME prints "stored in PATH" and asks: the files must be there
    # to read before the operator answers (docs/operations.md, "Verified on arrival").
    a = await daemons("alpha")
    b = await daemons("beta", seeds=(a.peer_address,))
    a.registry.join(job_text("held", secret=True), str(lab), start=False)
    a.registry.jobs["held"].first.state = WorkerState.RUNNING  # advertised as running; no process started
    await until(lambda: any(n == "held" for n, _ in b.membership.jobs()), "beta to see alpha's job")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "job.secret").write_bytes((lab / "job.secret").read_bytes())
    (mine / "job.secret").chmod(0o600)
    reply = await b.fetch_code("held", str(mine))
    assert reply.source == "fetched" and reply.path
    assert (Path(reply.path) / "heldjob.py").read_text() == MODULE
    assert sorted(p.name for p in Path(reply.path).iterdir()) == sorted(reply.files)


async def test_a_peer_that_left_the_view_is_skipped_when_the_spec_is_asked(daemons, lab):
    # ByName.spec asks the job's peers in turn, awaiting each: one may leave the
    # view meanwhile, and the next must be asked, not the join fail on it.
    a = await daemons("alpha")
    b = await daemons("beta", seeds=(a.peer_address,))
    a.registry.join(job_text("held", secret=True), str(lab), start=False)
    a.registry.jobs["held"].first.state = WorkerState.RUNNING  # advertised as running; no process started
    await until(lambda: any(n == "held" for n, _ in b.membership.jobs()), "beta to see alpha's job")
    with pytest.raises(PeerUnavailable, match="left the view"):
        await b.hello.job_spec("gone", "held")
    [(key, peers)] = [(k, p) for k, p in b.membership.jobs().items() if k[0] == "held"]
    b.membership.jobs = lambda: {key: ["gone", *peers]}  # listed, then gone before it is asked
    text, spec, _ = await b.by_name.spec("held")
    assert spec.name == "held"


async def test_a_job_joined_by_name_takes_the_daemon_s_job_secret(daemons, lab, tmp_path, capsys):
    # The job names secret_file = "job.secret", relative: not in --dir here, so
    # the daemon's [auth] job_secret_file stands in (docs/operations.md, "A job's
    # code travels"), to fetch the code and for the workers, on a resume too.
    daemon_secret = tmp_path / "beta.secret"
    daemon_secret.write_bytes((lab / "job.secret").read_bytes())
    daemon_secret.chmod(0o600)
    a = await daemons("alpha")
    b = await daemons("beta", seeds=(a.peer_address,), job_secret_file=daemon_secret)
    a.registry.join(job_text("held", secret=True), str(lab), start=False)
    a.registry.jobs["held"].first.state = WorkerState.RUNNING  # advertised as running; no process started
    await until(lambda: any(n == "held" for n, _ in b.membership.jobs()), "beta to see alpha's job")
    await b.pause(0)  # the owner's pause: the job is held, no worker starts
    mine = tmp_path / "mine"
    mine.mkdir()
    argv = ["--socket", str(b.config.control_socket), "join", "held", "--dir", str(mine), "--yes"]
    code = await asyncio.to_thread(peerctl.main, argv)  # the sync client in a thread: b answers on this loop
    out, err = capsys.readouterr()
    assert code == 0 and out.startswith("joined held"), err
    assert "fetched just now" in err and "holds no job secret" not in err
    job = b.registry.jobs["held"]
    assert job.first.launch.secret_file == daemon_secret
    assert json.loads((job.job_dir / "joined.json").read_text()) == {"spec_dir": str(mine), "fetched": True,
                                                                      "by_name": True}
    del b.registry.jobs["held"]
    await b._rejoin(job.job_dir, "resumed")
    assert b.registry.jobs["held"].first.launch.secret_file == daemon_secret
