"""peerctl as a user runs it, with no daemon behind the socket: clear one-line errors, no tracebacks.

Each scenario runs once as a real `python -m peerd.cli.peerctl` process (all started together by a
module fixture, since each is a full interpreter start); the wider command matrix runs in-process
through `peerctl.main(argv)`, which is what the console script calls.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

from peerd.cli import peerctl

REPO = Path(__file__).resolve().parents[2]
MNIST = Path(resources.files("peerd") / "examples" / "mnist.toml")

COMMANDS = [["status"], ["peers"], ["jobs"], ["leave", "mnist-example"], ["leave", "--drain", "x"],
            ["--json", "status"], ["join", str(MNIST)], ["pause"], ["pause", "--for", "20s"], ["resume"]]

JOB_ERRORS = [
    ("momentum = 0.9", "momentum = 1.0", "optimizer.momentum"),
    ("segments = 6", "segments = 0", "gossip.segments"),
    ('name = "mnist-example"', 'name = "bad name"', "job.name"),
    ('data_mode = "shared"', 'data_mode = "sharded"', "job.data_mode"),
    ("chunk_kib = 1024", "chunk_kib = 1024\nchunk_kb = 1", "chunk_kb"),
]


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PEERD_")}
    env.update(extra or {})
    return env


def make_stale_socket(path: Path) -> Path:
    """A unix socket file nobody listens on (a daemon that died without cleaning up)."""
    if len(str(path)) >= 100:
        pytest.skip("path too long for a unix socket")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.close()
    assert path.exists()
    return path


def bad_job(directory: Path, index: int) -> tuple[Path, str]:
    old, new, key = JOB_ERRORS[index]
    text = MNIST.read_text()
    assert old in text
    path = directory / f"JOB{index}.toml"
    path.write_text(text.replace(old, new, 1))
    return path, key


@pytest.fixture(scope="module")
def paths(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("ctl")
    regular = d / "file.sock"
    regular.write_text("")
    bad_toml = d / "broken.toml"
    bad_toml.write_text("[job\n")
    return {
        "missing": d / "run" / "control.sock",
        "env": d / "env.sock",
        "regular": regular,
        "stale": make_stale_socket(d / "s.sock"),
        "bad_job": bad_job(d, 0)[0],
        "bad_toml": bad_toml,
        "no_job": d / "nope.toml",
    }


@pytest.fixture(scope="module")
def runs(paths) -> dict[str, subprocess.CompletedProcess]:
    """Every subprocess scenario, started at once."""
    p = {k: str(v) for k, v in paths.items()}
    calls = {
        "missing status": (["--socket", p["missing"], "status"], None),
        "missing join": (["--socket", p["missing"], "join", str(MNIST)], None),
        "env status": (["status"], {"PEERD_SOCKET": p["env"]}),
        "regular jobs": (["--socket", p["regular"], "jobs"], None),
        "stale peers": (["--socket", p["stale"], "peers"], None),
        "stale join": (["--socket", p["stale"], "join", str(MNIST)], None),
        "join bad": (["--socket", p["missing"], "join", p["bad_job"]], None),
        "help": (["--help"], None),
        "join help": (["join", "--help"], None),
    }
    procs = {name: subprocess.Popen([sys.executable, "-m", "peerd.cli.peerctl", *args], cwd=REPO,
                                    env=_env(extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name, (args, extra) in calls.items()}
    results = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=60)
        results[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return results


def assert_not_running(returncode: int, out: str, err: str, sock: Path) -> None:
    assert returncode == 1, (returncode, out, err)
    assert "Traceback" not in err
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("peerctl: ")
    assert str(sock) in lines[0]
    assert "running" in lines[0]


def run_inprocess(capsys, *argv: str) -> tuple[int, str, str]:
    code = peerctl.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# --- no daemon: subprocess -------------------------------------------------------------------


@pytest.mark.parametrize("name, where, why", [
    ("missing status", "missing", "no peerd control socket"),
    ("missing join", "missing", "no peerd control socket"),
    ("env status", "env", "no peerd control socket"),
    ("regular jobs", "regular", "does not answer"),
    ("stale peers", "stale", "does not answer"),
    ("stale join", "stale", "does not answer"),
])
def test_no_daemon_subprocess(runs, paths, name, where, why):
    result = runs[name]
    assert_not_running(result.returncode, result.stdout, result.stderr, paths[where])
    assert why in result.stderr


# --- no daemon: every command, in-process ------------------------------------------------------


@pytest.mark.parametrize("where, why", [
    ("missing", "no peerd control socket"),
    ("regular", "does not answer"),
    ("stale", "does not answer"),
])
@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c[:2]).replace(str(MNIST), "JOB") for c in COMMANDS])
def test_no_daemon_every_command(capsys, monkeypatch, paths, where, why, command):
    monkeypatch.delenv("PEERD_SOCKET", raising=False)
    code, out, err = run_inprocess(capsys, "--socket", str(paths[where]), *command)
    assert_not_running(code, out, err, paths[where])
    assert why in err


def test_a_pause_for_no_duration_is_refused_before_the_daemon_is_asked(capsys, paths):
    code, out, err = run_inprocess(capsys, "--socket", str(paths["missing"]), "pause", "--for", "soon")
    assert (code, out) == (1, "") and err.strip() == "peerctl: --for: 'soon' is not a duration: e.g. 20s, 90m, 1h30m, 2d"


def test_socket_from_environment_inprocess(capsys, monkeypatch, tmp_path):
    sock = tmp_path / "from-env.sock"
    monkeypatch.setenv("PEERD_SOCKET", str(sock))
    assert_not_running(*run_inprocess(capsys, "peers"), sock)


def test_socket_flag_overrides_environment(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("PEERD_SOCKET", str(tmp_path / "env.sock"))
    sock = tmp_path / "flag.sock"
    code, out, err = run_inprocess(capsys, "--socket", str(sock), "status")
    assert_not_running(code, out, err, sock)
    assert "env.sock" not in err


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root ignores file permissions")
def test_socket_without_permission(capsys, tmp_path):
    sock = tmp_path / "control.sock"
    sock.write_text("")
    sock.chmod(0)
    code, out, err = run_inprocess(capsys, "--socket", str(sock), "status")
    assert code == 1
    assert "permission denied" in err and str(sock) in err


# --- help and usage ------------------------------------------------------------------------------


def test_help(runs):
    result = runs["help"]
    assert result.returncode == 0, result.stderr
    for word in ("status", "peers", "jobs", "join", "leave", "--socket", "--json"):
        assert word in result.stdout


def test_join_help(runs):
    result = runs["join help"]
    assert result.returncode == 0, result.stderr
    assert "JOB.toml" in result.stdout


@pytest.mark.parametrize("argv", [[], ["frobnicate"], ["join"], ["leave"]])
def test_usage_errors(capsys, argv):
    with pytest.raises(SystemExit) as info:
        peerctl.main(argv)
    assert info.value.code == 2
    assert "usage: peerctl" in capsys.readouterr().err


# --- join validates the job file locally, before talking to the daemon ---------------------------
# The socket does not exist: the job file must be rejected for its own fault, not for the missing
# daemon (cmd_join calls load_job before the Join RPC).


def test_join_invalid_job_subprocess(runs, paths):
    result = runs["join bad"]
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"peerctl: {paths['bad_job']}: optimizer.momentum = 1.0")
    assert "running" not in lines[0]


@pytest.mark.parametrize("index", range(len(JOB_ERRORS)), ids=[k for _, _, k in JOB_ERRORS])
def test_join_invalid_job_names_the_key(capsys, tmp_path, index):
    job, key = bad_job(tmp_path, index)
    sock = tmp_path / "absent.sock"
    code, out, err = run_inprocess(capsys, "--socket", str(sock), "join", str(job))
    assert code == 1
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"peerctl: {job}: ")
    assert key in lines[0]
    assert "running" not in lines[0] and str(sock) not in lines[0]


def test_join_invalid_job_with_stale_socket(capsys, paths):
    code, _, err = run_inprocess(capsys, "--socket", str(paths["stale"]), "join", str(paths["bad_job"]))
    assert code == 1
    assert "optimizer.momentum" in err and "running" not in err


def test_join_invalid_toml(capsys, paths):
    code, _, err = run_inprocess(capsys, "--socket", str(paths["missing"]), "join", str(paths["bad_toml"]))
    assert code == 1
    assert err.startswith(f"peerctl: {paths['bad_toml']}: not valid TOML")


def test_join_missing_job_file(capsys, paths):
    code, _, err = run_inprocess(capsys, "--socket", str(paths["missing"]), "join", str(paths["no_job"]))
    assert code == 1
    assert "cannot read job file" in err and str(paths["no_job"]) in err


def test_status_shows_the_consensus_models_metric_beside_the_own_one():
    from peerd.proto.v1 import control_pb2

    p = control_pb2.Progress(metric=0.9, metric_name="accuracy")
    assert peerctl._metric(p) == "accuracy 0.9000"
    p.metrics.update({"accuracy": 0.9, "consensus_accuracy": 0.95, "consensus_peers": 3})
    assert peerctl._metric(p) == "accuracy 0.9000, consensus of 3 0.9500"


def test_status_shows_a_collapse_beside_the_state_and_its_reason_under_the_table():
    from types import SimpleNamespace

    from peerd.control.progress import empty_progress
    from peerd.proto.v1 import control_pb2

    def status(why: str) -> str:
        p = empty_progress()
        p.collapsed, p.collapse_reason = bool(why), why
        worker = control_pb2.LocalWorker(member="peer-0", device="cpu", state="finished", progress=p)
        reply = control_pb2.StatusReply(peer_id="peer-0", jobs=[control_pb2.LocalJob(
            name="diverge", state="finished", progress=p, workers=[worker])])
        return peerctl.cmd_status(SimpleNamespace(status=lambda: reply), None)[1]

    why = "training collapsed at round 50 (loss blow-up): loss 76.2 (first step 2.3) over the last 50 steps"
    text = status(why)
    assert "finished, collapsed" in text and text.endswith(f"\ndiverge/peer-0: {why}")
    assert "collapsed" not in status("")


def test_busy_is_compute_over_training_time_with_the_largest_wait():
    from peerd.control.progress import empty_progress

    p = empty_progress()
    assert peerctl._busy(p) == "-"  # no report yet
    p.training_s, p.compute_s = 40.0, 25.0
    p.waited_s.update({"round": 12.0, "evaluate": 2.0, "checkpoint": 0.0})
    assert peerctl._busy(p) == "62% (round 30%)"
    p.waited_s.clear()
    assert peerctl._busy(p) == "62%"


def test_status_says_the_lr_law_in_force_and_its_factor_under_the_table():
    from types import SimpleNamespace

    from peerd.control.progress import empty_progress
    from peerd.proto.v1 import control_pb2

    def status(law: str, scale: float) -> str:
        p = empty_progress()
        p.lr_law, p.lr_scale, p.global_batch = law, scale, 128
        worker = control_pb2.LocalWorker(member="peer-0", device="cpu", state="running", progress=p)
        reply = control_pb2.StatusReply(peer_id="peer-0", jobs=[control_pb2.LocalJob(
            name="tuned", state="running", progress=p, workers=[worker])])
        return peerctl.cmd_status(SimpleNamespace(status=lambda: reply), None)[1]

    law = "sqrt law against the reference batch 96, cap 2"
    assert status(law, 1.1547).endswith(f"\ntuned/peer-0: LR: {law}: factor 1.155 at global batch 128")
    none = 'no scaling: the script\'s LR exactly ([optimizer] scaling = "none")'
    assert status(none, float("nan")).endswith(f"\ntuned/peer-0: LR: {none}")  # before its first step
    assert "LR: " not in status("", float("nan"))


def test_status_says_the_outer_step_in_force_under_the_table():
    from types import SimpleNamespace

    from peerd.control.progress import empty_progress
    from peerd.proto.v1 import control_pb2

    def status(outer: str) -> str:
        p = empty_progress()
        p.outer = outer
        worker = control_pb2.LocalWorker(member="peer-0", device="cpu", state="running", progress=p)
        reply = control_pb2.StatusReply(peer_id="peer-0", jobs=[control_pb2.LocalJob(
            name="local-sgd", state="running", progress=p, workers=[worker])])
        return peerctl.cmd_status(SimpleNamespace(status=lambda: reply), None)[1]

    said = "outer SGD every 8 local steps: lr 0.7, Nesterov momentum 0.5"
    assert status(said).endswith(f"\nlocal-sgd/peer-0: {said}")
    assert "outer SGD" not in status("")
