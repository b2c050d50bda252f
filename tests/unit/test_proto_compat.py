"""Wire compatibility of our generated `inference` protos with Triton's, as shipped in tritonclient.

Our messages live in a private descriptor pool (see scripts/gen_protos.py), so tritonclient's
classes and ours are distinct and both import in one process. Compatibility is shown three ways:

* descriptors: every message, enum and RPC of tritonclient's model_config.proto and
  grpc_service.proto exists in ours under the same full name with the same fields
  (name, number, type, repeated-ness, oneof, message/enum type) and values;
* bytes: hand-built rich messages and exhaustively populated instances of *every* message type
  are serialised with one side, parsed with the other and compared (bytes, dict, text format);
* process: both module sets import in either order under the upb and the pure-Python runtimes.

Imported by pytest only; starts one short subprocess per import-order case.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest
from google.protobuf import descriptor as pb_descriptor
from google.protobuf import descriptor_pool, json_format, text_format
from google.protobuf.internal import api_implementation
from google.protobuf.message import Message

from triton_mp._proto import (
    _pool,
    grpc_service_pb2,
    grpc_service_pb2_grpc,
    health_pb2,
    health_pb2_grpc,
    model_config_pb2,
)
from triton_mp.common.json_form import config_to_json

tc_service = pytest.importorskip("tritonclient.grpc.service_pb2")
tc_config = pytest.importorskip("tritonclient.grpc.model_config_pb2")

from tests.helpers.rich_protos import (  # noqa: E402  (after the importorskips)
    CONFIG_COMMON,
    CONFIG_SCHEDULERS,
    infer_request,
    infer_response,
    metadata_response,
    misc_messages,
    rich_config,
    statistics_response,
    stream_error,
    stream_response,
)

FieldDescriptor = pb_descriptor.FieldDescriptor


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


def _ours_for(theirs_cls: type[Message]) -> type[Message]:
    """Our generated class with the same full name as tritonclient's ``theirs_cls``."""
    full_name = theirs_cls.DESCRIPTOR.full_name
    for module in (grpc_service_pb2, model_config_pb2):
        obj: Any = module
        parts = full_name.split(".")[1:]
        try:
            for part in parts:
                obj = getattr(obj, part)
        except AttributeError:
            continue
        if isinstance(obj, type) and issubclass(obj, Message):
            return obj
    raise AssertionError(f"no generated class for {full_name}")


def _as_dict(msg: Message) -> dict[str, Any]:
    return json_format.MessageToDict(msg, preserving_proto_field_name=True)


def _assert_same_wire(theirs: Message, ours_cls: type[Message]) -> Message:
    """Theirs -> bytes -> ours -> bytes -> theirs, comparing everything on the way."""
    wire = theirs.SerializeToString(deterministic=True)
    ours = ours_cls.FromString(wire)
    assert ours.SerializeToString(deterministic=True) == wire
    assert _as_dict(ours) == _as_dict(theirs)
    assert text_format.MessageToString(ours) == text_format.MessageToString(theirs)
    back = type(theirs).FromString(ours.SerializeToString())
    assert back == theirs
    return ours


def _assert_same_wire_from_ours(ours: Message, theirs_cls: type[Message]) -> None:
    """Ours -> bytes -> theirs -> bytes -> ours."""
    wire = ours.SerializeToString(deterministic=True)
    theirs = theirs_cls.FromString(wire)
    assert theirs.SerializeToString(deterministic=True) == wire
    assert _as_dict(theirs) == _as_dict(ours)
    assert type(ours).FromString(theirs.SerializeToString()) == ours


# ---------------------------------------------------------------------------------------------
# descriptors
# ---------------------------------------------------------------------------------------------


def _walk_messages(
    containers: Iterator[pb_descriptor.Descriptor],
) -> Iterator[pb_descriptor.Descriptor]:
    for desc in containers:
        yield desc
        yield from _walk_messages(iter(desc.nested_types))


def _all_messages(file_desc: pb_descriptor.FileDescriptor) -> list[pb_descriptor.Descriptor]:
    return list(_walk_messages(iter(file_desc.message_types_by_name.values())))


def _all_enums(file_desc: pb_descriptor.FileDescriptor) -> list[pb_descriptor.EnumDescriptor]:
    enums = list(file_desc.enum_types_by_name.values())
    for msg in _all_messages(file_desc):
        enums.extend(msg.enum_types)
    return enums


def _field_signature(field: pb_descriptor.FieldDescriptor) -> tuple[object, ...]:
    type_name = ""
    if field.message_type is not None:
        type_name = field.message_type.full_name
    elif field.enum_type is not None:
        type_name = field.enum_type.full_name
    oneof = field.containing_oneof.name if field.containing_oneof is not None else None
    return (field.name, field.number, field.type, field.is_repeated, type_name, oneof)


def _message_signature(desc: pb_descriptor.Descriptor) -> dict[str, object]:
    return {
        "fields": sorted(_field_signature(f) for f in desc.fields),
        "oneofs": sorted((o.name, sorted(f.name for f in o.fields)) for o in desc.oneofs),
        "map_entry": desc.GetOptions().map_entry,
        "nested": sorted(n.name for n in desc.nested_types),
        "enums": sorted(e.name for e in desc.enum_types),
    }


THEIR_FILES = [
    pytest.param(tc_config.DESCRIPTOR, model_config_pb2.DESCRIPTOR, id="model_config.proto"),
    pytest.param(tc_service.DESCRIPTOR, grpc_service_pb2.DESCRIPTOR, id="grpc_service.proto"),
]


@pytest.mark.parametrize(("theirs", "ours"), THEIR_FILES)
def test_file_identity(
    theirs: pb_descriptor.FileDescriptor, ours: pb_descriptor.FileDescriptor
) -> None:
    assert ours.name == theirs.name
    assert ours.package == theirs.package == "inference"
    assert [d.name for d in ours.dependencies] == [d.name for d in theirs.dependencies]
    assert ours.pool is _pool.POOL


def test_private_pool_keeps_tritonclient_apart() -> None:
    """Our descriptors never enter protobuf's default pool, so tritonclient's stay separate.

    NOTE: under the pure-Python runtime (PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python) protobuf's
    builder mirrors every generated file into the default pool by name; if ours are imported
    first, tritonclient's modules then reuse our (field-for-field identical) descriptors and
    classes. That is harmless and checked by test_both_module_sets_import_in_one_process; the
    separation asserted here is what the default upb runtime gives.
    """
    assert model_config_pb2.DESCRIPTOR.pool is _pool.POOL
    assert grpc_service_pb2.DESCRIPTOR.pool is _pool.POOL
    assert health_pb2.DESCRIPTOR.pool is _pool.POOL
    if api_implementation.Type() == "python":
        pytest.skip("pure-Python protobuf runtime shares classes by file name (see docstring)")
    assert tc_config.DESCRIPTOR.pool is descriptor_pool.Default()
    assert model_config_pb2.ModelConfig is not tc_config.ModelConfig
    assert grpc_service_pb2.ModelInferRequest is not tc_service.ModelInferRequest


@pytest.mark.parametrize(("theirs", "ours"), THEIR_FILES)
def test_same_message_names(
    theirs: pb_descriptor.FileDescriptor, ours: pb_descriptor.FileDescriptor
) -> None:
    their_names = {d.full_name for d in _all_messages(theirs)}
    our_names = {d.full_name for d in _all_messages(ours)}
    assert sorted(their_names - our_names) == [], "messages we lack"
    assert sorted(our_names - their_names) == [], "messages Triton does not have"


@pytest.mark.parametrize(("theirs", "ours"), THEIR_FILES)
def test_every_message_has_the_same_fields(
    theirs: pb_descriptor.FileDescriptor, ours: pb_descriptor.FileDescriptor
) -> None:
    for their_msg in _all_messages(theirs):
        our_msg = _pool.POOL.FindMessageTypeByName(their_msg.full_name)
        assert our_msg.file.name == theirs.name, their_msg.full_name
        assert _message_signature(our_msg) == _message_signature(their_msg), their_msg.full_name


@pytest.mark.parametrize(("theirs", "ours"), THEIR_FILES)
def test_every_enum_has_the_same_values(
    theirs: pb_descriptor.FileDescriptor, ours: pb_descriptor.FileDescriptor
) -> None:
    their_enums = {e.full_name: e for e in _all_enums(theirs)}
    our_enums = {e.full_name: e for e in _all_enums(ours)}
    assert sorted(our_enums) == sorted(their_enums)
    for name, their_enum in their_enums.items():
        ours_values = [(v.name, v.number) for v in our_enums[name].values]
        assert ours_values == [(v.name, v.number) for v in their_enum.values], name


def test_service_matches() -> None:
    theirs = tc_service.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    ours = grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert ours.full_name == theirs.full_name == "inference.GRPCInferenceService"

    def methods(svc: pb_descriptor.ServiceDescriptor) -> dict[str, tuple[object, ...]]:
        return {
            m.name: (
                m.input_type.full_name,
                m.output_type.full_name,
                m.client_streaming,
                m.server_streaming,
            )
            for m in svc.methods
        }

    assert methods(ours) == methods(theirs)
    assert len(ours.methods) == 20


class _RecordingChannel:
    """Stands in for grpc.Channel: records which multicallable kind each method path asks for."""

    def __init__(self) -> None:
        self.calls: dict[str, str] = {}

    def _record(self, kind: str) -> Callable[..., object]:
        def make(path: str, **_: object) -> object:
            self.calls[path] = kind
            return object()

        return make

    def __getattr__(self, kind: str) -> Callable[..., object]:
        if kind in ("unary_unary", "unary_stream", "stream_unary", "stream_stream"):
            return self._record(kind)
        raise AttributeError(kind)


def test_generated_stub_paths_and_kinds() -> None:
    channel = _RecordingChannel()
    grpc_service_pb2_grpc.GRPCInferenceServiceStub(channel)
    expected = {
        f"/inference.GRPCInferenceService/{m.name}": (
            "stream_stream" if m.client_streaming else "unary_unary"
        )
        for m in tc_service.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods
    }
    assert channel.calls == expected

    health_channel = _RecordingChannel()
    health_pb2_grpc.HealthStub(health_channel)
    assert health_channel.calls == {"/grpc.health.v1.Health/Check": "unary_unary"}


def test_servicer_base_has_every_rpc() -> None:
    servicer = grpc_service_pb2_grpc.GRPCInferenceServiceServicer
    for method in grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
        assert callable(getattr(servicer, method.name)), method.name
    assert callable(grpc_service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server)
    assert callable(health_pb2_grpc.add_HealthServicer_to_server)


def test_health_proto() -> None:
    assert health_pb2.DESCRIPTOR.package == "grpc.health.v1"
    request = health_pb2.HealthCheckRequest.DESCRIPTOR
    response = health_pb2.HealthCheckResponse.DESCRIPTOR
    assert request.full_name == "grpc.health.v1.HealthCheckRequest"
    assert [(f.name, f.number, f.type) for f in request.fields] == [
        ("service", 1, FieldDescriptor.TYPE_STRING)
    ]
    status = response.fields_by_name["status"]
    assert (status.number, status.enum_type.full_name) == (
        1,
        "grpc.health.v1.HealthCheckResponse.ServingStatus",
    )
    assert [(v.name, v.number) for v in status.enum_type.values] == [
        ("UNKNOWN", 0),
        ("SERVING", 1),
        ("NOT_SERVING", 2),
        ("SERVICE_UNKNOWN", 3),
    ]
    # Standard wire form: field 1, varint 1.
    assert health_pb2.HealthCheckResponse(status=1).SerializeToString() == b"\x08\x01"
    method = health_pb2.DESCRIPTOR.services_by_name["Health"].methods_by_name["Check"]
    assert method.full_name == "grpc.health.v1.Health.Check"
    assert not method.client_streaming
    assert not method.server_streaming


# ---------------------------------------------------------------------------------------------
# hand-built rich messages
# ---------------------------------------------------------------------------------------------
RICH_CASES: list[Any] = [
    pytest.param(infer_request, id="ModelInferRequest"),
    pytest.param(infer_response, id="ModelInferResponse"),
    pytest.param(stream_response, id="ModelStreamInferResponse"),
    pytest.param(stream_error, id="ModelStreamInferResponse-error"),
    *(pytest.param(lambda s=s: rich_config(s), id=f"ModelConfig-{s}") for s in CONFIG_SCHEDULERS),
    pytest.param(metadata_response, id="ModelMetadataResponse"),
    pytest.param(statistics_response, id="ModelStatisticsResponse"),
    *(
        pytest.param(lambda m=m: m, id=f"misc-{m.DESCRIPTOR.name}-{i}")
        for i, m in enumerate(misc_messages())
    ),
]


@pytest.mark.parametrize("build", RICH_CASES)
def test_rich_message_round_trip(build: Callable[[], Message]) -> None:
    theirs = build()
    assert theirs.ByteSize() > 0
    ours = _assert_same_wire(theirs, _ours_for(type(theirs)))
    _assert_same_wire_from_ours(ours, type(theirs))


def test_rich_config_sets_what_it_claims() -> None:
    """Guard the fixtures: the rich configs really populate the scheduler oneof and deep maps."""
    ours = _assert_same_wire(rich_config("dynamic"), model_config_pb2.ModelConfig)
    assert isinstance(ours, model_config_pb2.ModelConfig)
    assert ours.WhichOneof("scheduling_choice") == "dynamic_batching"
    assert ours.dynamic_batching.priority_queue_policy[4294967296].default_timeout_microseconds == 5
    graph_spec = ours.optimization.cuda.graph_spec[0]
    assert list(graph_spec.graph_lower_bound.input["INPUT0"].dim) == [3, 100, 100]
    assert ours.version_policy.specific.versions[-1] == 2**63 - 1
    assert ours.parameters["empty"].string_value == ""

    seq = _assert_same_wire(rich_config("sequence_oldest"), model_config_pb2.ModelConfig)
    assert isinstance(seq, model_config_pb2.ModelConfig)
    assert seq.sequence_batching.WhichOneof("strategy_choice") == "oldest"
    kinds = [ci.control[0].kind for ci in seq.sequence_batching.control_input]
    assert kinds == [
        model_config_pb2.ModelSequenceBatching.Control.CONTROL_SEQUENCE_START,
        model_config_pb2.ModelSequenceBatching.Control.CONTROL_SEQUENCE_READY,
        model_config_pb2.ModelSequenceBatching.Control.CONTROL_SEQUENCE_END,
        model_config_pb2.ModelSequenceBatching.Control.CONTROL_SEQUENCE_CORRID,
    ]
    initial = seq.sequence_batching.state[0].initial_state
    assert [s.WhichOneof("state_data") for s in initial] == ["zero_data", "data_file"]


def test_text_format_parses_identically() -> None:
    """config.pbtxt text parsed by ours and by tritonclient gives the same bytes."""
    for scheduler in CONFIG_SCHEDULERS:
        text = CONFIG_COMMON + CONFIG_SCHEDULERS[scheduler]
        ours = text_format.Parse(text, model_config_pb2.ModelConfig())
        theirs = text_format.Parse(text, tc_config.ModelConfig())
        assert ours.SerializeToString(deterministic=True) == theirs.SerializeToString(
            deterministic=True
        ), scheduler


def test_json_round_trip_across_implementations() -> None:
    """The HTTP/JSON form (ModelConfig endpoint, load `config` parameter) is interchangeable."""
    theirs = rich_config("ensemble")
    text = json_format.MessageToJson(theirs, preserving_proto_field_name=True)
    ours = json_format.Parse(text, model_config_pb2.ModelConfig())
    assert ours.SerializeToString(deterministic=True) == theirs.SerializeToString(
        deterministic=True
    )


# ---------------------------------------------------------------------------------------------
# every message type, every field populated
# ---------------------------------------------------------------------------------------------

_SCALAR_SAMPLES: dict[int, list[object]] = {
    FieldDescriptor.TYPE_DOUBLE: [-2.5, 1e-300],
    FieldDescriptor.TYPE_FLOAT: [1.5, -0.0625],
    FieldDescriptor.TYPE_INT64: [-(2**63), 2**40 + 1],
    FieldDescriptor.TYPE_UINT64: [2**64 - 1, 300],
    FieldDescriptor.TYPE_INT32: [-(2**31), 2**31 - 1],
    FieldDescriptor.TYPE_FIXED64: [2**64 - 1, 1],
    FieldDescriptor.TYPE_FIXED32: [2**32 - 1, 1],
    FieldDescriptor.TYPE_BOOL: [True, True],
    FieldDescriptor.TYPE_STRING: ["s\u00e9", "second"],
    FieldDescriptor.TYPE_BYTES: [b"\x00\xff\x80", b"b"],
    FieldDescriptor.TYPE_UINT32: [2**32 - 1, 5],
    FieldDescriptor.TYPE_SFIXED32: [-(2**31), 2],
    FieldDescriptor.TYPE_SFIXED64: [-(2**63), 3],
    FieldDescriptor.TYPE_SINT32: [-(2**31), 4],
    FieldDescriptor.TYPE_SINT64: [-(2**63), 6],
}


def _sample(field: pb_descriptor.FieldDescriptor, index: int) -> object:
    if field.type == FieldDescriptor.TYPE_ENUM:
        # NOTE: a proto3 enum at 0 is not serialised, so prefer the non-zero values.
        numbers = [v.number for v in field.enum_type.values if v.number != 0] or [0]
        return numbers[-1 - index % len(numbers)]
    return _SCALAR_SAMPLES[field.type][index % 2]


def _populate(msg: Message, variant: int, depth: int = 0) -> None:
    """Set every field of ``msg`` (recursively); ``variant`` picks the member of each oneof."""
    assert depth < 12, f"unexpectedly deep nesting at {msg.DESCRIPTOR.full_name}"
    desc = msg.DESCRIPTOR
    chosen = {oneof.name: oneof.fields[variant % len(oneof.fields)].name for oneof in desc.oneofs}
    for field in desc.fields:
        oneof = field.containing_oneof
        if oneof is not None and chosen[oneof.name] != field.name:
            continue
        value = getattr(msg, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            key_field = field.message_type.fields_by_name["key"]
            value_field = field.message_type.fields_by_name["value"]
            for i in range(2):
                key = _sample(key_field, i)
                if value_field.message_type is not None:
                    _populate(value[key], variant + i, depth + 1)
                else:
                    value[key] = _sample(value_field, i)
        elif field.is_repeated:
            for i in range(2):
                if field.message_type is not None:
                    _populate(value.add(), variant + i, depth + 1)
                else:
                    value.append(_sample(field, i))
        elif field.message_type is not None:
            value.SetInParent()
            _populate(value, variant, depth + 1)
        else:
            setattr(msg, field.name, _sample(field, variant))


def _assert_every_field_set(msg: Message) -> None:
    """Guard for _populate: every field (one per oneof) is present on the wire."""
    desc = msg.DESCRIPTOR
    present = {field.name for field, _ in msg.ListFields()}
    for field in desc.fields:
        oneof = field.containing_oneof
        if oneof is not None and msg.WhichOneof(oneof.name) != field.name:
            continue
        zero_enum = (
            field.type == FieldDescriptor.TYPE_ENUM
            and not field.is_repeated
            and len(field.enum_type.values) == 1
        )
        assert field.name in present or zero_enum, f"{desc.full_name}.{field.name} not set"
    assert all(msg.WhichOneof(o.name) is not None for o in desc.oneofs), desc.full_name


def _their_classes() -> Iterator[tuple[str, type[Message]]]:
    for module in (tc_config, tc_service):
        for desc in _all_messages(module.DESCRIPTOR):
            if desc.GetOptions().map_entry:
                continue
            obj: Any = module
            for part in desc.full_name.split(".")[1:]:
                obj = getattr(obj, part)
            yield desc.full_name, obj


ALL_MESSAGE_CASES = [pytest.param(cls, id=name) for name, cls in _their_classes()]


@pytest.mark.parametrize("theirs_cls", ALL_MESSAGE_CASES)
def test_every_message_fully_populated_round_trips(theirs_cls: type[Message]) -> None:
    desc = theirs_cls.DESCRIPTOR
    variants = max([len(o.fields) for o in desc.oneofs] + [2])
    ours_cls = _ours_for(theirs_cls)
    for variant in range(variants):
        theirs = theirs_cls()
        _populate(theirs, variant)
        _assert_every_field_set(theirs)
        ours = _assert_same_wire(theirs, ours_cls)
        _assert_same_wire_from_ours(ours, theirs_cls)
        # and built natively on our side, the same population gives the same bytes
        native = ours_cls()
        _populate(native, variant)
        assert native.SerializeToString(deterministic=True) == theirs.SerializeToString(
            deterministic=True
        )


# ---------------------------------------------------------------------------------------------
# one process, both module sets, any order, any protobuf runtime
# ---------------------------------------------------------------------------------------------

_IMPORT_BOTH = textwrap.dedent(
    """
    import sys, warnings
    warnings.simplefilter("error")
    def ours():
        from triton_mp._proto import (
            grpc_service_pb2, grpc_service_pb2_grpc, health_pb2, health_pb2_grpc, model_config_pb2,
        )
        return grpc_service_pb2, model_config_pb2
    def theirs():
        import tritonclient.grpc
        from tritonclient.grpc import service_pb2, model_config_pb2
        return service_pb2, model_config_pb2
    if sys.argv[1] == "ours-first":
        o = ours(); t = theirs()
    else:
        t = theirs(); o = ours()
    req = t[0].ModelInferRequest(model_name="m")
    req.parameters["p"].uint64_param = 5
    back = o[0].ModelInferRequest.FromString(req.SerializeToString())
    assert back.parameters["p"].uint64_param == 5, back
    cfg = o[1].ModelConfig(name="x", max_batch_size=4)
    assert t[1].ModelConfig.FromString(cfg.SerializeToString()).max_batch_size == 4
    from google.protobuf.internal import api_implementation
    print(api_implementation.Type())
    """
)


@pytest.mark.parametrize("implementation", ["upb", "python"])
@pytest.mark.parametrize("order", ["ours-first", "theirs-first"])
def test_both_module_sets_import_in_one_process(implementation: str, order: str) -> None:
    env = {"PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": implementation}
    result = subprocess.run(
        [sys.executable, "-c", _IMPORT_BOTH, order],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == implementation


def _module_names(module: ModuleType) -> set[str]:
    return {name for name in dir(module) if not name.startswith("_")}


def test_module_surface_matches_tritonclient() -> None:
    """Public names (message classes, enum wrappers, enum values) are the same as tritonclient's."""
    assert _module_names(tc_config) <= _module_names(model_config_pb2)
    assert _module_names(tc_service) <= _module_names(grpc_service_pb2)


def _members_in_upstream_order(descriptor: Any, obj: object, path: str) -> list[str]:
    """The paths of ``obj``'s dicts (a config's JSON) whose members are not in the order
    upstream's ``model_config.proto`` declares them."""
    if isinstance(obj, list):
        return [
            p for i, v in enumerate(obj) for p in _members_in_upstream_order(descriptor, v, path)
        ]
    if not isinstance(obj, dict) or descriptor is None:
        return []
    names = [f.name for f in descriptor.fields if f.name in obj]
    wrong = [path] if list(obj) != names else []
    for f in descriptor.fields:
        if f.name not in obj or f.message_type is None:
            continue
        if f.message_type.GetOptions().map_entry:
            value = f.message_type.fields_by_name["value"].message_type
            for k, v in obj[f.name].items():
                wrong += _members_in_upstream_order(value, v, f"{path}.{f.name}[{k}]")
        else:
            wrong += _members_in_upstream_order(f.message_type, obj[f.name], f"{path}.{f.name}")
    return wrong


@pytest.mark.parametrize("scheduler", list(CONFIG_SCHEDULERS))
def test_config_json_lists_members_in_upstream_declaration_order(scheduler: str) -> None:
    """Triton 2.51's ``GET .../config`` is protobuf's C++ JSON printer, which writes members
    in upstream's declaration order; ours declares a few messages in field-number order, so
    ``config_to_json`` must order them as upstream does (json_form._TRITON_ORDER)."""
    text = CONFIG_COMMON + CONFIG_SCHEDULERS[scheduler]
    config = config_to_json(text_format.Parse(text, model_config_pb2.ModelConfig()))
    assert _members_in_upstream_order(tc_config.ModelConfig.DESCRIPTOR, config, "") == []
