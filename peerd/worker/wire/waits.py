"""Waiting on a store's condition with a bound (the stores, the final store)."""

from __future__ import annotations

import asyncio


async def wait_until(changed: asyncio.Condition, predicate, wait_s: float) -> None:
    """Wait (holding `changed`) until predicate() or wait_s passed, whichever is first.

    asyncio.timeout, not wait_for: wait_for runs the wait in another task, and a
    caller cancelled (a gRPC client giving up) while that task re-acquires the lock
    left the `async with` without it ("Lock is not acquired"), after which the task
    took the lock for good and the worker hung at its next publish (seen under load
    in bench/dbs.py and by the soak harness; tests/worker/test_snapshot_locks.py). In one
    task, Condition.wait re-acquires before anything leaves."""
    try:
        async with asyncio.timeout(max(wait_s, 0.0)):
            await changed.wait_for(predicate)
    except TimeoutError:
        pass
