"""Peer.GetJobCode between two real daemons in one event loop (no training: the
job is held): a realm secret and the job secret proved together, the bundle in
ranges, and refusals for another secret, a job held without one, another code."""

from __future__ import annotations

import pytest

from peerd.auth import Authenticator, load_secret, new_secret_file
from peerd.core.bundle import digest, unpack
from peerd.errors import PeerUnavailable, Unauthenticated
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
