"""Counters of the exchange for the metrics endpoint: bytes, kept outside the
transport and servers, and a histogram of exchange times.

`CountingTransport` wraps a Transport and counts what partners sent; the
`Counting*Server` wrappers count what this worker served. Only payload bytes
(fp32 values) are counted, not gRPC framing.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import aclosing

import torch

from peerd.core.segments import Span
from peerd.control.progress import EXCHANGE_BUCKETS_S
from peerd.worker.state.pull import StatePart
from peerd.worker.wire.values import stage_wire, wire_nbytes


class Traffic:
    def __init__(self) -> None:
        self.sent = 0
        self.received = 0
        self.last_asked = 0.0  # monotonic time of the last segment a partner asked for (a leave waits for quiet)


class ExchangeTimes:
    """Cumulative histogram of round exchange times over EXCHANGE_BUCKETS_S."""

    def __init__(self) -> None:
        self.buckets = [0] * len(EXCHANGE_BUCKETS_S)
        self.sum_s = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        self.sum_s += seconds
        self.count += 1
        for k, bound in enumerate(EXCHANGE_BUCKETS_S):
            if seconds <= bound:
                self.buckets[k] += 1


class CountingTransport:
    """Counts segments at their bytes in the job's wire dtype (as the serving side
    counts them; stage 3 in fp32) and state ranges at 4 bytes a value."""

    def __init__(self, inner, traffic: Traffic, wire: str = "fp32") -> None:
        self._inner = inner
        self._traffic = traffic
        self._wire = wire

    async def fetch_segment(
        self, address: str, round_: int, segment: int, out: torch.Tensor, timeout: float, stage: int = 0
    ) -> None:
        await self._inner.fetch_segment(address, round_, segment, out, timeout, stage)
        self._traffic.received += wire_nbytes(stage_wire(stage, self._wire), out.numel())

    async def fetch_state(self, address: str, span: Span, timeout: float) -> StatePart:
        part = await self._inner.fetch_state(address, span, timeout)
        self._traffic.received += part.values.numel() * part.values.element_size()
        return part

    async def aclose(self) -> None:
        await self._inner.aclose()


class CountingSegmentServer:
    def __init__(self, inner, traffic: Traffic) -> None:
        self._inner = inner
        self._traffic = traffic

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    async def segment(self, *args, **kwargs) -> AsyncIterator:
        self._traffic.last_asked = time.monotonic()
        # aclosing: a partner that goes away must release the snapshot at once.
        async with aclosing(self._inner.segment(*args, **kwargs)) as chunks:
            async for offset, total, data in chunks:
                self._traffic.sent += data.nbytes
                yield offset, total, data


class CountingStateServer:
    def __init__(self, inner, traffic: Traffic) -> None:
        self._inner = inner
        self._traffic = traffic

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    async def state(self, *args, **kwargs) -> AsyncIterator:
        async with aclosing(self._inner.state(*args, **kwargs)) as chunks:
            async for meta, offset, total, sha, data in chunks:
                self._traffic.sent += len(data)
                yield meta, offset, total, sha, data
