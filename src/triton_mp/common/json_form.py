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

_TRITON_ORDER = {
    "inference.ModelInstanceGroup": (
        "name", "kind", "count", "rate_limiter", "gpus", "secondary_devices", "profile",
        "passive", "host_policy",
    ),
    "inference.ModelOutput": (
        "name", "data_type", "dims", "reshape", "label_filename", "is_shape_tensor",
        "is_non_linear_format_io",
    ),
    "inference.ModelSequenceBatching": (
        "direct", "oldest", "max_sequence_idle_microseconds", "control_input", "state",
        "iterative_sequence",
    ),
    "inference.ModelSequenceBatching.Control": (
        "kind", "int32_false_true", "fp32_false_true", "bool_false_true", "data_type",
    ),
    "inference.ModelStatistics": (
        "name", "version", "last_inference", "inference_count", "execution_count",
        "inference_stats", "response_stats", "batch_stats", "memory_usage",
    ),
}  # fmt: skip
"""Member order where Triton's differs from ``protos/``' declaration order: upstream
``model_config.proto`` declares these fields in another order than ours (which follows the
field numbers), and core writes ModelStatistics' JSON by hand (``response_stats`` before
``batch_stats``)."""


def config_to_json(config: Message) -> dict[str, Any]:
    """Return Triton's JSON form of a ``ModelConfig`` (or any message) as a ``dict``.

    This is protobuf JSON with proto field names and every field without presence printed
    (``"max_batch_size": 0``, ``"input": []``, ``"platform": ""``), with int64/uint64 values
    turned back from JSON strings into numbers (core ModelConfigToJson). Map keys stay
    strings, as JSON requires. Unlike Triton, which fixes a hand-written list of fields (and
    misses e.g. ``sequence_batching.state.initial_state.dims``), every 64-bit field is fixed.
    Members come in the ``.proto``'s declaration order, as protobuf's C++ printer writes them
    (2.51's ``GET .../config``: ``name``, ``platform``, ``backend``, ``runtime``,
    ``version_policy``, ...; Python's printer puts set fields first).
    """
    raw: dict[str, Any] = json_format.MessageToDict(
        config,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )
    return _in_proto_order(config.DESCRIPTOR, raw)


def _in_proto_order(descriptor: Any, obj: dict[str, Any]) -> dict[str, Any]:
    """A MessageToDict result with its members in declaration order and its 64-bit integer
    strings as ints, nested messages too."""
    out: dict[str, Any] = {}
    order = _TRITON_ORDER.get(descriptor.full_name)
    fields = descriptor.fields if order is None else [descriptor.fields_by_name[n] for n in order]
    for field in fields:
        if field.name not in obj:
            continue
        value = obj[field.name]
        if _is_map(field):
            value_field = field.message_type.fields_by_name["value"]
            value = {k: _fix_value(value_field, item) for k, item in value.items()}
        elif field.is_repeated:
            value = [_fix_value(field, item) for item in value]
        else:
            value = _fix_value(field, value)
        out[field.name] = value
    return out


def _fix_value(field: FieldDescriptor, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_MESSAGE and isinstance(value, dict):
        return _in_proto_order(field.message_type, value)
    if field.type in _INT64_FIELD_TYPES and isinstance(value, str):
        return int(value)
    return value


def _is_map(field: FieldDescriptor) -> bool:
    message_type: Any = field.message_type
    return field.type == FieldDescriptor.TYPE_MESSAGE and bool(message_type.GetOptions().map_entry)
