"""The JSON form of the control API's replies: what `peerctl --json` prints and
what the daemon's page reads (docs/operations.md, "JSON output").

Field names as in the .proto and every field present, like proto3's JSON
mapping, but for scripts: integers of any width are JSON numbers (not strings),
and a value not known (NaN, ±inf, an unset message) is null, so the text is
strict JSON. Driven by the descriptors: a field added to a .proto follows the
same rules with no change here.
"""

from __future__ import annotations

import base64
import math
import struct

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

_FLOATS = (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT)


def message_json(message: Message) -> dict:
    return {field.name: _field_json(message, field) for field in message.DESCRIPTOR.fields}


def _field_json(message: Message, field: FieldDescriptor) -> object:
    value = getattr(message, field.name)
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        value_field = field.message_type.fields_by_name["value"]
        return {_map_key(k): _value_json(value_field, v) for k, v in value.items()}
    if field.is_repeated:
        return [_value_json(field, v) for v in value]
    if field.has_presence and not message.HasField(field.name):
        return None  # an unset message (or optional, or oneof member)
    return _value_json(field, value)


def _value_json(field: FieldDescriptor, value: object) -> object:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        if field.message_type.full_name.startswith("google.protobuf."):
            return MessageToDict(value)  # well-known types keep their own JSON forms
        return message_json(value)
    if field.type in _FLOATS:
        return _float_json(value, field.type == FieldDescriptor.TYPE_FLOAT)
    if field.type == FieldDescriptor.TYPE_ENUM:
        known = field.enum_type.values_by_number.get(value)
        return known.name if known is not None else value
    if field.type == FieldDescriptor.TYPE_BYTES:
        return base64.b64encode(value).decode("ascii")
    return value  # int of any width, bool, str


def _float_json(value: float, single: bool) -> float | None:
    if not math.isfinite(value):
        return None
    if single:  # a float32 widened to a double: print the shortest form it came from (0.1, not 0.10000000149)
        for digits in range(6, 10):
            short = float(f"{value:.{digits}g}")
            if struct.unpack("<f", struct.pack("<f", short))[0] == value:
                return short
    return value


def _map_key(key: object) -> str:
    return ("true" if key else "false") if isinstance(key, bool) else str(key)
