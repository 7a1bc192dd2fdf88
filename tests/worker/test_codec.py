"""The hand-written SegmentChunk codec is byte-for-byte protobuf."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peerd.proto.v1 import peer_pb2
from peerd.worker.wire.codec import decode_segment_chunk, encode_segment_chunk

u64 = st.integers(0, 2**64 - 1)
u32 = st.integers(0, 2**32 - 1)


@given(u64, u32, u64, u64, st.binary(max_size=64))
@settings(max_examples=300, deadline=None)
def test_encoding_equals_protobuf(round_, segment, offset, total, data):
    ours = encode_segment_chunk(round_, segment, offset, total, data)
    theirs = peer_pb2.SegmentChunk(round=round_, segment=segment, offset=offset, total=total, data=data)
    assert ours == theirs.SerializeToString()
    back = decode_segment_chunk(theirs.SerializeToString())
    assert (back.round, back.segment, back.offset, back.total, bytes(back.data)) == (
        round_, segment, offset, total, data)


def test_a_numpy_view_is_sent_as_its_bytes():
    values = np.arange(5, dtype="<f4")
    message = encode_segment_chunk(3, 1, 0, 5, values)
    assert peer_pb2.SegmentChunk.FromString(message).data == values.tobytes()
    assert np.array_equal(np.frombuffer(decode_segment_chunk(message).data, "<f4"), values)


def test_unknown_fields_from_a_newer_peer_are_skipped():
    message = peer_pb2.SegmentChunk(round=2, data=b"abcd").SerializeToString()
    newer = message + b"\x30\x07" + b"\x39" + bytes(8) + b"\x45" + bytes(4) + b"\x52\x02hi"  # fields 6, 7, 8, 10
    chunk = decode_segment_chunk(newer)
    assert chunk.round == 2 and bytes(chunk.data) == b"abcd"


@pytest.mark.parametrize("bad", [b"\x2a\x05ab", b"\x08", b"\x0b", b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"])
def test_malformed_messages_raise(bad):
    with pytest.raises(ValueError):
        decode_segment_chunk(bad)
