"""peerd.sim: the simulator drives the real cores and keeps the invariants of each algorithm."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest

from peerd.core.groups import form_groups, partner_groups, plan_hierarchical
from peerd.core.lr import cosine
from peerd.core.partition import my_shard
from peerd.core.topology import plan_round
from peerd.sim import SimConfig, Simulation, parse_schedule
from peerd.sim.cli import main
from peerd.sim.data import shards
from peerd.sim.network import Fabric, NetworkSpec
from peerd.sim.task import Task

TASK = Task()  # loading the digits once keeps the tests quick
CONSERVING = ("allreduce", "sgp", "gossip", "crossover", "crossover-whole", "hierarchical")


def _sim(**kw) -> Simulation:
    return Simulation(SimConfig(**{"peers": 16, "rounds": 6, "global_batch": 128, **kw}), TASK)


def _spread(sim: Simulation, seed: int = 1) -> np.ndarray:
    """Give every peer a different model, so averaging has something to do."""
    n = sim.cfg.peers
    sim.state.x[:n] = np.random.default_rng(seed).standard_normal((n, sim.task.size)).astype(np.float32)
    return sim.state.x[:n].astype(np.float64).copy()


def test_same_seed_same_run():
    runs = [_sim(algorithm="hierarchical", group_size=4, speed_spread=0.3, jitter_prob=0.2) for _ in range(2)]
    results = [s.run() for s in runs]
    assert json.dumps(results[0].rounds) == json.dumps(results[1].rounds)  # NaN-safe equality
    assert results[0].peers == results[1].peers
    assert np.array_equal(runs[0].state.x, runs[1].state.x)
    other = _sim(algorithm="hierarchical", group_size=4, speed_spread=0.3, jitter_prob=0.2, seed=1)
    other.run()
    assert not np.array_equal(other.state.x, runs[0].state.x)


@pytest.mark.parametrize("algorithm", CONSERVING)
def test_gossip_rounds_lose_no_mass(algorithm):
    # 13 peers, 3 per host, groups of ≤ 4: unequal groups, the hard case for hierarchical.
    sim = _sim(algorithm=algorithm, peers=13, gossip_only=True, group_size=4,
               network=NetworkSpec(gpus_per_host=3, hosts_per_rack=2))
    start = _spread(sim)
    for r in range(6):
        sim.round(r)
        assert np.allclose(sim.state.x[:13].sum(axis=0), start.sum(axis=0), atol=1e-3)
        assert sim.state.w[:13].sum() == pytest.approx(13.0)
    if algorithm != "allreduce":  # everyone averaged: the spread shrank
        models = sim.state.models(np.arange(13))
        assert np.linalg.norm(models - models.mean(0), axis=1).mean() < np.linalg.norm(start - start.mean(0), axis=1).mean()


@pytest.mark.parametrize("algorithm", ["crossover-unbalanced", "random-pull"])
def test_unbalanced_pulls_keep_consensus_but_not_the_mean(algorithm):
    sim = _sim(algorithm=algorithm, gossip_only=True)
    start = _spread(sim)
    sim.round(0)
    assert not np.allclose(sim.state.x[:16].sum(axis=0), start.sum(axis=0), atol=1e-3)
    same = _sim(algorithm=algorithm, gossip_only=True)
    same.state.x[:16] = 0.25
    same.round(0)
    assert np.all(same.state.x[:16] == 0.25)  # row-stochastic: agreement stays agreement


def test_crossover_pulls_from_the_topology_plan():
    sim = _sim(algorithm="crossover", gossip_only=True, segments=5)
    start = _spread(sim)
    sim.round(0)
    names = [f"p{k:05d}" for k in range(16)]
    for k, me in enumerate(names):
        plan = plan_round("sim", 0, names, me, 5)
        for s, span in enumerate(sim.segs.spans):
            src = names.index(plan.sources[s])
            cols = slice(span.start, span.stop)
            assert np.allclose(sim.state.x[k, cols], 0.5 * (start[k, cols] + start[src, cols]), atol=1e-5)


def test_hierarchical_follows_the_group_plan():
    net = NetworkSpec(gpus_per_host=3, hosts_per_rack=2)
    sim = _sim(algorithm="hierarchical", peers=13, gossip_only=True, group_size=4, segments=6, network=net)
    start = _spread(sim)
    sim.round(0)
    names = [f"p{k:05d}" for k in range(13)]
    locs = {n: net.locality(k) for k, n in enumerate(names)}
    groups = form_groups("sim", 0, locs, 4)
    assert sorted(p for g in groups for p in g) == names and max(map(len, groups)) <= 4
    assert len({len(g) for g in groups}) > 1  # unequal sizes really were exercised
    for s in range(6):
        partner = partner_groups("sim", 0, len(groups), s)
        assert sorted(partner) == list(range(len(groups))) and all(partner[g] != g for g in range(len(groups)))
    mean = {g: start[[names.index(p) for p in g]].mean(0) for g in groups}
    for k, me in enumerate(names):
        plan = plan_hierarchical("sim", 0, locs, me, 6, 4)
        for s, span in enumerate(sim.segs.spans):
            other = next(g for g in groups if plan.sources[s] in g)
            want = (1 - plan.weight) * mean[plan.group] + plan.weight * mean[other]
            assert np.allclose(sim.state.x[k, span.start : span.stop], want[span.start : span.stop], atol=1e-5)


def test_crossover_sends_one_model_per_peer_per_round():
    result = _sim(algorithm="crossover", rounds=3).run()
    model_bytes = TASK.size * 4
    for row in result.rounds:
        assert row["bytes_per_peer"] == pytest.approx(model_bytes)
        assert row["max_bytes_per_peer"] == pytest.approx(model_bytes)  # load balanced: nobody sends twice
    unbalanced = _sim(algorithm="crossover-unbalanced", rounds=3).run()
    assert max(r["max_bytes_per_peer"] for r in unbalanced.rounds) > model_bytes
    hier = _sim(algorithm="hierarchical", rounds=3, group_size=8).run()  # two hosts of 8
    assert hier.rounds[0]["bytes_per_peer"] == pytest.approx(model_bytes * (2 * 7 / 8 + 1 / 8), rel=0.01)


def test_training_learns_and_reports_everything():
    result = _sim(algorithm="crossover", rounds=0, epochs=2, eval_every=5).run()
    s = result.summary
    assert s["test_accuracy_mean_peer"] > 0.6 and s["test_accuracy_of_mean_model"] > 0.6
    assert s["mean_consensus_distance"] > s["final_consensus_distance"] > 0
    assert s["final_train_loss"] < result.rounds[0]["train_loss"]
    assert result.rounds[-1]["train_loss"] < result.rounds[0]["train_loss"]
    assert all(r["sim_time_s"] > 0 for r in result.rounds)
    assert [r["sim_time_s"] for r in result.rounds] == sorted(r["sim_time_s"] for r in result.rounds)
    assert len(result.peers) == 16 and all(p["compute_s"] > 0 and p["idle_s"] >= 0 for p in result.peers)
    assert not np.isnan(result.rounds[4]["test_accuracy_of_mean"])


def test_shards_match_the_partition_core():
    names = [f"p{k:05d}" for k in range(7)]
    cut = shards(4000, "sim", 3, names)
    for me in names:
        assert cut[me].tolist() == my_shard(4000, "sim", 3, names, me)


ALL = ("allreduce", "sgp", "gossip", "crossover", "crossover-unbalanced", "crossover-whole", "random-pull", "hierarchical")


@pytest.mark.parametrize("algorithm", ALL)
def test_crash_join_and_leave(algorithm):
    events = parse_schedule(["fail:3@0.2", "leave:5@0.3", "join:2@0.4", "speed:0@0=0.5"])
    sim = Simulation(SimConfig(peers=16, rounds=30, global_batch=128, schedule=events, detect_s=0.5,
                               algorithm=algorithm, group_size=4), TASK)
    result = sim.run()
    assert np.isfinite(sim.state.x).all() and result.summary["test_accuracy_min_peer"] > 0.5
    rows = result.rounds
    assert rows[0]["peers"] == 16 and rows[-1]["peers"] == 16  # 16 − crash − leave + 2 joiners
    assert any(r["in_view"] > r["peers"] for r in rows)  # the crashed peer lingers in the view ...
    assert rows[-1]["in_view"] == rows[-1]["peers"]  # ... until the membership core expires it
    crashed = [p for p in result.peers if p["crashed"]]
    assert [p["slot"] for p in crashed] == [3]
    assert {p["slot"] for p in result.peers} >= {16, 17}
    slow = next(p for p in result.peers if p["slot"] == 0)
    fast = next(p for p in result.peers if p["slot"] == 1)
    assert slow["compute_s"] > 1.5 * fast["compute_s"]


@pytest.mark.parametrize("bad", ["fail:3", "boom:1@2", "speed:1@2", "join:0@1", "fail:1@2=3"])
def test_bad_schedule_entries_are_refused(bad):
    with pytest.raises(ValueError, match="KIND|speed|only|join"):
        parse_schedule([bad])


def test_cli_writes_tables_and_figures(tmp_path, capsys):
    assert main(["--peers", "8,16", "--algorithm", "sgp,crossover", "--rounds", "3", "--out", str(tmp_path), "--quiet"]) == 0
    for run in ("sgp-8p-s0", "crossover-16p-s0"):
        assert (tmp_path / run / "rounds.csv").read_text().count("\n") == 4
        assert (tmp_path / run / "run.png").stat().st_size > 0
        assert json.loads((tmp_path / run / "summary.json").read_text())["rounds"] == 3
    assert (tmp_path / "sweep.csv").read_text().count("\n") == 5
    assert (tmp_path / "sweep.png").exists() and (tmp_path / "consensus-16.png").exists()
    assert "accuracy" in capsys.readouterr().out


def test_cli_refuses_bad_input(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--algorithm", "nope"])
    assert e.value.code == 2 and "choose from" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--peers", "4", "--global-batch", "2"])
    assert "global_batch ≥ peers" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--peers", "2", "--rounds", "5", "--event", "fail:0@0", "--event", "leave:1@0", "--quiet", "--no-plot"])
    assert "no peer is left" in capsys.readouterr().err


def test_network_tiers_and_shared_cards():
    spec = NetworkSpec(gpus_per_host=2, hosts_per_rack=2)
    assert [spec.tier(0, k) for k in (1, 2, 4)] == [0, 1, 2]  # same host, same rack, across racks
    assert spec.locality(5) == ("rack1", "host2")
    one = Fabric(spec).send(0, 2, 1e6, 0.0)
    assert one == pytest.approx(1e6 / spec.rack.bandwidth + spec.rack.latency)
    shared = Fabric(spec)
    ends = [shared.send(0, 2, 1e6, 0.0), shared.send(1, 3, 1e6, 0.0)]  # both through host 0's card
    assert ends[1] == pytest.approx(2 * 1e6 / spec.rack.bandwidth + spec.rack.latency)
    bus = Fabric(spec)
    assert bus.send(0, 1, 1e6, 0.0) == bus.send(1, 0, 1e6, 0.0)  # inside a host: separate buses


def test_local_batch_scales_the_lr_smoothly_when_peers_join():
    events = parse_schedule(["join:8@0.1"])
    cfg = SimConfig(peers=8, rounds=30, local_batch=16, lr=0.1, schedule=events, ramp_steps=4,
                    scaling="linear", max_scale=math.inf)
    rows = Simulation(cfg, TASK).run().rounds
    assert rows[0]["global_batch"] == 128 and rows[-1]["global_batch"] == 256
    joined = next(k for k, r in enumerate(rows) if r["global_batch"] == 256)
    base = [0.1 * cosine(r / 30) for r in range(30)]
    scale = [r["lr"] / b for r, b in zip(rows, base)]
    assert scale[joined - 1] == pytest.approx(1.0)
    assert 1.0 < scale[joined + 1] < 2.0  # ramping: neither the old LR nor the jump
    assert scale[joined + 8] == pytest.approx(2.0)  # k = 2: T·k = 8 steps later at the linear rule


@pytest.mark.parametrize(("scaling", "max_scale", "settles_at"), [
    ("linear", "inf", 4.0), ("linear", "2", 2.0), ("sqrt", "inf", 2.0), ("sqrt", "1.5", 1.5), ("none", "4", 1.0),
])
def test_scaling_and_max_scale_set_where_the_lr_settles(tmp_path, scaling, max_scale, settles_at):
    args = ["--peers", "4", "--local-batch", "8", "--rounds", "40", "--lr", "0.1", "--event", "join:12@0.05",
            "--ramp-steps", "2", "--scaling", scaling, "--max-scale", max_scale, "--out", str(tmp_path),
            "--no-plot", "--quiet"]
    assert main(args) == 0
    rows = list(csv.DictReader((tmp_path / "crossover-4p-s0" / "rounds.csv").open()))
    scale = [float(r["lr"]) / (0.1 * cosine(int(r["round"]) / 40)) for r in rows]
    assert scale[0] == pytest.approx(1.0)
    assert int(rows[-1]["peers"]) == 16 and scale[-1] == pytest.approx(settles_at)
    assert all(b >= a - 1e-9 for a, b in zip(scale, scale[1:]))  # a ramp up, never past the target
    summary = json.loads((tmp_path / "crossover-4p-s0" / "summary.json").read_text())
    assert summary["scaling"] == scaling and summary["max_scale"] == float(max_scale)


def test_a_cap_below_one_is_refused(capsys):
    with pytest.raises(SystemExit):
        main(["--peers", "4", "--rounds", "2", "--max-scale", "0.5", "--no-plot", "--quiet"])
    assert "max_scale" in capsys.readouterr().err


# ------------------------------------------------------------ the outer step (docs/algorithms.md, "The outer step")


def _outer_pair(algorithm: str, steps: int, **outer) -> tuple[Simulation, Simulation]:
    """The same run with rounds every 8 steps, without and with the outer step."""
    kw = {"peers": 16, "rounds": steps, "global_batch": 128, "algorithm": algorithm, "group_size": 4}
    plain = Simulation(SimConfig(**kw, period=8), TASK)
    stepped = Simulation(SimConfig(**kw, outer_every=8, **outer), TASK)
    plain.run()
    stepped.run()
    return plain, stepped


@pytest.mark.parametrize("algorithm", ["crossover", "sgp", "hierarchical"])
def test_outer_lr_1_without_momentum_is_the_rounds_every_h_steps(algorithm):
    plain, stepped = _outer_pair(algorithm, 16, outer_lr=1.0, outer_momentum=0.0)
    # θ ← θ₀ − 1·(θ₀ − θ_avg) is θ_avg up to the rounding of θ₀ − θ_avg (half an ulp of the
    # larger of the two; exact where they are within a factor 2 of each other), so equal to
    # float32 rounding, not bit for bit; over many steps SGD amplifies those ulps.
    x, y = plain.state.x[:16], stepped.state.x[:16]
    assert np.allclose(x, y, rtol=0, atol=1e-6)
    assert np.abs(x - y).max() <= 2.0**-23 * np.abs(x).max()
    assert np.array_equal(stepped.outer.anchor[:16], stepped.state.x[:16])  # the model restarts from the anchor
    assert not np.any(stepped.outer.buffer)  # momentum 0 keeps no buffer
    assert [r["bytes_per_peer"] for r in plain.result.rounds] == [r["bytes_per_peer"] for r in stepped.result.rounds]


def test_the_outer_step_moves_the_anchor_by_its_lr_and_keeps_the_change_in_its_buffer():
    start = TASK.init(0)
    plain, stepped = _outer_pair("crossover", 8, outer_lr=0.5, outer_momentum=0.9, outer_nesterov=False)
    avg = plain.state.x[:16]  # where one round every 8 steps leaves each peer
    assert np.allclose(stepped.state.x[:16], start - 0.5 * (start - avg), atol=1e-6)
    assert np.allclose(stepped.outer.buffer[:16], start - avg, atol=1e-6)  # the first step: b = Δ
    nesterov = _outer_pair("crossover", 8, outer_lr=0.5, outer_momentum=0.9)[1]
    assert np.allclose(nesterov.state.x[:16], start - 0.5 * 1.9 * (start - avg), atol=1e-6)


def test_a_joiner_takes_its_donors_model_anchor_and_buffer():
    events = parse_schedule(["join:1@0.06"])  # in step 4, after the first outer step
    sim = Simulation(SimConfig(peers=8, rounds=40, global_batch=64, schedule=events, outer_every=4,
                               outer_momentum=0.5), TASK)
    for r in range(40):
        sim.round(r)
        if 8 in sim.live:
            break
    assert (r + 1) % 4 != 0, "the join should land between two outer steps"  # else one has run since
    donor = 0  # newcomers are spread over the live peers by slot: slot 8 of 8 takes peer 0
    assert np.array_equal(sim.outer.anchor[8], sim.outer.anchor[donor])
    assert not np.array_equal(sim.outer.anchor[8], sim.outer.anchor[1])  # gossip left the anchors unequal
    assert np.any(sim.outer.buffer[8]) and np.array_equal(sim.outer.buffer[8], sim.outer.buffer[donor])
    assert not np.array_equal(sim.outer.anchor[8], sim.state.x[8])  # the model had moved past the anchor


def test_rounds_every_h_steps_send_an_h_th_of_the_bytes_and_the_outer_step_learns():
    every = _sim(algorithm="crossover", rounds=64, local_batch=8).run().summary
    period = _sim(algorithm="crossover", rounds=64, local_batch=8, period=8).run().summary
    assert period["averaging_rounds"] == 8 and every["averaging_rounds"] == 64
    assert period["bytes_per_sample"] == pytest.approx(every["bytes_per_sample"] / 8)
    outer = _sim(algorithm="crossover", rounds=200, local_batch=8, lr=0.2, outer_every=8, outer_lr=1.0,
                 outer_momentum=0.5).run().summary
    assert outer["test_accuracy_min_peer"] > 0.8  # chance is 0.1


def test_cli_takes_the_outer_step_and_refuses_it_with_a_period(tmp_path, capsys):
    args = ["--peers", "4", "--rounds", "16", "--out", str(tmp_path), "--quiet", "--no-plot"]
    assert main([*args, "--outer-every", "4", "--outer-lr", "0.5", "--no-outer-nesterov"]) == 0
    assert json.loads((tmp_path / "crossover-4p-s0" / "summary.json").read_text())["averaging_rounds"] == 4
    with pytest.raises(SystemExit):
        main([*args, "--outer-every", "4", "--period", "2"])
    assert "period 1 with outer_every" in capsys.readouterr().err


def test_dbs_gives_a_slow_peer_fewer_steps_per_round_as_the_shares_core_plans():
    events = parse_schedule(["speed:1@0=0.25"])
    sim = _sim(peers=8, rounds=16, local_batch=8, period=8, dbs_steps=True, schedule=events)
    result = sim.run()
    # all at the minimum batch, so the plan keeps the batches: the fastest peers' 8 steps of
    # 17 ms set the round, and the slow peer's 65 ms steps fit 2 times into it
    assert sim.planned == {**{s: 8 for s in range(8)}, 1: 2}
    assert [r["global_batch"] for r in result.rounds[:8]] == [64, 64] + [56] * 6
    slow, fast = (next(p for p in result.peers if p["slot"] == s) for s in (1, 0))
    assert slow["compute_s"] == pytest.approx(2 * 2 * 0.065) and fast["compute_s"] == pytest.approx(2 * 8 * 0.017)


def test_weighing_the_changes_by_the_samples_trained():
    kw = {"peers": 8, "rounds": 8, "local_batch": 8, "algorithm": "allreduce", "period": 8}
    plain, weighed = (_sim(**kw, weigh_changes=w) for w in (False, True))
    plain.run()
    weighed.run()
    assert np.allclose(plain.state.x[:8], weighed.state.x[:8], atol=1e-6)  # equal samples: equal weights
    sim = _sim(**kw, gossip_only=True, weigh_changes=True)  # no steps: only the round moves the models
    start = _spread(sim)
    samples = [8, 16, 8, 8, 8, 8, 8, 64]
    sim.trained[:8] = samples
    sim.round(7)  # the 8th step ends with the round
    assert np.allclose(sim.state.x[:8], np.average(start, 0, samples), atol=1e-5)
    assert not np.any(sim.trained[:8])  # counted again from the round on
    with pytest.raises(ValueError, match="allreduce with weigh_changes"):
        SimConfig(algorithm="crossover", weigh_changes=True)


def test_the_inner_tier_keeps_one_group_identical_after_every_step():
    net = NetworkSpec(gpus_per_host=16)  # one host, one group of all 16
    sim = _sim(algorithm="hierarchical", group_size=16, network=net, rounds=12, local_batch=8, period=4, group_every=1)
    for r in range(12):
        sim.round(r)
        x = sim.state.x[:16]
        assert np.array_equal(x, np.broadcast_to(x[0], x.shape)), f"step {r}"
    rows = sim.result.rounds
    assert [r["group_bytes_per_peer"] > 0 for r in rows] == [(r + 1) % 4 != 0 for r in range(12)]
    assert all(r["slow_bytes_per_peer"] == 0 for r in rows)  # nothing leaves the host


def test_the_inner_tier_averages_within_groups_and_its_bytes_stay_off_the_slow_links():
    net = NetworkSpec(gpus_per_host=4)  # groups of 4 = hosts
    kw = {"algorithm": "hierarchical", "group_size": 4, "network": net, "rounds": 16, "local_batch": 8, "period": 8}
    sim = _sim(**kw, group_every=1)
    sim.round(0)
    x = sim.state.x[:16].reshape(4, 4, -1)
    assert all(np.array_equal(h, np.broadcast_to(h[0], h.shape)) for h in x)
    assert not np.array_equal(x[0, 0], x[1, 0])
    tiered, plain = _sim(**kw, group_every=1).run().summary, _sim(**kw).run().summary
    model = tiered["model_bytes"]
    # a round: one pull across groups per segment per group, a quarter model per peer, every 64 samples
    assert tiered["slow_bytes_per_sample"] == pytest.approx(model / 4 / 64) == plain["slow_bytes_per_sample"]
    # the other 7 steps of 8: a ring all-reduce of 4, 2·3/4 models per peer
    assert tiered["group_bytes_per_sample"] == pytest.approx(7 * 1.5 * model / 64) and plain["group_bytes_per_sample"] == 0
    assert tiered["bytes_per_sample"] == plain["bytes_per_sample"]
    with pytest.raises(ValueError, match="with hierarchical"):
        SimConfig(algorithm="crossover", group_every=1)


def test_the_inner_tier_off_changes_nothing(tmp_path):
    args = ["--peers", "16", "--rounds", "16", "--algorithm", "hierarchical", "--group-size", "4", "--model", "mlp",
            "--outer-every", "4", "--quiet", "--no-plot"]
    assert main([*args, "--out", str(tmp_path / "off")]) == 0
    assert main([*args, "--out", str(tmp_path / "zero"), "--group-every", "0"]) == 0
    assert main([*args, "--out", str(tmp_path / "on"), "--group-every", "1"]) == 0
    table = {k: (tmp_path / k / "hierarchical-16p-s0" / "rounds.csv").read_text() for k in ("off", "zero", "on")}
    assert table["off"] == table["zero"] != table["on"]
