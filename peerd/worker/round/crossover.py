"""One gossip round of flat Crossover-SGD (docs/algorithms.md §1.2, §1.4).

For every segment, fetch it from this round's source and set
θ[s] ← ½(θ[s] + θ_source[s]). Fetches run concurrently under one deadline; a
segment whose source misses it keeps this peer's own value.
"""

from __future__ import annotations

import asyncio
import time

from peerd.errors import NonFiniteAverage
from peerd.worker.round.context import RoundContext, RoundInputs
from peerd.worker.round.shared import RoundResult, average_pair, clip_pull, keep_own, record_failure, segment_gap


async def gossip_round(ctx: RoundContext, inputs: RoundInputs) -> RoundResult:
    """Average `vector` (this peer's state at the start of the round) with the
    plan's sources, segment by segment: in place, or into `out` (then `vector`
    is left as it was and `out` holds the whole new state on return)."""
    plan, addresses, layout, transport, b = inputs.plan, inputs.addresses, ctx.layout, ctx.transport, inputs.buffers
    vector, recv, out, deadline_s = b.vector, b.recv, b.out, b.deadline_s
    result = RoundResult(plan.round, plan.partners)
    started = time.monotonic()
    into = vector if out is None else out
    averaged: set[int] = set()

    gaps: list[float] = []

    async def fetch(s: int) -> None:
        span = layout[s]
        own, theirs = vector[span.start : span.stop], recv[span.start : span.stop]
        source = plan.sources[s]
        await transport.fetch_segment(addresses[source], plan.round, s, theirs, deadline_s)
        # Averaged as soon as it is here, while the next segment is still arriving
        # (no await below: a deadline cannot cut an average in half).
        gap = segment_gap(own, theirs)
        clipped = clip_pull(own, theirs, ctx.clipper) < 1.0
        if not average_pair(own, theirs, into[span.start : span.stop], plan.me < source):
            raise NonFiniteAverage(f"{source} sent non-finite values in segment {s}")
        result.reached.add(source)
        gaps.append(gap)
        result.clipped += clipped
        averaged.add(s)

    tasks = {asyncio.ensure_future(fetch(s)): s for s in range(len(layout))}
    try:
        done, pending = await asyncio.wait(tasks, timeout=deadline_s)
    except asyncio.CancelledError:  # the round given up (an overlapped round past its grace): no fetch outlives it
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)

    for task, s in tasks.items():
        exc = None if task in done and not task.cancelled() else TimeoutError("deadline")
        exc = exc or task.exception()
        if exc is not None:
            record_failure(result, plan.sources[s], plan.round, exc)
    if out is not None:
        keep_own(out, vector, layout, averaged)
    if gaps:
        result.disagreement = sum(gaps) / len(gaps)
    result.seconds = time.monotonic() - started
    return result
