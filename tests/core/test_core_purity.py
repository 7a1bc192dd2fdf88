"""The pure cores under peerd.core must not pull in an event loop, RPC,
discovery, networking or torch.

Each module is imported in a fresh interpreter (so nothing imported by pytest,
hypothesis or another test can hide or fake a dependency) and the top-level
names in sys.modules are checked.

Checked by experiment (Python 3.11+): importing every peerd.core module pulls
in only hashlib, dataclasses, collections.abc and what they need; no stdlib
module among those imports asyncio, socket, selectors or ssl. So asyncio and
the network stack are checked too, not only the third-party packages.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CORE_DIR = REPO / "peerd" / "core"

FORBIDDEN = ("asyncio", "grpc", "zeroconf", "torch", "uvloop", "socket", "selectors", "ssl")

# The modules this test file was written against; any module added later is
# discovered below and checked as well.
EXPECTED = {"rng", "topology", "segments", "partition", "deadline", "membership"}


def _core_modules() -> list[str]:
    return sorted(
        f"peerd.core.{p.stem}" for p in CORE_DIR.glob("*.py") if p.stem != "__init__"
    ) + ["peerd.core"]


PROBE = """
import importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
print(json.dumps(sorted({k.split(".")[0] for k in sys.modules})))
"""


def _top_level_after_import(*modules: str) -> set[str]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *modules],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return set(json.loads(proc.stdout.strip().splitlines()[-1]))


def test_expected_modules_exist():
    found = {m.rsplit(".", 1)[1] for m in _core_modules() if m != "peerd.core"}
    assert EXPECTED <= found


def test_probe_sees_forbidden_modules():
    # Guard against a probe that could never fail.
    loaded = _top_level_after_import("asyncio", "json")
    assert "asyncio" in loaded


@pytest.mark.parametrize("module", _core_modules())
def test_module_is_pure(module):
    loaded = _top_level_after_import(module)
    assert module.split(".")[0] in loaded
    bad = sorted(loaded.intersection(FORBIDDEN))
    assert not bad, f"importing {module} pulled in {bad}"


def test_all_core_modules_together_are_pure():
    loaded = _top_level_after_import(*_core_modules())
    bad = sorted(loaded.intersection(FORBIDDEN))
    assert not bad, f"importing peerd.core pulled in {bad}"
