"""Shared fixtures: real local clusters of peerd daemons on 127.0.0.1."""

from __future__ import annotations

import asyncio
import time
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest

from peerd.cluster import LocalCluster, default_job

REPO = Path(__file__).resolve().parents[1]


def example_job(**tables: dict[str, object]) -> str:
    """The built-in job's text with values replaced, e.g. example_job(job={"epochs": 2})."""
    data = tomllib.loads(default_job().read_text())
    for table, values in tables.items():
        data.setdefault(table, {}).update(values)
    return "".join(
        f"[{table}]\n" + "".join(f"{k} = {_toml_value(v)}\n" for k, v in values.items()) + "\n"
        for table, values in data.items()
    )


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value)


def wait_for(predicate: Callable[[], object], timeout_s: float, what: str, interval_s: float = 0.25):
    """Poll until predicate() is truthy; fail the test with `what` on timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(interval_s)


async def until(predicate: Callable[[], object], timeout_s: float = 20.0) -> None:
    """The in-process twin of wait_for: poll without blocking the event loop."""
    async def poll():
        while not predicate():
            await asyncio.sleep(0.05)

    await asyncio.wait_for(poll(), timeout_s)


@pytest.fixture
def local_cluster(tmp_path):
    """Factory: start n daemons; all are stopped (by PID) when the test ends."""
    clusters: list[LocalCluster] = []

    def start(n: int, **options) -> LocalCluster:
        cluster = LocalCluster(n, tmp_path / f"cluster-{len(clusters)}", **options).__enter__()
        clusters.append(cluster)
        cluster.wait_ready()
        return cluster

    yield start
    for cluster in clusters:
        cluster.close()
        for peer in cluster.peers:
            assert peer.process.poll() is not None, f"{peer.peer_id} still running"
