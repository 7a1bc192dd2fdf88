"""The committed gRPC/protobuf stubs match what protos/generate.py produces from protos/*.proto."""

from __future__ import annotations

import difflib
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "peerd" / "proto" / "v1"
STALE = "stubs are stale: run python protos/generate.py"


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("stubs")
    result = subprocess.run([sys.executable, "protos/generate.py", "--out", str(out)], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"protos/generate.py failed:\n{result.stdout}\n{result.stderr}"
    root = out / "peerd" / "proto" / "v1"
    assert root.is_dir(), f"protos/generate.py wrote nothing under {root}"
    return root


def _generated_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def test_generator_writes_stubs_for_every_proto(generated):
    protos = sorted(p.stem for p in (REPO / "protos" / "peerd" / "proto" / "v1").glob("*.proto"))
    assert protos, "no .proto files found"
    names = {p.name for p in _generated_files(generated)}
    for stem in protos:
        for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"):
            assert f"{stem}{suffix}" in names, f"generator did not write {stem}{suffix}"


def test_generated_stubs_match_committed(generated):
    problems = []
    for new in _generated_files(generated):
        rel = new.relative_to(generated)
        old = COMMITTED / rel
        if not old.exists():
            problems.append(f"peerd/proto/v1/{rel} is not committed")
            continue
        if new.read_bytes() != old.read_bytes():
            diff = difflib.unified_diff(old.read_text(errors="replace").splitlines(),
                                        new.read_text(errors="replace").splitlines(),
                                        f"committed/{rel}", f"generated/{rel}", lineterm="", n=1)
            problems.append(f"peerd/proto/v1/{rel} differs:\n" + "\n".join(list(diff)[:20]))
    assert not problems, f"{STALE}\n" + "\n".join(problems)


def test_no_committed_stub_is_orphaned(generated):
    committed = {p.name for p in COMMITTED.glob("*_pb2*.py*")}
    assert committed, f"no committed stubs under {COMMITTED}"
    regenerated = {p.name for p in _generated_files(generated)}
    orphans = sorted(committed - regenerated)
    assert not orphans, (f"{STALE} (and delete stubs whose .proto is gone): "
                         f"committed but not generated: {', '.join(orphans)}")
