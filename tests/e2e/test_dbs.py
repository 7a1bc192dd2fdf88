"""Dynamic batch size end to end: real daemons, one of them slowed down by the
testing knob, find each other, publish their measured speeds through Hello, and
the slow peer ends up with a clearly smaller batch and data share."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import example_job, peerctl, wait_for

pytestmark = pytest.mark.e2e


# "relay": each daemon Hellos one random peer a round and takes the others'
# records (speeds, batches, shares) second-hand (docs/protocol.md, "Membership relay").
@pytest.mark.parametrize("discovery", [{}, {"full_mesh_max": 1, "fanout": 1}], ids=["full-mesh", "relay"])
def test_a_slowed_peer_gets_a_smaller_batch_and_share(local_cluster, discovery):
    cluster = local_cluster(3, slowdowns=(1.0, 1.0, 3.0), settings=lambda peer: {"discovery": dict(discovery)})
    wait_for(lambda: all(cluster.client(p).status().peers_known == 2 for p in cluster.peers),
             30, "every daemon to see the other two")
    text = example_job(job={"name": "dbs", "epochs": 12, "eval_every_rounds": 1000, "global_batch": 96,
                            "min_local_batch": 4, "rebalance_rounds": 5, "rebalance_threshold": 0.1})
    for peer in cluster.peers:
        with cluster.client(peer) as c:
            c.join(text, "")

    def progress():
        rows = {}
        for p in cluster.peers:
            job = cluster.client(p).status().jobs[0]
            assert job.state not in ("failed", "restarting"), (p.peer_id, job)
            rows[p.peer_id] = job.progress
        return rows

    def rebalanced():
        rows = progress()
        shares = [rows[f"peer-{i}"].share for i in range(3)]
        # Epoch ≥ 1 everywhere: the split was made from measured speeds, not the equal
        # start. On a loaded machine the speeds may reach the others an epoch late, so
        # wait for the split to show them (it must, within the limit).
        # local_batch is the last step's: the tail of an epoch may be short, so this
        # is polled too rather than read once.
        batches = [rows[f"peer-{i}"].local_batch for i in range(3)]
        return (all(r.epoch >= 1 for r in rows.values()) and all(s == s for s in shares)
                and shares[2] * 1.5 < min(shares[:2]) and batches[2] * 1.5 < min(batches[:2]) and rows)

    rows = wait_for(rebalanced, 240, "every peer to start an epoch split by measured speeds")
    fast, slow = [rows["peer-0"], rows["peer-1"]], rows["peer-2"]
    assert slow.samples_per_s < min(p.samples_per_s for p in fast)
    # Every peer's plan adds up to the job's global batch, which its LR is scaled for.
    assert all(r.global_batch == 96 for r in rows.values()), rows

    # Another peer sees the same through its daemon's Hello view: `peerctl peers`
    # (as of each peer's last Hello, a second or so behind: polled).
    def seen_through_hello():
        out = peerctl(cluster.peers[0], "--json", "peers")
        assert out.returncode == 0, out.stderr
        seen = {p["peer_id"]: p["job_states"][0] for p in json.loads(out.stdout)["peers"]}
        return (seen["peer-2"]["local_batch"] < seen["peer-1"]["local_batch"]
                and seen["peer-2"]["samples_per_s"] < seen["peer-1"]["samples_per_s"])

    wait_for(seen_through_hello, 30, "peerctl peers to show peer-2 with a smaller batch and speed than peer-1")
    table = peerctl(cluster.peers[0], "peers").stdout
    assert "samples/s" in table and "share" in table and "%" in table


PLAN_LINE = re.compile(r'msg="round (\d+): batches ((?:[^"\\]|\\.)*?) \(global (\d+)\) planned from ((?:[^"\\]|\\.)*)"')


def _plans(log: Path) -> list[tuple[dict[str, int], dict]]:
    """Each plan a worker took: its batches and the step models it came from."""
    out = []
    for m in PLAN_LINE.finditer(log.read_text() if log.exists() else ""):
        batches = {p: int(b) for p, b in (kv.split("=") for kv in m.group(2).split())}
        out.append((batches, json.loads(re.sub(r"\\(.)", r"\1", m.group(4)))))
    return out


def test_a_peer_with_a_fixed_step_cost_gets_the_affine_plans_batch(local_cluster):
    """peer-2 sleeps a fixed 10 ms after every step (the testing knob), which its
    worker counts as fixed cost. The plans the peers take are exactly
    plan_batches(B, speeds, members, min, fixed) of the step models they were
    made from, peer-2's published fixed cost reaches the others through Hello,
    it gets a smaller batch than the same per-sample speeds without fixed costs
    would give it, and it trains the batch its plan gives it."""
    from peerd.core.shares import plan_batches

    overhead = 0.01
    cluster = local_cluster(3, settings=lambda peer: {"worker": {"step_overhead_s": overhead}}
                            if peer.index == 2 else {})
    wait_for(lambda: all(cluster.client(p).status().peers_known == 2 for p in cluster.peers),
             30, "every daemon to see the other two")
    text = example_job(job={"name": "fixedcost", "epochs": 12, "eval_every_rounds": 1000, "global_batch": 96,
                            "min_local_batch": 4, "rebalance_rounds": 5, "rebalance_threshold": 0.1})
    for peer in cluster.peers:
        with cluster.client(peer) as c:
            c.join(text, "")
    logs = [p.dir / "state" / "jobs" / "fixedcost" / "worker.log" for p in cluster.peers]

    def planned_with_peer2s_cost():
        for p in cluster.peers:
            assert cluster.client(p).status().jobs[0].state not in ("failed", "restarting")
        plans = _plans(logs[0])  # peer-0's: peer-2's model reached it through Hello
        return next((plan for plan in reversed(plans)
                     if len(plan[0]) == 3 and plan[1]["fixed_s"].get("peer-2", 0) >= overhead
                     and len(plan[1]["fixed_s"]) == 3), None)

    wait_for(planned_with_peer2s_cost, 240, "peer-0 to plan with peer-2's published fixed cost")
    for log in logs:
        for batches, model in _plans(log):
            members = sorted(batches)
            assert plan_batches(96, model["speeds"], members, 4, model["fixed_s"]).batches == \
                tuple(sorted(batches.items())), (log, batches, model)
    batches, model = planned_with_peer2s_cost()
    without = plan_batches(96, model["speeds"], sorted(batches), 4)
    assert batches["peer-2"] < without.batch("peer-2"), (batches, model)

    def trains_its_planned_batch():
        own = _plans(logs[2])
        return own and cluster.client(cluster.peers[2]).status().jobs[0].progress.local_batch == own[-1][0]["peer-2"]

    wait_for(trains_its_planned_batch, 60, "peer-2 to train the batch of its plan")


STEPS_LINE = re.compile(r'msg="round (\d+): steps per round ((?:[^"\\]|\\.)*?) \(period (\d+)\)"')
RAN_LINE = re.compile(r'msg="round (\d+): (\d+) local steps per round from this round on"')


def test_a_peer_slower_than_the_others_at_the_minimum_batch_takes_fewer_steps_per_round(local_cluster):
    """peer-2 sleeps a fixed 0.4 s after every step: even at min_local_batch it is
    far slower than the others' step, so the plan pins it at the minimum and gives
    it fewer than period_steps = 4 local steps per round (plan_batches_and_steps). Every plan
    in its log is exactly plan_batches_and_steps of the inputs logged with it, and every
    round it ran had the steps of the plan in force (read from its log, in order;
    no timing thresholds: the steps are whatever plan_batches_and_steps gives)."""
    from peerd.core.shares import plan_batches_and_steps

    cluster = local_cluster(3, settings=lambda peer: {"worker": {"step_overhead_s": 0.4}}
                            if peer.index == 2 else {})
    wait_for(lambda: all(cluster.client(p).status().peers_known == 2 for p in cluster.peers),
             30, "every daemon to see the other two")
    text = example_job(job={"name": "fewsteps", "epochs": 12, "eval_every_rounds": 1000, "global_batch": 96,
                            "min_local_batch": 4, "rebalance_rounds": 5, "rebalance_threshold": 0.1},
                       gossip={"period_steps": 4})
    for peer in cluster.peers:
        with cluster.client(peer) as c:
            c.join(text, "")
    log = cluster.peers[2].dir / "state" / "jobs" / "fewsteps" / "worker.log"

    def events():
        """peer-2's plans (batches, inputs, its steps) and rounds run, in log order."""
        text = log.read_text() if log.exists() else ""
        found = [(m.start(), "plan", m) for m in PLAN_LINE.finditer(text)]
        found += [(m.start(), "steps", m) for m in STEPS_LINE.finditer(text)]
        found += [(m.start(), "ran", m) for m in RAN_LINE.finditer(text)]
        return [(kind, m) for _, kind, m in sorted(found, key=lambda f: f[0])]

    def ran_fewer_steps():
        states = [cluster.client(p).status().jobs[0].state for p in cluster.peers]
        assert not {"failed", "restarting"} & set(states), states
        ran = any(kind == "ran" and int(m.group(2)) < 4 for kind, m in events())
        assert ran or states[2] != "finished", "peer-2 ended the job without a round of fewer steps"
        return ran

    wait_for(ran_fewer_steps, 240, "peer-2 to end a round after fewer than 4 local steps")
    in_force, plans, checked, want_steps = 4, 0, 0, ()
    for kind, m in events():
        assert kind == "steps" or not want_steps, "a plan with fewer steps logs them on the next line"
        if kind == "plan":
            batches = {p: int(b) for p, b in (kv.split("=") for kv in m.group(2).split())}
            model = json.loads(re.sub(r"\\(.)", r"\1", m.group(4)))
            assert model["period_steps"] == 4
            expected = plan_batches_and_steps(96, model["speeds"], sorted(batches), 4, model["fixed_s"], 4)
            assert expected.batches == tuple(sorted(batches.items())), (batches, model)
            in_force, plans = expected.round_steps("peer-2", 4), plans + 1
            want_steps = expected.steps
        elif kind == "steps":
            steps = tuple(sorted((p, int(s)) for p, s in (kv.split("=") for kv in m.group(2).split())))
            assert steps == want_steps, (steps, want_steps)  # the line right after its plan
            want_steps = None
        else:
            assert int(m.group(2)) == in_force, (m.group(0), in_force)
            checked += 1
    assert plans and checked and in_force < 4
