"""End to end: one agreed end (docs/algorithms.md, "One agreed end"). Members
reach the job's end on their own clocks; the first that does asks the others
for their final models, and a member still training ends at its next round
rather than train on alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import all_finished, first_jobs, round_of, wait_for, wait_for_discovery

pytestmark = pytest.mark.e2e

JOBCODE = str(Path(__file__).parents[1] / "jobcode")
SAMPLES = 2400  # ids_job's training set
EPOCHS = 5


def test_a_member_behind_ends_with_the_first_at_its_next_round(local_cluster, tmp_path, monkeypatch):
    """Shared data, 2 daemons, the second joins mid-chunk. A newcomer reads from
    the next chunk boundary on (docs/algorithms.md, "Data partition"), so the
    first member still holds the rest of the chunk under way at the join, alone:
    it reaches the end later than the newcomer by that many steps (up to a
    chunk's, 300 here). It ends at the newcomer's end instead."""
    reads = tmp_path / "reads"
    reads.mkdir()
    monkeypatch.setenv("PEERD_TEST_READ_LOG", str(reads))  # ids_job logs every sample it trains on
    # Steps of a few ms (slowdown 10 on both: equal speeds), so that the first
    # member is still in the job's first epochs when the second has started.
    cluster = local_cluster(2, slowdowns=(10.0, 10.0))
    wait_for_discovery(cluster, 60)
    text = ('[job]\nname = "oneend"\nmodule = "ids_job"\nmetric = "loss"\nlocal_batch = 4\n'
            f'epochs = {EPOCHS}\nepoch_chunks = 2\neval_every_rounds = 1000\n'
            '[optimizer]\nlr = 0.02\nschedule = "constant"\n')
    first, late = cluster.peers
    cluster.client(first).join(text, JOBCODE)
    wait_for(lambda: round_of(cluster, first) >= 50, 120, "the first member to train")
    cluster.client(late).join(text, JOBCODE)
    wait_for(lambda: round_of(cluster, late) > 0, 120, "the second member to join")
    at_join = round_of(cluster, first)
    print(f"one end: the second member joined at round {at_join}")
    assert at_join < 0.8 * EPOCHS * 600, "the job was nearly over at the join: make it longer"
    wait_for(lambda: all_finished(first_jobs(cluster)), 600, "both members to finish")

    jobs = [p.dir / "state" / "jobs" / "oneend" for p in cluster.peers]
    records = [json.loads((d / "model.json").read_text()) for d in jobs]
    logs = [(d / "worker.log").read_text() for d in jobs]
    rounds = [r["round"] for r in records]
    print(f"one end: rounds {rounds}, epochs {[round(r['progress'], 4) for r in records]}")
    assert all(sorted(r["consensus"]) == sorted(p.peer_id for p in cluster.peers) for r in records), records
    assert len({(d / "model.pt").read_bytes() for d in jobs}) == 1
    ended_early = [k for k, r in enumerate(records) if r["progress"] < EPOCHS]
    assert all("another member has reached the job's end" in logs[k] for k in ended_early), ended_early
    # Neither trained on alone to its own end: a member behind runs on only for the
    # rounds between its partner's last round and its partner's first ask (a few,
    # more on a busy machine), against the steps alone to its own end it would
    # have run without the ask (over a hundred here).
    for k in ended_early:
        alone = (EPOCHS - records[k]["progress"]) * SAMPLES / 4
        print(f"one end: member {k} ran {rounds[k] - min(rounds)} round(s) past the other's end, "
              f"against {alone:.0f} alone to its own")
        assert rounds[k] - min(rounds) <= max(5, alone / 4), (rounds, alone)
