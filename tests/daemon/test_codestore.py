"""What of a job file's directory travels, and the daemon's store of bundles
(peerd.daemon.codestore), on real files: packages whole, caches left out, the
secret never, nothing outside the directory, the size limit stated."""

from __future__ import annotations

import os
import tracemalloc

import pytest

from peerd.security.auth import new_secret_file
from peerd.core.bundle import Limits, digest, pack
from peerd.daemon.codestore import CodeStore, collect
from peerd.errors import ConfigError
from peerd.settings.jobspec import parse_job


def job(**keys) -> str:
    lines = "".join(f"{k} = {v!r}\n".replace("'", '"') for k, v in keys.items())
    return f'[job]\nname = "lab"\n{lines}'


@pytest.fixture
def lab(tmp_path):
    (tmp_path / "mylab").mkdir()
    (tmp_path / "mylab" / "__init__.py").write_text("")
    (tmp_path / "mylab" / "models.py").write_text("def make_model(): ...\n")
    (tmp_path / "mylab" / "__pycache__").mkdir()
    (tmp_path / "mylab" / "__pycache__" / "models.cpython-311.pyc").write_bytes(b"\0cache")
    (tmp_path / "train.py").write_text("import peerd\n")
    (tmp_path / "settings.json").write_text("{}\n")
    (tmp_path / "unrelated.txt").write_text("not listed\n")
    return tmp_path


def test_a_module_job_takes_its_package_whole_and_the_files_it_lists(lab):
    spec = parse_job(job(module="mylab.models", files=["settings.json"]), "j")
    files = collect(spec, str(lab))
    assert sorted(files) == ["mylab/__init__.py", "mylab/models.py", "settings.json"]
    # An installed module (not in the directory) does not travel, nor peerd's own package.
    assert collect(parse_job(job(module="peerd.examples.mnist"), "j"), str(lab)) == {}
    (lab / "peerd" / "examples").mkdir(parents=True)
    (lab / "peerd" / "examples" / "mnist.py").write_text("")
    assert collect(parse_job(job(module="peerd.examples.mnist"), "j"), str(lab)) == {}


def test_a_fifo_in_the_package_is_passed_over_not_read(lab):
    """Reading a FIFO blocks until someone writes to it: the daemon would hang."""
    os.mkfifo(lab / "mylab" / "progress.fifo")
    files = collect(parse_job(job(module="mylab.models"), "j"), str(lab))
    assert sorted(files) == ["mylab/__init__.py", "mylab/models.py"]


def test_a_script_job_takes_its_script(lab):
    spec = parse_job(job(script="train.py", files=["mylab"]), "j")
    assert sorted(collect(spec, str(lab))) == ["mylab/__init__.py", "mylab/models.py", "train.py"]


def test_a_listed_file_that_is_missing_or_leaves_the_directory_is_refused(lab, tmp_path_factory):
    with pytest.raises(ConfigError, match="no such file .*missing.json"):
        collect(parse_job(job(script="train.py", files=["missing.json"]), "j"), str(lab))
    outside = tmp_path_factory.mktemp("outside") / "secret.txt"
    outside.write_text("x")
    os.symlink(outside, lab / "link.txt")
    with pytest.raises(ConfigError, match="leads outside the job's directory"):
        collect(parse_job(job(script="train.py", files=["link.txt"]), "j"), str(lab))


def test_the_job_secret_never_travels(lab):
    new_secret_file(lab / "job.secret")
    spec = parse_job(job(script="train.py", files=["job.secret"], secret_file="job.secret"), "j")
    with pytest.raises(ConfigError, match="job secret .* would travel"):
        collect(spec, str(lab), {"job secret": lab / "job.secret"})


def test_the_daemons_realm_secret_and_tls_key_never_travel(lab):
    """A lab keeps its keys beside its code; the job secret's holders may fetch the
    code, but the realm's secret and a daemon's TLS key are not theirs."""
    (lab / "keys").mkdir()
    new_secret_file(lab / "keys" / "realm.secret")
    (lab / "keys" / "peer.key").write_text("-----BEGIN PRIVATE KEY-----\n")
    spec = parse_job(job(script="train.py", files=["keys"]), "j")
    for what, path in (("realm secret", lab / "keys" / "realm.secret"), ("TLS key", lab / "keys" / "peer.key")):
        with pytest.raises(ConfigError, match=f"{what} .* would travel"):
            collect(spec, str(lab), {"job secret": None, what: path})


def test_a_bundle_over_the_limit_is_refused_at_build_with_its_size(lab, tmp_path):
    with open(lab / "weights.bin", "wb") as f:
        f.truncate(3 << 20)
    store = CodeStore(tmp_path / "store", Limits(max_bytes=2 << 20))
    spec = parse_job(job(script="train.py", files=["weights.bin"]), "j")
    with pytest.raises(ConfigError, match=r"the job's code is 3\.0 MiB, over the limit of 2\.0 MiB .*keep data out"):
        store.build(spec, str(lab))
    assert not (tmp_path / "store").exists() or not list((tmp_path / "store").iterdir())


def test_data_in_the_package_s_directory_is_refused_by_its_size_unread(lab, tmp_path):
    # A data set kept inside the job's package travels with it; over the limit
    # it must be refused from its size, not read into the daemon's memory first.
    claimed = 128 << 20
    with open(lab / "mylab" / "train.bin", "wb") as f:
        f.truncate(claimed)  # sparse: no disk used
    store = CodeStore(tmp_path / "store", Limits(max_bytes=1 << 20))
    spec = parse_job(job(module="mylab.models"), "j")
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError, match=r"the job's code is 128\.0 MiB, over the limit of 1\.0 MiB"):
            store.build(spec, str(lab))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < claimed // 8


def test_the_store_keeps_a_verified_bundle_and_rewrites_a_changed_copy(lab, tmp_path):
    store = CodeStore(tmp_path / "store")
    spec = parse_job(job(module="mylab.models", files=["settings.json"]), "j")
    bundle = store.build(spec, str(lab))
    code = digest(bundle)
    assert bundle == pack(collect(spec, str(lab))) and not store.has(code)
    store.hold(bundle)
    assert store.has(code)
    run_dir = store.materialize(code)
    assert (run_dir / "mylab" / "models.py").read_text() == "def make_model(): ...\n"
    (run_dir / "mylab" / "models.py").write_text("import os; os.system('evil')\n")  # changed after the check
    assert (store.materialize(code) / "mylab" / "models.py").read_text() == "def make_model(): ...\n"
    total, first = store.chunk(code, 0)
    assert total == store.tar(code).stat().st_size and first == store.tar(code).read_bytes()[:len(first)]
    # A tampered stored bundle is no longer held, and is not run.
    data = bytearray(store.tar(code).read_bytes())
    data[700] ^= 1
    store.tar(code).write_bytes(bytes(data))
    assert not store.has(code)
    with pytest.raises(ConfigError, match="is refused: the bundle's sha256"):
        store.materialize(code)


def test_a_rewrite_interrupted_before_it_cleaned_up_does_not_block_the_next(lab, tmp_path):
    # A daemon killed mid-rewrite leaves the moved-aside copy behind; a later
    # daemon with the same pid (a container's) must still rewrite the files.
    store = CodeStore(tmp_path / "store")
    spec = parse_job(job(module="mylab.models"), "j")
    bundle = store.build(spec, str(lab))
    code = digest(bundle)
    store.hold(bundle)
    run_dir = store.materialize(code)
    left = store.root / f".old-{code[:12]}-{os.getpid()}"
    (left / "mylab").mkdir(parents=True)
    (left / "mylab" / "models.py").write_text("stale\n")
    (run_dir / "mylab" / "models.py").write_text("changed\n")
    assert (store.materialize(code) / "mylab" / "models.py").read_text() == "def make_model(): ...\n"
