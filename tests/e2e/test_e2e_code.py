"""End to end: a job's code travels to a machine that joins it by name.

Real daemons on 127.0.0.1. The job's code (a package and a settings file it
lists) is only in the first daemon's job directory; the others join by name from
directories of their own. The code comes only to a daemon that proves the job
secret, only intact (a tampered bundle is refused by hash and nothing runs), and
runs only once the operator confirmed its source and hash.
"""

from __future__ import annotations

import re
import shutil

import pytest

from peerd.security.auth import new_secret_file
from peerd.core.bundle import digest
from peerd.settings.jobspec import parse_job

from conftest import all_finished, wait_for, wait_for_discovery
from e2e_helpers import JOB, JOB_MODULE, peerctl, secret_dir

pytestmark = pytest.mark.e2e

def stored(peer) -> list[str]:
    store = peer.dir / "state" / "code"
    return sorted(p.name for p in store.iterdir()) if store.exists() else []


def test_a_job_joined_by_name_gets_its_code_from_a_peer_that_proves_the_secret(local_cluster, tmp_path):
    cluster = local_cluster(3)
    origin, joiner, outsider = cluster.peers
    wait_for_discovery(cluster)
    lab = tmp_path / "lab"
    (lab / "codejob").mkdir(parents=True)
    (lab / "codejob" / "__init__.py").write_text(JOB_MODULE)
    (lab / "settings.json").write_text('{"samples": 256, "weights": [1.0, -1.0, 2.0, 0.5]}\n')
    (lab / "job.toml").write_text(JOB)
    new_secret_file(lab / "job.secret")

    out = peerctl(origin, "join", str(lab / "job.toml"))
    assert out.returncode == 0, out.stderr
    # The daemon named the bundle of the job's code in the job it keeps, and keeps the bundle.
    spec = parse_job((origin.dir / "state" / "jobs" / "travel" / "job.toml").read_text(), "kept")
    bundle = origin.dir / "state" / "code" / f"{spec.code}.tar"
    assert digest(bundle.read_bytes()) == spec.code
    wait_for(lambda: all(any(j.name == "travel" for j in cluster.client(p).jobs().jobs) for p in (joiner, outsider)),
             30, "the others to hear of the job")

    # The same job file beside other code: another bundle, so another spec, refused.
    edited = tmp_path / "edited"
    shutil.copytree(lab, edited)
    (edited / "settings.json").write_text('{"samples": 128, "weights": [1.0, -1.0, 2.0, 0.5]}\n')
    out = peerctl(outsider, "join", str(edited / "job.toml"))
    assert out.returncode == 1 and "with another spec" in out.stderr and "and code (yours is bundle" in out.stderr, out

    # No secret: join by name needs the code locally, and says so; nothing is fetched.
    empty = tmp_path / "empty"
    empty.mkdir()
    out = peerctl(outsider, "join", "travel", "--dir", str(empty), "--yes")
    assert out.returncode == 1 and "holds no job secret" in out.stderr and "only taken from peers" in out.stderr, out
    # Another secret: the peer refuses to send the code, and the outsider stores nothing.
    out = peerctl(outsider, "join", "travel", "--dir", str(secret_dir(tmp_path / "wrong")), "--yes")
    assert out.returncode == 1 and "refused, nothing runs" in out.stderr and "refused this peer's proof" in out.stderr, out.stderr
    assert stored(outsider) == [] and not cluster.client(outsider).status().jobs

    # A tampered bundle on the serving peer: refused by hash, named, and nothing runs.
    mine = secret_dir(tmp_path / "mine", lab / "job.secret")
    intact = bundle.read_bytes()
    tampered = bytearray(intact)
    tampered[1100] ^= 0x20  # inside the module's source
    bundle.write_bytes(bytes(tampered))
    out = peerctl(joiner, "join", "travel", "--dir", str(mine), "--yes")
    assert out.returncode == 1, out
    assert f"not the job's {spec.code}" in out.stderr and "peer-0" in out.stderr and "nothing runs" in out.stderr
    assert stored(joiner) == [] and not cluster.client(joiner).status().jobs
    bundle.write_bytes(intact)

    # Intact: fetched and verified; shown (peer, hash, files) and run only when confirmed.
    out = peerctl(joiner, "join", "travel", "--dir", str(mine), answer="n\n")
    assert out.returncode == 1 and "not confirmed" in out.stderr, out.stderr
    assert f"bundle sha256 {spec.code}" in out.stderr and "peer-0 (127.0.0.1:" in out.stderr
    assert "fetched just now" in out.stderr and "codejob/__init__.py, settings.json" in out.stderr
    assert not cluster.client(joiner).status().jobs
    out = peerctl(joiner, "join", "travel", "--dir", str(mine), answer="y\n")
    assert out.returncode == 0 and "fetched before, kept" in out.stderr, out.stderr
    assert f"fingerprint {spec.fingerprint[:12]}" in out.stdout

    jobs = wait_for(lambda: all_finished([cluster.client(p).status().jobs[0] for p in (origin, joiner)]), 300,
                    "the two workers to finish")
    for job in jobs:
        assert job.spec_fingerprint == spec.fingerprint
        assert job.progress.metric < 0.05, job.progress  # from ~3 at the start
        assert job.progress.metrics["consensus_peers"] == 2  # the two trained it together
    run_dir = joiner.dir / "state" / "code" / spec.code
    log = (joiner.dir / "state" / "jobs" / "travel" / "worker.log").read_text()
    assert re.search(rf"codejob loaded from {re.escape(str(run_dir))}/codejob/__init__.py", log), log[-2000:]
    assert (run_dir / "settings.json").read_bytes() == (lab / "settings.json").read_bytes()
    assert not (run_dir / "job.secret").exists()
