"""peerd.core.segments: split_even and chunk_spans."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from peerd.core.segments import Span, chunk_spans, split_even

FAST = settings(max_examples=200, deadline=None)


def _assert_contiguous_cover(spans: list[Span], total: int) -> None:
    if total == 0:
        assert spans == []
        return
    assert spans[0].start == 0
    assert spans[-1].stop == total
    for a, b in zip(spans, spans[1:]):
        assert a.stop == b.start
    assert all(s.size > 0 for s in spans)
    assert sum(s.size for s in spans) == total


def test_span_size():
    assert Span(3, 10).size == 7
    assert Span(4, 4).size == 0


def test_span_is_frozen_and_comparable():
    assert Span(0, 5) == Span(0, 5)
    with pytest.raises(AttributeError):
        Span(0, 5).start = 1  # type: ignore[misc]


# -------------------------------------------------------------- split_even


@given(st.integers(min_value=1, max_value=10**12), st.data())
@FAST
def test_split_even_properties(total, data):
    parts = data.draw(st.integers(min_value=1, max_value=min(total, 500)))
    spans = split_even(total, parts)
    assert len(spans) == parts
    _assert_contiguous_cover(spans, total)
    sizes = [s.size for s in spans]
    assert max(sizes) - min(sizes) <= 1
    assert min(sizes) == total // parts


@given(st.integers(min_value=1, max_value=300), st.data())
@FAST
def test_split_even_covers_each_index_once(total, data):
    parts = data.draw(st.integers(min_value=1, max_value=total))
    counts = Counter(i for s in split_even(total, parts) for i in range(s.start, s.stop))
    assert counts == Counter(range(total))


def test_split_even_examples():
    assert split_even(10, 1) == [Span(0, 10)]
    assert split_even(10, 10) == [Span(i, i + 1) for i in range(10)]
    assert [s.size for s in split_even(10, 3)] in ([3, 3, 4], [3, 4, 3], [4, 3, 3])
    assert split_even(12, 4) == [Span(0, 3), Span(3, 6), Span(6, 9), Span(9, 12)]


@given(st.integers(min_value=1, max_value=10**6), st.integers(min_value=1, max_value=64))
@FAST
def test_split_even_deterministic(total, parts):
    assume(parts <= total)
    assert split_even(total, parts) == split_even(total, parts)


@pytest.mark.parametrize("parts", [0, -1, -100])
def test_split_even_rejects_no_parts(parts):
    with pytest.raises(ValueError):
        split_even(10, parts)


@pytest.mark.parametrize("total, parts", [(0, 1), (3, 4), (9, 10), (-1, 1)])
def test_split_even_rejects_too_few_elements(total, parts):
    with pytest.raises(ValueError):
        split_even(total, parts)


# ------------------------------------------------------------- chunk_spans


@given(st.integers(min_value=0, max_value=10**9), st.integers(min_value=1, max_value=10**8))
@FAST
def test_chunk_spans_properties(total, chunk):
    assume(total // chunk <= 2000)
    spans = chunk_spans(total, chunk)
    _assert_contiguous_cover(spans, total)
    assert len(spans) == -(-total // chunk)
    assert all(s.size <= chunk for s in spans)
    # Only the last chunk may be short.
    assert all(s.size == chunk for s in spans[:-1])


@given(st.integers(min_value=0, max_value=300), st.integers(min_value=1, max_value=50))
@FAST
def test_chunk_spans_cover_each_index_once(total, chunk):
    counts = Counter(i for s in chunk_spans(total, chunk) for i in range(s.start, s.stop))
    assert counts == Counter(range(total))


def test_chunk_spans_examples():
    assert chunk_spans(0, 4) == []
    assert chunk_spans(3, 4) == [Span(0, 3)]
    assert chunk_spans(8, 4) == [Span(0, 4), Span(4, 8)]
    assert chunk_spans(9, 4) == [Span(0, 4), Span(4, 8), Span(8, 9)]
    assert chunk_spans(5, 1) == [Span(i, i + 1) for i in range(5)]


@pytest.mark.parametrize("chunk", [0, -1, -64])
def test_chunk_spans_rejects_non_positive_chunk(chunk):
    with pytest.raises(ValueError):
        chunk_spans(10, chunk)


@given(st.integers(min_value=1, max_value=5000), st.integers(min_value=1, max_value=50), st.data())
@FAST
def test_chunks_of_segments_tile_the_vector(total, parts, data):
    # The way the exchange uses them: segments, each cut into chunks, tile the
    # whole vector exactly once.
    assume(parts <= total)
    chunk = data.draw(st.integers(min_value=1, max_value=total))
    covered = []
    for seg in split_even(total, parts):
        for c in chunk_spans(seg.size, chunk):
            covered.append(Span(seg.start + c.start, seg.start + c.stop))
    _assert_contiguous_cover(covered, total)
