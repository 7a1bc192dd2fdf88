"""End to end, data_mode = "local": real daemons, each training on its own data.

- Nothing but model state leaves a peer: every byte on the wire (gRPC, the bulk
  lane, discovery) is captured and none of the training samples is in it.
- A peer that cannot take part is refused clearly, and the others go on.
- Elastic join and a daemon restart work in this mode, and the job ends at the
  objective it means (the pooled least-squares solution).
"""

from __future__ import annotations

import re
import secrets
import signal
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from peerd.security.auth import create_secret_file
from peerd.errors import ConfigError
from peerd.soak.netns import namespaces_unavailable

from conftest import all_finished, wait_for, wait_for_discovery

sys.path.insert(0, str(Path(__file__).parents[1] / "jobcode"))
from marked_job import MARKER, write_peer_data  # noqa: E402

pytestmark = pytest.mark.e2e

JOBCODE = str(Path(__file__).parents[1] / "jobcode")
CAPTURE = Path(__file__).parents[1] / "lo_capture.py"
TRUTH = [(1.0, 0.0, 0.0, 0.0), (-2.0, 3.0, 0.0, 0.0), (0.0, -1.0, 2.0, 1.0)]
SIZES = [120, 40, 80]


def job_text(name: str, secret: Path | None, epochs: int, **job) -> str:
    lines = "".join(f"{k} = {v!r}\n".replace("'", '"') for k, v in job.items())
    secret_line = f'secret_file = "{secret}"\n' if secret else ""
    return (f'[job]\nname = "{name}"\nmodule = "marked_job"\ndata_mode = "local"\nmetric = "loss"\n'
            f'local_batch = 8\nepochs = {epochs}\neval_every_rounds = 20\n{secret_line}{lines}'
            '[optimizer]\nlr = 0.1\nmomentum = 0.0\nschedule = "linear"\n'
            '[checkpoint]\nevery_s = 2.0\n')


def pooled(data: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    a = [rows[:, 4:].double() for rows, _ in data]
    return torch.linalg.solve(sum(x.T @ x for x in a), sum(x.T @ y.double() for x, (_, y) in zip(a, data)))


def model_of(peer, name: str) -> torch.Tensor:
    saved = torch.load(peer.dir / "state" / "jobs" / name / "model.pt", weights_only=True)
    return saved["weight"].reshape(-1).double()


# --- the capture ---------------------------------------------------------------------------


def tcp_udp_streams(path: Path) -> dict[tuple, bytearray]:
    """The payload of every TCP and UDP flow (src, sport, dst, dport, proto) in a
    capture of lo, in order (loopback neither reorders nor loses)."""
    flows: dict[tuple, bytearray] = {}
    data = path.read_bytes()
    pos = 0
    while pos < len(data):
        (length,) = struct.unpack_from("<I", data, pos)
        frame = data[pos + 4 : pos + 4 + length]
        pos += 4 + length
        if frame[12:14] != b"\x08\x00":  # IPv4 only: everything here is on 127.0.0.1
            continue
        ip = frame[14:]
        ihl, proto, total = (ip[0] & 0x0F) * 4, ip[9], struct.unpack_from("!H", ip, 2)[0]
        src, dst, l4 = ip[12:16], ip[16:20], ip[ihl:total]
        if proto == 6:
            sport, dport, offset = struct.unpack_from("!HH", l4)[0], struct.unpack_from("!HH", l4)[1], (l4[12] >> 4) * 4
            payload = l4[offset:]
        elif proto == 17:
            sport, dport = struct.unpack_from("!HH", l4)
            payload = l4[8:]
        else:
            continue
        if payload:
            flows.setdefault((src, sport, dst, dport, proto), bytearray()).extend(payload)
    return flows


def patterns(data: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[bytes, str]:
    """What would give a sample away: the marker (fp32, fp64, fp16, bf16) and every
    sample's own values as fp32 (its regressors, and its whole row)."""
    marker = torch.tensor(MARKER)
    out = {marker.numpy().tobytes(): "marker fp32", marker.double().numpy().tobytes(): "marker fp64",
           marker[:2].half().numpy().tobytes(): "marker fp16",
           marker.bfloat16().view(torch.int16).numpy().tobytes(): "marker bf16"}
    for k, (rows, _) in enumerate(data):
        for i, row in enumerate(rows):
            out[row[4:].numpy().tobytes()] = f"peer-{k} sample {i}"
    return out


class Namespace:
    """A network namespace of the test's own, with lo up: all traffic on it is the test's."""

    def __init__(self) -> None:
        self.name = f"pdl{secrets.token_hex(4)}"
        subprocess.run(["ip", "netns", "add", self.name], check=True, timeout=10)
        self.exec(["ip", "link", "set", "lo", "up"])

    def exec(self, argv: list[str]) -> None:
        subprocess.run(["ip", "netns", "exec", self.name, *argv], check=True, timeout=10)

    @property
    def wrap(self) -> list[str]:
        return ["ip", "netns", "exec", self.name]

    def close(self) -> None:
        subprocess.run(["ip", "netns", "del", self.name], timeout=10)


@pytest.fixture
def namespace():
    why = namespaces_unavailable()
    if why:
        pytest.skip(why)
    ns = Namespace()
    yield ns
    ns.close()


def test_no_training_sample_is_ever_on_the_wire_and_a_peer_without_data_is_refused(
        local_cluster, namespace, tmp_path):
    """Three daemons in a namespace of their own, seeded (no mDNS needed there);
    peer-0 and peer-1 hold data, peer-2 holds none. Every frame on lo is captured."""
    roots = [tmp_path / f"data-{k}" for k in range(3)]
    data = [write_peer_data(roots[k], SIZES[k], TRUTH[k], seed=k) for k in range(2)]
    roots[2].mkdir()  # a data root without the job's data
    ports = [7411, 7412, 7413]
    seeds = [f"127.0.0.1:{p}" for p in ports]

    def settings(peer):
        return {"daemon": {"peer_port": ports[peer.index]},
                "discovery": {"zeroconf": False, "seeds": [s for s in seeds if not s.endswith(str(ports[peer.index]))]},
                "data": {"root": str(roots[peer.index])}}

    capture_file = tmp_path / "lo.bin"
    capture = subprocess.Popen([*namespace.wrap, sys.executable, str(CAPTURE), str(capture_file)],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert capture.stdout.readline().strip() == "ready"
        # slowdown: a step takes a few ms as a real model's would, so the seconds
        # between the workers' starts are a small part of the job.
        cluster = local_cluster(3, settings=settings, wrap=namespace.wrap, slowdowns=(6.0,) * 3)
        wait_for_discovery(cluster, 60)
        secret = tmp_path / "job.secret"
        create_secret_file(secret)

        # Without a secret: refused at join, before any worker starts.
        with pytest.raises(ConfigError, match="needs a job secret"):
            cluster.client(cluster.peers[0]).join(job_text("marked", None, 30), JOBCODE)
        text = job_text("marked", secret, 200)
        for peer in cluster.peers:
            cluster.client(peer).join(text, JOBCODE)

        def job(peer):
            return cluster.client(peer).status().jobs[0]

        # peer-2's worker finds no data: the join fails there, clearly, and is not retried ...
        failed = wait_for(lambda: (j := job(cluster.peers[2])).state == "failed" and j, 120, "peer-2's refusal")
        assert failed.restarts == 0
        log = (cluster.peers[2].dir / "state" / "jobs" / "marked" / "worker.log").read_text()
        assert f"no samples.pt in this peer's data root {roots[2]}" in log, log[-2000:]
        # ... and the others train on undisturbed, to the end.
        jobs = wait_for(lambda: all_finished(job(p) for p in cluster.peers[:2]), 400, "peer-0 and peer-1 to finish")
        assert all(j.progress.data_samples == n for j, n in zip(jobs, SIZES))
        sent = sum(j.progress.bytes_sent for j in jobs)
        models = [model_of(p, "marked") for p in cluster.peers[:2]]
        cluster.close()
    finally:
        capture.send_signal(signal.SIGTERM)
        out, _ = capture.communicate(timeout=30)
    assert "dropped 0" in out, out

    flows = tcp_udp_streams(capture_file)
    wire = b"".join(bytes(f) for f in flows.values())
    # The capture saw the exchange: at least the segment and state bytes the workers
    # count as sent, and the daemons' Hellos (which carry their peer ids).
    assert len(wire) >= sent > 0, (len(wire), sent)
    assert b"peer-0" in wire and b"peer-1" in wire
    leaks = [(what, key) for pattern, what in patterns(data).items() for key, f in flows.items() if pattern in f]
    assert leaks == []
    # What did travel trained the model: near the two peers' pooled solution, not at
    # either's own (≥ 0.9 away from it). The bound is half of that: gossip ends an
    # O(lr) noise away from the optimum (seen 0.14 at load 4, 0.36 once in 5 CI runs).
    for model in models:
        assert (model - pooled(data)).norm() < 0.45, (model, pooled(data))


def test_elastic_join_and_a_daemon_restart_with_local_data(local_cluster, tmp_path):
    """peer-0 and peer-1 start; peer-2 joins late and takes the job's state; peer-1's
    daemon is killed (-9) and restarted, and resumes from the others. DBS sizes the
    batches by measured speed, which must not change whose data counts how much. Each keeps its own data throughout, and the job ends near
    the pooled solution of all three."""
    roots = [tmp_path / f"data-{k}" for k in range(3)]
    data = [write_peer_data(roots[k], SIZES[k], TRUTH[k], seed=k) for k in range(3)]
    cluster = local_cluster(3, settings=lambda peer: {"data": {"root": str(roots[peer.index])}},
                            slowdowns=(6.0, 6.0, 12.0))
    first, restarted, late = cluster.peers
    wait_for_discovery(cluster)
    secret = tmp_path / "job.secret"
    create_secret_file(secret)
    # DBS on; batches of at least 6, as a batch of 1 on a peer of weight 1.5 makes
    # the end of the job noisy enough to miss the bound below (seen: 0.25 off).
    text = job_text("elastic-local", secret, 500, global_batch=24, min_local_batch=6)
    for peer in (first, restarted):
        cluster.client(peer).join(text, JOBCODE)

    def job(peer):
        jobs = cluster.client(peer).status().jobs
        return jobs[0] if jobs else None

    def log(peer) -> str:
        path = peer.dir / "state" / "jobs" / "elastic-local" / "worker.log"
        return path.read_text() if path.exists() else ""

    def rounds_past(peers, n):
        return lambda: all((j := job(p)) and j.state == "running" and j.progress.round >= n for p in peers)

    wait_for(rounds_past((first, restarted), 100), 120, "the first two to train 100 rounds")
    cluster.client(late).join(text, JOBCODE)
    wait_for(lambda: "joining: took the state of round" in log(late), 120, "the late joiner to take the state")
    at_join = job(first).progress.round
    wait_for(rounds_past(cluster.peers, at_join + 100), 120, "all three to train 100 rounds together")
    took = log(restarted).count("joining: took the state of round")
    restarted.process.kill()  # kill -9 of the whole daemon: its worker dies with it
    restarted.process.wait()
    cluster.start(restarted)
    cluster.wait_ready()
    wait_for(lambda: log(restarted).count("joining: took the state of round") > took, 120,
             "the restarted daemon's worker to resume from the others")

    def finished():
        jobs = [job(p) for p in cluster.peers]
        assert all(j is None or j.state not in ("failed",) for j in jobs), jobs
        return all(j and j.state == "finished" for j in jobs) and jobs

    jobs = wait_for(finished, 400, "all three to finish")
    assert [j.progress.data_samples for j in jobs] == SIZES
    # DBS was in force with all three and gave them unequal batches (from speeds
    # measured on steps this small they follow noise as much as the slowdowns) ...
    plans = re.findall(r"batches peer-0=(\d+) peer-1=(\d+) peer-2=(\d+) \(global 24\)", log(first))
    assert any(len(set(plan)) > 1 for plan in plans), plans
    # ... and the weights stayed by data:
    for peer, n in zip(cluster.peers, SIZES):
        assert f"LR weight {n / 80:.3f} (samples weighting; {n} samples here, 240 in the union of 3 peers)" in log(peer)
    # Near the pooled solution of all three, not the uniform one (≥ 0.6 away from it):
    # the bound is half that, as gossip under load ends a noise away from the optimum.
    target = pooled(data)
    for peer in cluster.peers:
        assert (model_of(peer, "elastic-local") - target).norm() < 0.3, (model_of(peer, "elastic-local"), target)
