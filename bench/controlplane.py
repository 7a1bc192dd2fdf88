#!/usr/bin/env python
"""The control plane at lab size: N idle daemons on this machine (127.0.0.1,
zeroconf on loopback), each mode in turn in one invocation.

For each N and mode it starts N real daemons with no jobs (peerd.cli.localcluster.LocalCluster)
and measures: seconds from the last daemon answering its control socket until every
daemon's view holds the other N - 1; each daemon's CPU (% of one core, from
/proc/PID/stat), RSS and Hellos sent and answered a second (its /metrics) over a
fixed idle window; with --join, the seconds from `peerctl join NAME` on one daemon
to its worker's first step, joining the example job that another daemon trains,
with the other N - 2 idle around them; with --kill, seconds from a `kill -9` of one
daemon until every other view has dropped it, and from its restart until every view
holds it again.
--paper and --spread measure no daemons: the per-Hello work of a large view in this
process, and a model of the relay rule's spread. Modes: `mesh` (a Hello to every known
peer each interval: [discovery] full_mesh_max set above N) and `relay` (the
defaults: a Hello to `fanout` random peers, whose replies relay the others' records;
docs/protocol.md, "Membership relay"). Every daemon is stopped by PID at the end,
also on errors or Ctrl+C.

    .venv/bin/python bench/controlplane.py --sizes 8,16,32 --window 30 --settle 20 --kill
    .venv/bin/python bench/controlplane.py --sizes 64 --window 30 --settle 20 --kill --timeout 150
    .venv/bin/python bench/controlplane.py --sizes 8,16,32 --modes relay --window 10 --join
    .venv/bin/python bench/controlplane.py --paper 64,1000
    .venv/bin/python bench/controlplane.py --spread 64,256,1000
"""

from __future__ import annotations

import os
import signal
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from harness.cluster import FIRST_STEP, job_status, join_by_name, poll_until, stamp_of, wait_job_seen
from harness.output import md_row, md_table, write_json
from harness.script import arg_parser, names, numbers, run_dir, run_main
from peerd.cli.localcluster import LocalCluster, default_job, job_with
from peerd.errors import PeerdError

MODES = {"mesh": {"full_mesh_max": 100_000}, "relay": {}}
TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def views(cluster, peers) -> list[int]:
    """Each daemon's count of known peers, in order; -1 where it did not answer."""
    out = []
    for peer in peers:
        try:
            with cluster.client(peer) as c:
                out.append(c.status().peers_known)
        except PeerdError:
            out.append(-1)
    return out


def wait_views(cluster, peers, want: int, timeout_s: float, what: str) -> float:
    """Seconds until every daemon of `peers` knows exactly `want` others."""
    started = time.monotonic()
    poll_until(lambda: daemons_alive_among(peers) and all(v == want for v in views(cluster, peers)),
               timeout_s, what, interval_s=0.5)
    return time.monotonic() - started


def daemons_alive_among(peers) -> bool:
    dead = [p.peer_id for p in peers if p.process.poll() is not None]
    if dead:
        raise PeerdError(f"daemons exited: {', '.join(dead)}")
    return True


def hellos(cluster) -> float:
    """Hellos sent and answered by all daemons so far (their /metrics)."""
    total = 0.0
    for peer in cluster.peers:
        with urllib.request.urlopen(peer.page_url + "metrics", timeout=10) as reply:
            text = reply.read().decode()
        total += sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
                     if s.name in ("peerd_hellos_sent_total", "peerd_hellos_received_total"))
    return total


def idle(cluster, window_s: float) -> dict:
    """CPU % of a core, RSS and Hellos (sent + answered) per second per daemon over
    `window_s` seconds of no polling."""
    pids = [p.process.pid for p in cluster.peers]
    messages = hellos(cluster)
    before = [cpu_s(pid) for pid in pids]
    time.sleep(window_s)
    cpu = sorted(100 * (cpu_s(pid) - b) / window_s for pid, b in zip(pids, before))
    messages = (hellos(cluster) - messages) / window_s / len(pids)
    rss = sorted(rss_mb(pid) for pid in pids)
    return {"cpu_mean": sum(cpu) / len(cpu), "cpu_max": cpu[-1], "rss_mean": sum(rss) / len(rss), "rss_max": rss[-1],
            "hellos_per_s": messages}


def kill_and_restart(cluster, timeout_s: float) -> dict:
    """kill -9 one daemon: seconds until no other view holds it; restarted: until every view does."""
    victim, others = cluster.peers[0], cluster.peers[1:]
    n = len(cluster.peers)
    os.kill(victim.process.pid, signal.SIGKILL)
    victim.process.wait()
    detect = wait_views(cluster, others, n - 2, timeout_s, f"{victim.peer_id} to leave every view")
    cluster.start(victim)
    cluster.wait_ready()
    rejoin = wait_views(cluster, cluster.peers, n - 1, timeout_s, f"{victim.peer_id} back in every view")
    return {"detect_s": detect, "rejoin_s": rejoin}


def join_time(cluster, timeout_s: float) -> dict:
    """peer-0 trains the example job; peer-1 joins it by name: seconds to its first step."""
    donor, late = cluster.peers[0], cluster.peers[1]
    with cluster.client(donor) as c:
        c.join(job_with(default_job(), job={"name": "cp-join", "epochs": 100, "eval_every_rounds": 1000}))
    poll_until(lambda: (j := job_status(cluster, donor, "cp-join")) is not None and j.progress.round >= 1,
               timeout_s, "the donor to train")
    wait_job_seen(lambda: cluster.client(late), "cp-join", timeout_s)
    started, log = join_by_name(lambda: cluster.client(late), late.dir, "cp-join", timeout_s)
    first = stamp_of(log, FIRST_STEP) - started
    for peer in (donor, late):
        with cluster.client(peer) as c:
            c.leave("cp-join")
    return {"join_s": first}


def one_case(n: int, mode: str, opts, out: Path) -> dict:
    settings = lambda peer: {"discovery": dict(MODES[mode])}  # noqa: E731
    row: dict = {"n": n, "mode": mode}
    with LocalCluster(n, out / f"{mode}-{n}", settings=settings, metrics=True) as cluster:
        cluster.wait_ready(timeout_s=opts.timeout)
        row["start_s"] = time.monotonic()
        try:
            row["complete_s"] = wait_views(cluster, cluster.peers, n - 1, opts.timeout,
                                           f"every view of {n} to be complete")
        except PeerdError:
            row["complete_s"] = float("nan")
            row["fewest"] = min(views(cluster, cluster.peers))
        time.sleep(opts.settle)
        row.update(idle(cluster, opts.window))
        after = views(cluster, cluster.peers)
        row["complete_after"] = sum(v == n - 1 for v in after)
        if opts.join:
            row.update(join_time(cluster, opts.timeout))
        if opts.kill and row["complete_s"] == row["complete_s"]:
            row.update(kill_and_restart(cluster, opts.timeout))
    del row["start_s"]
    return row


def paper(n: int, fanout: int, repeats: int = 20) -> dict:
    """The per-Hello work that grows with N, timed in this process on the real
    code: a relaying reply of a view of n - 1 idle peers (one JobAd each) built and
    serialized (the callee), parsed and merged with nothing new (the caller)."""
    from peerd.settings.config import DaemonConfig
    from peerd.core.membership import Membership, PeerRecord
    from peerd.daemon.records import state_of_reply
    from peerd.daemon.hello import HelloClient
    from peerd.proto.v1 import peer_pb2

    def client(me: str) -> HelloClient:
        c = HelloClient(me, DaemonConfig(), Membership(me, 60.0), None, None)
        c.relaying = True
        return c

    callee, caller = client("callee"), client("caller")
    ad = peer_pb2.JobAd(name="job", spec_fingerprint="f" * 64, worker_address="10.0.0.1:40000", round=1234,
                        state="running", phase="training", lr=0.1, global_batch=256, samples_per_s=900.0)
    for i in range(n - 1):
        reply = peer_pb2.HelloReply(peer_id=f"peer-{i}", version="0.1.0", realm="r", jobs=[ad],
                                    incarnation=1, state_version=1)
        address = f"10.0.{i // 250}.{i % 250}:7000"
        callee.records.remember(state_of_reply(reply, address))
        callee.membership.observe(PeerRecord(reply.peer_id, address, last_seen=time.monotonic(), incarnation=1,
                                             state_version=1))
    started = time.process_time()
    for _ in range(repeats):
        raw = peer_pb2.HelloReply(peer_id="callee", peers=callee.records.states(callee.membership, time.monotonic())
                                  ).SerializeToString()
    build = (time.process_time() - started) / repeats
    caller._hear(peer_pb2.HelloReply.FromString(raw).peers)  # the first: every record new
    started = time.process_time()
    for _ in range(repeats):
        caller._hear(peer_pb2.HelloReply.FromString(raw).peers)
    merge = (time.process_time() - started) / repeats
    return {"n": n, "reply_bytes": len(raw), "build_ms": 1000 * build, "merge_ms": 1000 * merge,
            "cpu_pct": 100 * fanout * (build + merge)}


def spread(n: int, fanout: int = 3, rounds: int = 60, seed: int = 0) -> int:
    """The largest age (intervals) of any daemon's news in any view, in a model of
    the relay rule (docs/algorithms.md, "Membership at lab size"): each interval
    every daemon Hellos `fanout` random others; the callee hears the caller, the
    caller the callee and the callee's freshest news of everyone."""
    import numpy as np

    rng = np.random.default_rng(seed)
    age = np.zeros((n, n))
    worst = 0.0
    for r in range(rounds):
        before = age.copy()
        for i in range(n):
            for j in rng.choice(np.delete(np.arange(n), i), size=fanout, replace=False):
                age[j, i] = 0
                np.minimum(age[i], before[j], out=age[i])
                age[i, j] = 0
        np.fill_diagonal(age, 0)
        age += 1
        if r >= 20:
            worst = max(worst, age.max())
    return int(worst)


HEAD = ("N", "mode", "views complete (s)", "idle CPU % of a core, mean (max)", "Hellos sent + answered /s",
        "RSS MB, mean (max)",
        "complete after the window", "join → first step (s)", "kill -9 → out of every view (s)",
        "restart → in every view (s)")


def cells(r: dict) -> list[str]:
    f = lambda key, fmt="{:.1f}": fmt.format(r[key]) if key in r else "—"  # noqa: E731
    complete = f("complete_s") if r["complete_s"] == r["complete_s"] else f"> timeout (fewest {r['fewest']})"
    return [r["n"], r["mode"], complete, f"{r['cpu_mean']:.2f} ({r['cpu_max']:.2f})", f"{r['hellos_per_s']:.1f}",
            f"{r['rss_mean']:.0f} ({r['rss_max']:.0f})", f"{r['complete_after']}/{r['n']}",
            f("join_s", "{:.2f}"), f("detect_s"), f("rejoin_s")]


def parse_args(argv: list[str] | None = None):
    parser = arg_parser(__doc__, raw=True)
    parser.add_argument("--sizes", default="8,16,32", help="daemon counts, comma-separated")
    parser.add_argument("--modes", default="mesh,relay", help=f"of {', '.join(MODES)}, in this order")
    parser.add_argument("--window", type=float, default=30.0, help="idle window, seconds")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds after complete views before it")
    parser.add_argument("--timeout", type=float, default=180.0, help="bound on each wait, seconds")
    parser.add_argument("--join", action="store_true", help="then time a join by name to its first step")
    parser.add_argument("--kill", action="store_true", help="then kill -9 one daemon and restart it")
    parser.add_argument("--paper", default="", help="only time the per-Hello work of a relaying view of "
                        "these sizes (e.g. 64,1000) in this process, and exit")
    parser.add_argument("--spread", default="", help="only model the relay rule at these sizes (e.g. 64,1000): "
                        "the largest age of news in any view, and exit")
    parser.add_argument("--out", type=Path, help="run folder (default runs/controlplane-TIME)")
    opts = parser.parse_args(argv)
    opts.sizes = numbers(parser, opts.sizes, int, "--sizes")
    opts.modes = names(parser, opts.modes, MODES, "--modes")
    opts.paper = numbers(parser, opts.paper, int, "--paper")
    opts.spread = numbers(parser, opts.spread, int, "--spread")
    return opts


def main() -> int:
    opts = parse_args()
    for n in opts.paper:
        r = paper(n, fanout=3)
        print(f"N = {n}: a relaying reply {r['reply_bytes'] / 1000:.0f} kB, built {r['build_ms']:.2f} ms, "
              f"merged {r['merge_ms']:.2f} ms; at fanout 3: {r['cpu_pct']:.2f} % of a core", flush=True)
    for n in opts.spread:
        print(f"N = {n}: news at most {spread(n)} intervals old in any view (fanout 3, 60 rounds)", flush=True)
    if opts.paper or opts.spread:
        return 0
    out = run_dir(opts.out, "controlplane")
    print(md_table(HEAD), flush=True)
    rows = []
    for n in opts.sizes:
        for mode in opts.modes:
            rows.append(one_case(n, mode, opts, out))
            print(md_row(cells(rows[-1])), flush=True)
            write_json(out / "controlplane.json", rows)
    print(f"written: {out / 'controlplane.json'}")
    return 0


if __name__ == "__main__":
    run_main(main)
