"""Daemons in one event loop, relaying (a realm larger than full_mesh_max): few
Hellos per interval, records passed on second-hand, a dead daemon dropped from
every view, a restarted one taking its old record's place."""

from __future__ import annotations

import asyncio

from peerd.daemon.app import Daemon

from conftest import daemon_config, until

RELAY = dict(full_mesh_max=2, fanout=1)


def complete(ds) -> bool:
    return all({r.peer_id for r in d.membership.peers()} == {o.peer_id for o in ds if o is not d} for d in ds)


async def test_a_realm_larger_than_a_full_mesh_hellos_fanout_peers_an_interval_and_fills_every_view(daemons):
    ds = [await daemons(f"d{i}", **RELAY) for i in range(5)]
    await until(lambda: complete(ds), "every view to hold the other 4")
    assert all(d.hello.relaying for d in ds)
    before = [(d.hello.rounds, d.hello.round_hellos) for d in ds]
    await asyncio.sleep(1.0)  # about 5 Hello rounds
    for d, (rounds, hellos) in zip(ds, before):
        assert d.hello.rounds > rounds
        assert d.hello.round_hellos - hellos <= d.hello.rounds - rounds  # fanout 1: one Hello a round
    assert complete(ds)
    assert all(r.incarnation == o.hello.records.incarnation for d in ds for r in d.membership.peers()
               for o in ds if o.peer_id == r.peer_id)


async def test_a_small_realm_stays_a_full_mesh(daemons):
    ds = [await daemons(f"d{i}") for i in range(3)]  # full_mesh_max 8
    await until(lambda: complete(ds), "every view to hold the other 2")
    assert not any(d.hello.relaying for d in ds)
    rounds, hellos = ds[0].hello.rounds, ds[0].hello.round_hellos
    await asyncio.sleep(0.6)
    assert ds[0].hello.round_hellos - hellos >= 2 * (ds[0].hello.rounds - rounds) > 0  # each peer, each round


async def test_a_record_reaches_a_daemon_second_hand_and_a_dead_daemon_leaves_every_view(daemons, tmp_path):
    """alpha advertises a job and dies without a goodbye (no zeroconf) before gamma
    starts: gamma can only have its record second-hand, from beta. Then both drop it."""
    from peerd.daemon.jobs import LocalJob, RestartPolicy, WorkerLaunch
    from peerd.settings.jobspec import parse_job
    from peerd.proto.v1 import control_pb2

    from conftest import example_job

    quiet = dict(zeroconf=False, peer_timeout_s=3.0, **RELAY)
    b = await daemons("beta", **quiet)
    a = Daemon(daemon_config(tmp_path, "alpha", seeds=(b.peer_address,), **quiet))
    await a.start()
    try:
        spec = parse_job(example_job(job={"name": "told"}), "test")
        launch = WorkerLaunch("unix:/nowhere", "alpha", "127.0.0.1", 1, tmp_path / "job.toml", "", tmp_path / "w.log")
        a.jobs[spec.name] = LocalJob.create(spec, tmp_path, [launch], RestartPolicy(1.0, 1.0))
        a.worker_heartbeat(control_pb2.WorkerReport(job=spec.name, pid=1, address="127.0.0.1:9", fingerprint="f"))
        await until(lambda: b.membership.job_view(spec.name, spec.fingerprint) == [("alpha", "127.0.0.1:9")],
                    "beta to see alpha serving the job")
    finally:
        a.jobs.clear()
        await a.aclose()
    c = await daemons("gamma", seeds=(b.peer_address,), **quiet)
    await until(lambda: c.membership.job_view(spec.name, spec.fingerprint) == [("alpha", "127.0.0.1:9")],
                "gamma to hear of alpha's job from beta")
    assert c.hello.answered.get("alpha", 0) == 0  # never from alpha itself
    await until(lambda: b.membership.get("alpha") is None and c.membership.get("alpha") is None,
                "alpha to leave every view")
    await asyncio.sleep(1.0)  # beta and gamma keep relaying: alpha must not come back
    assert b.membership.get("alpha") is None and c.membership.get("alpha") is None
    assert c.membership.get("beta") and b.membership.get("gamma")


async def test_a_restarted_daemon_replaces_its_old_record_in_every_view(daemons, tmp_path):
    ds = [await daemons(f"d{i}", **RELAY) for i in range(3)]
    old = Daemon(daemon_config(tmp_path, "again", **RELAY))
    await old.start()
    await until(lambda: complete([*ds, old]), "every view to hold the other 3")
    first = old.hello.records.incarnation
    await old.aclose()
    new = await daemons("again", **RELAY)
    assert new.hello.records.incarnation > first and new.peer_address != old.peer_address
    await until(lambda: all((r := d.membership.get("again")) and r.incarnation == new.hello.records.incarnation
                            and r.address == new.peer_address for d in ds), "every view to hold the new start")
    await asyncio.sleep(1.0)  # stale records of the old start must not win it back
    assert all(d.membership.get("again").address == new.peer_address for d in ds)
