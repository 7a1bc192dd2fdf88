"""Cutting the flat parameter vector into segments and chunks (docs/algorithms.md §1.1)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Span:
    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start


def split_even(total: int, parts: int) -> list[Span]:
    """`parts` contiguous spans covering range(total), sizes differing by ≤ 1.

    Boundaries may fall inside a tensor: segments are sized by bytes, not by
    layer, so every segment costs the same to send.
    """
    if parts < 1:
        raise ValueError(f"need at least one part, got {parts}")
    if total < parts:
        raise ValueError(f"cannot cut {total} elements into {parts} non-empty parts")
    bounds = [total * k // parts for k in range(parts + 1)]
    return [Span(a, b) for a, b in zip(bounds, bounds[1:])]


def chunk_spans(total: int, chunk: int) -> list[Span]:
    """Consecutive spans of at most `chunk` elements covering range(total)."""
    if chunk < 1:
        raise ValueError(f"chunk must be positive, got {chunk}")
    return [Span(a, min(a + chunk, total)) for a in range(0, total, chunk)]
