"""HTTP inference request bodies -> InferenceRequest, rule by rule, on bytes (no server).

``frontend.http.infer_codec`` turns a KServe v2 JSON header plus binary tail (or a raw binary
body) into the transport-free request the core validates. Every validation it does itself has
a test here with Triton's message; the model rules (names, dtypes, shapes) are the shared
validator's and are tested end to end. JSON ``data`` itself: test_http_json_tensors.py; the
answers: test_http_infer_responses.py.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import pytest

from triton_mp._proto import model_config_pb2 as mc
from triton_mp.common.errors import ErrorCode, InvalidRequest, TritonMPError
from triton_mp.frontend.http.infer_codec import (
    HEADER_LENGTH,
    InferPlan,
    build_infer_request,
    build_raw_request,
    header_length_value,
    header_size,
    parse_infer_body,
)
from triton_mp.frontend.model_table import Model, ModelTable
from triton_mp.frontend.request import (
    Parameter,
    ParameterType,
    bool_parameter,
    int64_parameter,
    string_parameter,
    uint64_parameter,
)
from triton_mp.frontend.validation.parameters import sequence_id
from triton_mp.ipc.protocol.specs import ModelEntry

# --------------------------------------------------------------------------- helpers


def _model(name: str, inputs: list[tuple[str, int, list[int]]], max_batch_size: int = 0) -> Model:
    cfg = mc.ModelConfig(name=name, max_batch_size=max_batch_size)
    for n, dt, dims in inputs:
        cfg.input.add(name=n, data_type=dt, dims=dims)
    cfg.output.add(name="OUT", data_type=mc.TYPE_FP32, dims=[-1])
    table = ModelTable(
        (ModelEntry(name=name, config=cfg.SerializeToString(), ready_versions=(1,)),)
    )
    return table.get(name)


def _build(header: dict[str, Any], tail: bytes = b"") -> Any:
    """(request, its raw input bytes, plan)."""
    req, plan = build_infer_request(header, memoryview(tail), "m", "")
    return req, list(req.raw_inputs), plan


def _parse(model: Model, version: str, body: bytes, header_length: str | None) -> Any:
    """(request, its raw input bytes, plan) of a whole body."""
    req, plan = parse_infer_body(model, version, body, header_size(len(body), header_length))
    return req, list(req.raw_inputs), plan


def _err(header: dict[str, Any], tail: bytes = b"") -> str:
    with pytest.raises(TritonMPError) as e:
        _build(header, tail)
    assert e.value.code in (ErrorCode.INVALID_ARG, ErrorCode.INTERNAL)
    return e.value.message


def _inp(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"name": "X", "datatype": "FP32", "shape": [2]}
    base.update(kw)
    return base


# ------------------------------------------------------------------- JSON tensor data


# ------------------------------------------------------------------- request header


def test_json_inputs_become_proto_inputs_with_packed_bytes() -> None:
    req, raw, plan = _build(
        {
            "id": "r1",
            "inputs": [
                _inp(data=[1, 2]),
                {"name": "Y", "datatype": "INT32", "shape": [1, 2], "data": [[3, 4]]},
            ],
        }
    )
    assert req.model_name == "m"
    assert req.id == "r1"
    assert [(t.name, t.datatype, list(t.shape)) for t in req.inputs] == [
        ("X", "FP32", [2]),
        ("Y", "INT32", [1, 2]),
    ]
    assert raw == [np.array([1, 2], np.float32).tobytes(), np.array([3, 4], np.int32).tobytes()]
    assert plan == InferPlan(binary_default=False, binary={})


def test_binary_inputs_are_slices_of_the_tail_in_input_order() -> None:
    a, b = np.arange(2, dtype=np.float32).tobytes(), np.arange(3, dtype=np.int64).tobytes()
    req, raw, _ = _build(
        {
            "inputs": [
                _inp(parameters={"binary_data_size": 8}),
                _inp(name="E", shape=[0], parameters={"binary_data_size": 0}),
                _inp(name="Y", datatype="INT64", shape=[3], parameters={"binary_data_size": 24}),
            ]
        },
        a + b,
    )
    assert [bytes(r) for r in raw] == [a, b"", b]
    assert isinstance(raw[0], memoryview), "binary inputs are not copied"


def test_a_tail_shorter_than_the_binary_sizes_is_refused() -> None:
    msg = _err({"inputs": [_inp(parameters={"binary_data_size": 8})]}, b"1234")
    assert msg == "unexpected size for input 'X', expecting 4 additional bytes for model 'm'"


def test_a_tail_longer_than_the_binary_sizes_is_refused() -> None:
    msg = _err({"inputs": [_inp(parameters={"binary_data_size": 4})]}, b"12345678")
    assert msg == "unexpected additional input data for model 'm'"


def test_an_empty_shape_needs_no_data_bytes() -> None:
    _, raw, _ = _build({"inputs": [_inp(shape=[0], data=[])]})
    assert raw == [b""]


PREFIX = (
    "Input must set only one of the following fields: 'data', 'binary_data_size' in "
    "'parameters', 'shared_memory_region' in 'parameters'. But"
)


@pytest.mark.parametrize(
    ("item", "tail"),
    [
        (_inp(), " no field is set"),
        (_inp(data=[1, 2], parameters={"binary_data_size": 8}), " set 'data' 'binary_data_size'"),
        (
            _inp(parameters={"binary_data_size": 8, "shared_memory_region": "r"}),
            " set 'binary_data_size' 'shared_memory_region'",
        ),
        (
            _inp(data=[1, 2], parameters={"shared_memory_region": "r"}),
            " set 'data' 'shared_memory_region'",
        ),
    ],
    ids=["none", "data+binary", "binary+shm", "data+shm"],
)
def test_each_input_names_exactly_one_data_source(item: dict[str, Any], tail: str) -> None:
    assert _err({"inputs": [item]}) == PREFIX + tail


@pytest.mark.parametrize(
    ("header", "field"),
    [
        ({}, "inputs"),
        ({"inputs": {"name": "X"}}, "inputs"),
        ({"inputs": [_inp(name=3, data=[1, 2])]}, "name"),
        ({"inputs": [{"datatype": "FP32", "shape": [2], "data": [1, 2]}]}, "name"),
        ({"inputs": [_inp(datatype=None, data=[1, 2])]}, "datatype"),
        ({"inputs": [_inp(shape=[-2], data=[1, 2])]}, "shape"),
        ({"inputs": [_inp(shape="2", data=[1, 2])]}, "shape"),
        ({"inputs": [_inp(shape=[2.0], data=[1, 2])]}, "shape"),
        ({"id": 7, "inputs": []}, "id"),
        ({"inputs": [_inp(parameters={"binary_data_size": -1})]}, "binary_data_size"),
        ({"inputs": [], "outputs": {"name": "O"}}, "outputs"),
        ({"inputs": [], "outputs": [{"parameters": {}}]}, "name"),
        (
            {"inputs": [], "outputs": [{"name": "O", "parameters": {"binary_data": 1}}]},
            "binary_data",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_malformed_fields_are_named(header: dict[str, Any], field: str) -> None:
    assert _err(header).startswith(f"Unable to parse '{field}'")


def test_a_header_that_is_not_an_object_is_refused() -> None:
    assert _err([1, 2]) == (  # type: ignore[arg-type]
        "Unable to parse 'inputs': attempt to access non-existing object member 'inputs'"
    )


def test_shared_memory_input_parameters_reach_the_proto() -> None:
    req, raw, _ = _build(
        {
            "inputs": [
                _inp(
                    parameters={
                        "shared_memory_region": "in",
                        "shared_memory_offset": 16,
                        "shared_memory_byte_size": 8,
                    }
                )
            ]
        }
    )
    p = req.inputs[0].parameters
    assert p["shared_memory_region"] == string_parameter("in")
    assert p["shared_memory_offset"] == int64_parameter(16)
    assert p["shared_memory_byte_size"] == int64_parameter(8)
    assert raw == []


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"shared_memory_region": 5}, "shared_memory_region"),
        ({"shared_memory_region": "r", "shared_memory_offset": -1}, "shared_memory_offset"),
        ({"shared_memory_region": "r", "shared_memory_byte_size": "8"}, "shared_memory_byte_size"),
    ],
)
def test_shared_memory_parameters_have_types(params: dict[str, Any], field: str) -> None:
    # NOTE: CheckSharedMemoryData's RETURN_MSG_IF_ERR: INTERNAL, TritonJson's words after
    assert _err({"inputs": [_inp(parameters=params)]}).startswith(
        f"Unable to parse '{field}': attempt to access JSON non-"
    )


def test_shared_memory_parameters_are_read_for_a_tensor_with_data_too() -> None:
    # NOTE: 2.51 calls CheckSharedMemoryData for every input outside the binary tail
    params = {"shared_memory_offset": "x"}
    assert _err({"inputs": [_inp(data=[1, 2], parameters=params)]}) == (
        "Unable to parse 'shared_memory_offset': attempt to access JSON non-unsigned-integer "
        "as unsigned-integer"
    )


def test_an_input_that_is_no_object_sets_no_field() -> None:
    # NOTE: TritonJson finds no member in a value that is not an object (2.51)
    assert _err({"inputs": [5]}) == PREFIX + " no field is set"


def test_input_parameters_that_are_no_object_are_none() -> None:
    req, raw, _ = _build({"inputs": [_inp(data=[1, 2], parameters=[1])]})
    assert req.inputs[0].parameters == {}
    assert raw == [np.array([1, 2], np.float32).tobytes()]


# ------------------------------------------------------------------ request parameters


def test_reserved_parameters_take_their_types() -> None:
    req, _, plan = _build(
        {
            "inputs": [],
            "parameters": {
                "priority": 2,
                "timeout": 100,
                "sequence_id": 7,
                "sequence_start": True,
                "sequence_end": False,
                "binary_data_output": True,
                "note": "x",
                "count": -3,
                "flag": False,
            },
        }
    )
    p = req.parameters
    assert p["priority"] == uint64_parameter(2)
    assert p["timeout"] == int64_parameter(100)  # the gRPC form: int64_param
    assert p["sequence_id"] == int64_parameter(7)
    assert p["sequence_start"] == bool_parameter(True)
    assert p["note"] == string_parameter("x")
    assert p["count"] == int64_parameter(-3)
    assert p["flag"] == bool_parameter(False)
    assert "binary_data_output" not in p
    assert plan.binary_default is True


def test_a_string_sequence_id_is_kept_as_a_string() -> None:
    req, _, _ = _build({"inputs": [], "parameters": {"sequence_id": "abc"}})
    assert req.parameters["sequence_id"] == string_parameter("abc")


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("priority", -1),
        ("priority", "1"),
        ("timeout", 1.5),
        ("sequence_id", 1.5),
        ("sequence_start", 1),
        ("sequence_end", "yes"),
        ("binary_data_output", 1),
    ],
)
def test_reserved_parameters_of_the_wrong_type_are_refused(key: str, value: object) -> None:
    # NOTE: ParseJsonTritonParams' prefix before TritonJson's words (AsUInt, AsString, AsBool)
    assert _err({"inputs": [], "parameters": {key: value}}).startswith(
        f"Unable to parse '{key}': attempt to access JSON non-"
    )


def test_triton_prefixed_parameters_are_reserved() -> None:
    assert _err({"inputs": [], "parameters": {"triton_x": 1}}) == (
        "parameter keys starting with 'triton_' are reserved for Triton usage and should not "
        "be specified."
    )


@pytest.mark.parametrize("value", [[1], {"a": 1}, None])
def test_custom_parameters_are_int_bool_or_string(value: object) -> None:
    assert _err({"inputs": [], "parameters": {"k": value}}) == (
        "parameter 'k' has invalid type. It should be either 'int', 'bool', or 'string'."
    )


@pytest.mark.parametrize("value", [1.5, 2**63, -(2**63) - 1])
def test_a_custom_number_that_is_no_int64_is_a_double(value: float) -> None:
    # NOTE: SetTritonParameterFromJsonParameter: IsInt, IsBool, then IsNumber (2.51)
    req, _, _ = _build({"inputs": [], "parameters": {"k": value}})
    assert req.parameters["k"] == Parameter(ParameterType.DOUBLE, float(value))


def test_request_parameters_must_be_an_object() -> None:
    assert _err({"inputs": [], "parameters": [1]}) == (
        "failed to get request params.: attempt to get members for non-object"
    )


# ----------------------------------------------------------------------------- outputs


def test_listed_outputs_are_json_unless_binary_data_is_set() -> None:
    req, _, plan = _build(
        {
            "inputs": [],
            "parameters": {"binary_data_output": True},
            "outputs": [
                {"name": "A"},
                {"name": "B", "parameters": {"binary_data": True}},
                {"name": "C", "parameters": {"binary_data": False}},
                {
                    "name": "D",
                    "parameters": {"shared_memory_region": "o", "shared_memory_byte_size": 4},
                },
            ],
        }
    )
    assert [o.name for o in req.outputs] == ["A", "B", "C", "D"]
    assert plan.binary == {"A": False, "B": True, "C": False}
    assert plan.binary_default is True
    assert req.outputs[3].parameters["shared_memory_region"] == string_parameter("o")


def test_zero_classes_is_no_classification() -> None:
    # http_server.cc: a class count of 0 is a plain output
    req, _ = build_infer_request(
        {"inputs": [], "outputs": [{"name": "A", "parameters": {"classification": 0}}]},
        memoryview(b""),
        "m",
        "",
    )
    assert req.outputs[0].parameters == {}


def test_classification_reaches_the_proto() -> None:
    req, _, _ = _build(
        {"inputs": [], "outputs": [{"name": "A", "parameters": {"classification": 3}}]}
    )
    assert req.outputs[0].parameters["classification"] == int64_parameter(3)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (
            {"shared_memory_region": "o", "classification": 2},
            "Output can't set both 'shared_memory_region' and 'classification'",
        ),
        (
            {"shared_memory_region": "o", "binary_data": True},
            "Output can't set both 'shared_memory_region' and 'binary_data'",
        ),
        (
            {"classification": -2},
            "Unable to set 'classification': attempt to access JSON non-unsigned-integer as "
            "unsigned-integer",
        ),
        (
            {"shared_memory_region": "o", "binary_data": 1},
            "Unable to set 'binary_data': attempt to access JSON non-boolean as boolean",
        ),
        (
            {"classification": "x", "binary_data": 1},
            "Unable to set 'classification': attempt to access JSON non-unsigned-integer as "
            "unsigned-integer",
        ),
        (
            {"shared_memory_region": 5},
            "Unable to parse 'shared_memory_region': attempt to access JSON non-string as string",
        ),
    ],
)
def test_output_parameter_conflicts(params: dict[str, Any], message: str) -> None:
    assert _err({"inputs": [], "outputs": [{"name": "A", "parameters": params}]}) == message


def test_an_output_name_is_read_before_its_binary_data() -> None:
    # NOTE: http_server.cc: ValidateOutputParameter, name, classification, shared memory,
    # then CheckBinaryOutputData
    out = {"parameters": {"binary_data": "x"}}
    assert _err({"inputs": [], "outputs": [out]}) == (
        "Unable to parse 'name': attempt to access non-existing object member 'name'"
    )
    assert _err({"inputs": [], "outputs": [5]}) == (
        "Unable to parse 'name': attempt to access non-existing object member 'name'"
    )


def test_output_parameters_that_are_no_object_are_none() -> None:
    req, _, plan = _build({"inputs": [], "outputs": [{"name": "A", "parameters": 5}]})
    assert req.outputs[0].parameters == {}
    assert plan.binary == {"A": False}


# ----------------------------------------------------------------- body and header length


ONE_FP32 = _model("one", [("X", mc.TYPE_FP32, [-1])])


def test_without_a_header_length_the_whole_body_is_json() -> None:
    body = json.dumps({"inputs": [_inp(data=[1, 2])]}).encode()
    req, raw, _ = _parse(ONE_FP32, "", body, None)
    assert req.model_name == "one"
    assert raw == [np.array([1, 2], np.float32).tobytes()]


def test_the_header_length_splits_json_and_tail() -> None:
    header = json.dumps({"inputs": [_inp(parameters={"binary_data_size": 8})]}).encode()
    tail = np.array([5, 6], np.float32).tobytes()
    _, raw, _ = _parse(ONE_FP32, "", header + tail, str(len(header)))
    assert bytes(raw[0]) == tail


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("x", f"Unable to parse {HEADER_LENGTH}, got: x"),
        ("-1", "inference header size should be in range (0, 12), got: -1"),
        ("13", "inference header size should be in range (0, 12), got: 13"),
        (" +13x", "inference header size should be in range (0, 12), got:  +13x"),
        ("", f"Unable to parse {HEADER_LENGTH}, got: "),
        (
            "2147483648",
            f"Unable to parse {HEADER_LENGTH}, value is out of range [ -2147483648, "
            "2147483647 ], got: 2147483648",
        ),
    ],
)
def test_bad_header_lengths_are_refused(value: str, message: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        header_size(12, value)
    assert e.value.message == message


@pytest.mark.parametrize(
    ("text", "value"), [("12", 12), (" \t12abc", 12), ("+0", 0), ("-7", -7), ("3.5", 3)]
)
def test_the_header_length_is_read_as_stoi_reads_it(text: str, value: int) -> None:
    assert header_length_value(text) == value


def test_malformed_json_is_refused() -> None:
    with pytest.raises(TritonMPError) as e:
        parse_infer_body(ONE_FP32, "", b'{"inputs": [', 12)
    assert e.value.message == "failed to parse the request JSON buffer: Invalid value. at 12"


# --------------------------------------------------------------------- raw binary request


def test_a_raw_body_is_the_only_input_with_its_variable_dim_deduced() -> None:
    body = np.arange(6, dtype=np.float32).tobytes()
    req, raw, plan = _parse(ONE_FP32, "1", body, "0")
    t = req.inputs[0]
    assert (t.name, t.datatype, list(t.shape), req.model_version) == ("X", "FP32", [6], "1")
    assert raw == [body]
    assert plan.binary_default is True


def test_a_raw_body_gets_batch_one_when_the_model_batches() -> None:
    model = _model("b", [("X", mc.TYPE_INT32, [2, -1])], max_batch_size=4)
    req = build_raw_request(model, "", np.zeros(6, np.int32).tobytes())
    assert list(req.inputs[0].shape) == [1, 2, 3]


def test_a_raw_bytes_body_becomes_one_length_prefixed_element() -> None:
    model = _model("s", [("T", mc.TYPE_STRING, [1])])
    req, raw, _ = _parse(model, "", b"hello", "0")
    assert list(req.inputs[0].shape) == [1]
    assert raw == [struct.pack("<I", 5) + b"hello"]


def test_a_raw_body_needs_a_single_input_model() -> None:
    model = _model("two", [("A", mc.TYPE_FP32, [4]), ("B", mc.TYPE_FP32, [4])])
    with pytest.raises(InvalidRequest) as e:
        build_raw_request(model, "", b"x" * 16)
    assert e.value.message == (
        "[request id: <id_unknown>] Raw request must only have 1 input (found 1) to be deduced "
        "but got 2 inputs in 'two' model configuration"
    )


def test_a_raw_body_cannot_fill_two_variable_dims() -> None:
    with pytest.raises(InvalidRequest) as e:
        build_raw_request(_model("v", [("X", mc.TYPE_FP32, [-1, -1])]), "", b"x" * 16)
    assert e.value.message == (
        "[request id: <id_unknown>] The shape of the raw input 'X' can not be deduced because "
        "there are more than one variable-sized dimension"
    )


def test_a_raw_bytes_body_needs_shape_one() -> None:
    with pytest.raises(InvalidRequest) as e:
        build_raw_request(_model("s", [("T", mc.TYPE_STRING, [-1])]), "", b"x")
    assert e.value.message == (
        "[request id: <id_unknown>] For BYTE datatype raw input 'T', the model must have input "
        "shape [1]"
    )


# -------------------------------------------------------------------------- responses


def test_a_sequence_id_above_int64_survives_as_unsigned() -> None:
    big = (1 << 64) - 5
    req, _, _ = _build({"inputs": [], "parameters": {"sequence_id": big}})
    assert sequence_id(req.parameters["sequence_id"]) == big
