"""The JSON form of the control API's replies: what `peerctl --json` prints and
what the daemon's page reads (proto3's JSON mapping: field names as in the
.proto, every field present, 64-bit integers as strings, NaN as "NaN")."""

from __future__ import annotations

from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message


def message_json(message: Message) -> dict:
    return MessageToDict(message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
