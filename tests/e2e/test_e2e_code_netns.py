"""A lab of three machines, each a network namespace this test makes on one
bridge, each running the example config (systemd/peerd.toml: host = "auto",
zeroconf on the address it picks) with only its paths changed. A job started on
the first is joined by name on the second, which has no copy of its code and
fetches it from the first; the third, without the job secret, is refused.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import pytest
import tomli_w

from peerd.security.auth import new_secret_file
from peerd.control.client import ControlClient
from peerd.errors import PeerdError
from peerd.soak.netns import Namespaces, namespaces_unavailable

from conftest import REPO, all_finished, wait_for
from e2e_helpers import JOB, JOB_MODULE, peerctl, secret_dir

NO_NETNS = namespaces_unavailable()
pytestmark = [pytest.mark.e2e, pytest.mark.skipif(bool(NO_NETNS), reason=f"a lab in namespaces: {NO_NETNS}")]


class Machine:
    """One daemon in its namespace; its control socket is a file this side can reach."""

    def __init__(self, index: int, root: Path, sockets: Path) -> None:
        self.index, self.dir, self.socket = index, root / f"m{index}", sockets / f"m{index}.sock"
        self.dir.mkdir()
        config = tomllib.loads((REPO / "systemd" / "peerd.toml").read_text())
        config["daemon"].update(state_dir=str(self.dir / "state"), control_socket=str(self.socket))
        config["worker"].update(standby=False, threads=1)  # three daemons share this machine's cores
        (self.dir / "peerd.toml").write_text(tomli_w.dumps(config))
        self.process: subprocess.Popen | None = None

    def start(self, namespace: str) -> None:
        with open(self.dir / "daemon.log", "ab") as log:
            self.process = subprocess.Popen(
                ["ip", "netns", "exec", namespace, sys.executable, "-m", "peerd.cli.daemon",
                 "--config", str(self.dir / "peerd.toml")], stdout=log, stderr=log, stdin=subprocess.DEVNULL)

    def client(self) -> ControlClient:
        return ControlClient(self.socket, timeout_s=5.0)

    def status(self):
        try:
            with self.client() as c:
                return c.status()
        except PeerdError:
            return None

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)  # `ip netns exec` execs: this is the daemon
        try:
            self.process.wait(timeout=40)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def lab(tmp_path):
    net = Namespaces(f"cb{os.getpid() % 100000}")
    sockets = Path(tempfile.mkdtemp(prefix="peerd-lab-"))
    machines = [Machine(i, tmp_path, sockets) for i in range(3)]
    try:
        net.open()
        for machine in machines:
            machine.start(net.add_peer(machine.index, 0).namespace)
        yield machines
    finally:
        for machine in machines:
            machine.stop()
        problems = net.close()
        shutil.rmtree(sockets, ignore_errors=True)
        assert not problems, problems


def test_three_machines_the_code_travels_to_the_one_with_the_secret(lab, tmp_path):
    first, second, third = lab
    wait_for(lambda: all((s := m.status()) and s.peers_known == 2 for m in lab), 90,
             "three daemons to find each other by zeroconf on the bridge")
    addresses = {m.status().peer_address.rsplit(":", 1)[0] for m in lab}
    assert addresses == {"10.99.0.10", "10.99.0.11", "10.99.0.12"}  # host = "auto": each its own veth
    code = tmp_path / "code"
    (code / "codejob").mkdir(parents=True)
    (code / "codejob" / "__init__.py").write_text(JOB_MODULE)
    (code / "settings.json").write_text('{"samples": 256, "weights": [1.0, -1.0, 2.0, 0.5]}\n')
    (code / "job.toml").write_text(JOB)
    new_secret_file(code / "job.secret")
    out = peerctl(first, "join", str(code / "job.toml"))
    assert out.returncode == 0, out.stderr

    def heard(machine) -> bool:
        with machine.client() as c:
            return any(j.name == "travel" for j in c.jobs().jobs)

    wait_for(lambda: heard(second) and heard(third), 60, "the others to hear of the job")
    empty = tmp_path / "empty"
    empty.mkdir()
    out = peerctl(third, "join", "travel", "--dir", str(empty), "--yes")
    assert out.returncode == 1 and "holds no job secret" in out.stderr, out.stderr
    out = peerctl(second, "join", "travel", "--dir", str(secret_dir(tmp_path / "mine", code / "job.secret")), "--yes")
    assert out.returncode == 0, out.stderr
    assert "from its peer" in out.stderr and "(10.99.0.10:" in out.stderr and "fetched just now" in out.stderr

    def jobs():
        with first.client() as a, second.client() as b:
            return all_finished([a.status().jobs[0], b.status().jobs[0]])

    for job in wait_for(jobs, 300, "the two machines to finish the job"):
        assert job.progress.metrics["consensus_peers"] == 2 and job.progress.metric < 0.05, job.progress
    with third.client() as c:
        assert not c.status().jobs
    assert not (third.dir / "state" / "code").exists()
