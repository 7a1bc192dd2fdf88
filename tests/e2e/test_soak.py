"""A short real soak (peers in network namespaces under churn) that fails on any
failed check, and a soak stopped by SIGTERM that leaves nothing behind (the
harness's pure parts: tests/soak/test_soak_checks.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from peerd.soak import checks as ck
from peerd.soak.netns import made_here, namespaces_unavailable

NO_NETNS = namespaces_unavailable()
SHORT_SCHEDULE = """
[[event]]
at = 12
kind = "kill_worker"
peer = 1
[[event]]
at = 27
kind = "kill_daemon"
peer = 2
down_s = 5
[[event]]
at = 45
kind = "partition"
peer = 3
down_s = 8
[[event]]
at = 62
kind = "leave"
peer = 0
[[event]]
at = 72
kind = "join"
[[event]]
at = 84
kind = "owner"
peer = 1
down_s = 6
"""


def _ours_left(out: Path) -> list[str]:
    """Processes whose command line names the run's directory, and namespaces of any soak."""
    left = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(out).encode() in cmdline.read_bytes():
                left.append(cmdline.parent.name)
        except OSError:
            continue
    return left


def _soak_namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout
    return {line.split()[0] for line in out.splitlines() if line.startswith("psk")}


@pytest.mark.soak
@pytest.mark.timeout(420)
@pytest.mark.skipif(bool(NO_NETNS), reason=f"soak needs network namespaces: {NO_NETNS}")
# "relay": every daemon relays (each Hellos 2 random peers a round) through the
# same churn: kills, a restart, a partition, a leave and a join.
@pytest.mark.parametrize("discovery", [{}, {"full_mesh_max": 1, "fanout": 2}], ids=["full-mesh", "relay"])
def test_short_soak_passes_every_check(tmp_path, discovery):
    from peerd.cli.localcluster import default_job
    from peerd.soak.report import summary, write_report
    from peerd.soak.runner import SoakSettings, run_soak

    (tmp_path / "schedule.toml").write_text(SHORT_SCHEDULE)
    out = tmp_path / "report"
    settings = SoakSettings(peers=4, duration_s=125, schedule=tmp_path / "schedule.toml", down_s=8,
                            converge_s=60, stall_s=60, target=0.8, out=out, **discovery)
    try:
        run = run_soak(settings, default_job())
    finally:
        assert _ours_left(out) == [], "processes of the soak still running"
        # Ours only: the machine-wide list also holds other runs' namespaces, which come and go.
        assert made_here() == set(), "namespaces of the soak left behind"
    checks = ck.run_checks(run.samples, run.events, ceiling_s=run.spec.gossip.deadline_ceiling_s,
                           stall_s=settings.stall_s, converge_s=settings.converge_s,
                           goal=ck.Goal(settings.target, run.spec.metric, run.spec.metric_mode),
                           checkpoints=run.checkpoints)
    report = write_report(run, checks, out)
    text = summary(run, checks, report)
    assert not run.interrupted, text
    assert [e.kind for e in run.events] == ["kill_worker", "kill_daemon", "partition", "leave", "join", "owner"], text
    assert all(e.ok for e in run.events), text
    assert [c.verdict for c in checks if c.verdict == "fail"] == [], text
    assert {"peer-4"} <= {s.peer for s in run.samples}  # the new peer joined
    assert (out / "report.md").exists() and len(list(out.glob("*.png"))) == 5


@pytest.mark.soak
@pytest.mark.timeout(240)
@pytest.mark.skipif(bool(NO_NETNS), reason=f"soak needs network namespaces: {NO_NETNS}")
def test_soak_cleans_up_when_terminated(tmp_path):
    import os
    import signal
    import sys
    import time

    before = _soak_namespaces()
    out = tmp_path / "report"
    proc = subprocess.Popen([sys.executable, "-u", "-m", "peerd.soak", "--peers", "2", "--duration", "300",
                             "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "peers training after" in line:
                break
        assert any("network: namespaces" in x for x in lines), "".join(lines)
        ours = _soak_namespaces() - before  # not the machine-wide list: other runs come and go
        assert ours, "no namespace was made"
        time.sleep(3)
        os.kill(proc.pid, signal.SIGTERM)
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1
    assert "interrupted (Ctrl-C or SIGTERM)" in rest
    assert "interrupted" in (out / "report.md").read_text()
    assert _ours_left(out) == []
    assert not ours & _soak_namespaces(), "namespaces of the soak left behind"
