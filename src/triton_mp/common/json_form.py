"""Triton's JSON form of a protobuf message (core ``ModelConfigToJson``).

Imported by the model-config planner (a version spec carries its config as this JSON), the
python backend's auto-complete (``auto_complete_config`` sees it) and the HTTP frontend
(``GET .../config`` and the other JSON answers that print defaults). It lives below all of
them because each of those layers needs it and none may import the others.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

__all__ = ["config_to_json"]

_INT64_FIELD_TYPES = frozenset(
    {
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
    }
)


def config_to_json(config: Message) -> dict[str, Any]:
    """Return Triton's JSON form of a ``ModelConfig`` (or any message) as a ``dict``.

    This is protobuf JSON with proto field names and every field without presence printed
    (``"max_batch_size": 0``, ``"input": []``, ``"platform": ""``), with int64/uint64 values
    turned back from JSON strings into numbers (core ModelConfigToJson). Map keys stay
    strings, as JSON requires. Unlike Triton, which fixes a hand-written list of fields (and
    misses e.g. ``sequence_batching.state.initial_state.dims``), every 64-bit field is fixed.
    """
    raw: dict[str, Any] = json_format.MessageToDict(
        config,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )
    _ints_from_strings(config.DESCRIPTOR, raw)
    return raw


def _ints_from_strings(descriptor: Any, obj: dict[str, Any]) -> None:
    """Rewrite, in place, the 64-bit integer strings of a MessageToDict result as ints."""
    for key, value in obj.items():
        field = descriptor.fields_by_name.get(key)
        if field is None:
            continue
        if _is_map(field):
            value_field = field.message_type.fields_by_name["value"]
            for map_key, item in value.items():
                value[map_key] = _fix_value(value_field, item)
        elif field.is_repeated:
            obj[key] = [_fix_value(field, item) for item in value]
        else:
            obj[key] = _fix_value(field, value)


def _fix_value(field: FieldDescriptor, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_MESSAGE and isinstance(value, dict):
        _ints_from_strings(field.message_type, value)
        return value
    if field.type in _INT64_FIELD_TYPES and isinstance(value, str):
        return int(value)
    return value


def _is_map(field: FieldDescriptor) -> bool:
    message_type: Any = field.message_type
    return field.type == FieldDescriptor.TYPE_MESSAGE and bool(message_type.GetOptions().map_entry)
