"""Triton's request rules (``frontend.validation``), one by one, without a server.

Each case builds a transport-free ``InferenceRequest`` against a small model table and
checks the code and Triton's message of the first rule it breaks (or what a valid request
becomes). The same rules run end to end over gRPC and HTTP in tests/e2e/test_tensor_forms.py
and test_http.py.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tests.unit.fake_frontend import model_entry, table
from triton_mp._proto import grpc_service_pb2 as pb
from triton_mp._proto import model_config_pb2 as mc
from triton_mp.common.errors import ErrorCode, InvalidRequest, TritonMPError
from triton_mp.frontend.grpc.messages import request_from_proto
from triton_mp.frontend.request import (
    InferenceRequest,
    InputTensor,
    Parameter,
    RequestedOutput,
    bool_parameter,
    int64_parameter,
    string_parameter,
    uint64_parameter,
)
from triton_mp.frontend.shm.system import SystemShmRegistry
from triton_mp.frontend.validation.parameters import check_correlation_id_type, sequence_id
from triton_mp.frontend.validation.request import ValidRequest, validate_request
from triton_mp.ipc.protocol.messages import SequenceFlags

MODELS = table(
    model_entry(
        "plain",
        inputs=(("A", mc.TYPE_FP32, (2,)), ("B", mc.TYPE_INT32, (-1,))),
        outputs=("X", "Y"),
    ),
    model_entry("batched", max_batch_size=4, inputs=(("A", mc.TYPE_FP32, (2,)),)),
    model_entry("text", inputs=(("S", mc.TYPE_STRING, (-1,)),)),
)

FP32_2 = np.array([1, 2], np.float32).tobytes()
INT32_3 = np.array([1, 2, 3], np.int32).tobytes()
RID = "[request id: r] "


def _plain(**kw: object) -> InferenceRequest:
    fields: dict[str, object] = {
        "model_name": "plain",
        "id": "r",
        "inputs": (InputTensor("A", "FP32", (2,)), InputTensor("B", "INT32", (3,))),
        "raw_inputs": (FP32_2, INT32_3),
    }
    fields.update(kw)
    return InferenceRequest(**fields)  # type: ignore[arg-type]


def _valid(req: InferenceRequest, shm: SystemShmRegistry | None = None) -> ValidRequest:
    model, version = MODELS.resolve(req.model_name, req.model_version)
    return validate_request(req, model, version, shm)


def _error(req: InferenceRequest, shm: SystemShmRegistry | None = None) -> tuple[ErrorCode, str]:
    with pytest.raises(TritonMPError) as e:
        _valid(req, shm)
    return e.value.code, e.value.message


# ------------------------------------------------------------------------ a valid request


def test_a_valid_request_keeps_its_bytes_and_gets_every_output() -> None:
    valid = _valid(_plain())
    assert [(i.name, i.shape, bytes(i.data)) for i in valid.inputs] == [
        ("A", (2,), FP32_2),
        ("B", (3,), INT32_3),
    ]
    assert (valid.batch_size, valid.outputs, valid.output_regions) == (1, ("X", "Y"), ())


def test_typed_contents_become_raw_little_endian_bytes() -> None:
    req = _plain(
        inputs=(
            InputTensor("A", "FP32", (2,), contents={"fp32_contents": [1.0, 2.0]}),
            InputTensor("B", "INT32", (3,), contents={"int_contents": [1, 2, 3]}),
        ),
        raw_inputs=(),
    )
    assert [bytes(i.data) for i in _valid(req).inputs] == [FP32_2, INT32_3]


def test_bytes_contents_are_length_prefixed() -> None:
    req = InferenceRequest(
        model_name="text",
        inputs=(InputTensor("S", "BYTES", (2,), contents={"bytes_contents": [b"ab", b""]}),),
    )
    assert bytes(_valid(req).inputs[0].data) == b"\x02\0\0\0ab\0\0\0\0"


def test_an_output_asked_twice_is_refused_as_upstream_main() -> None:
    """core PR #493 (main; 2.51 returned it once): refused as the output is added, before
    any tensor's data is looked for."""
    twice = (RequestedOutput("Y"), RequestedOutput("X"), RequestedOutput("Y"))
    assert _error(_plain(outputs=twice)) == (
        ErrorCode.INVALID_ARG,
        RID + "output 'Y' already exists in request",
    )
    assert _error(_plain(outputs=twice, raw_inputs=()))[1] == (
        RID + "output 'Y' already exists in request"
    )
    # Repeated inputs are found first (the frontend adds the inputs, then the outputs).
    a = InputTensor("A", "FP32", (2,))
    assert _error(_plain(inputs=(a, a), outputs=twice))[1] == (
        RID + "input 'A' already exists in request"
    )


def test_the_batch_size_is_the_leading_dimension() -> None:
    req = InferenceRequest(
        model_name="batched",
        inputs=(InputTensor("A", "FP32", (3, 2)),),
        raw_inputs=(np.zeros(6, np.float32).tobytes(),),
    )
    assert _valid(req).batch_size == 3


# ---------------------------------------------------------------------------- parameters


def test_reserved_parameters_are_read_and_custom_ones_kept_as_json() -> None:
    params = {
        "priority": uint64_parameter(3),
        "timeout": int64_parameter(1000),
        "sequence_id": int64_parameter(-1),
        "sequence_start": bool_parameter(True),
        "sequence_end": bool_parameter(True),
        "note": string_parameter("hi"),
        "triton_enable_empty_final_response": bool_parameter(True),
    }
    valid = _valid(_plain(parameters=params))
    assert (valid.priority, valid.timeout_us) == (3, 1000)
    assert valid.sequence_id == 2**64 - 1, "an int64 correlation ID is read as unsigned"
    assert valid.sequence_flags == SequenceFlags.START | SequenceFlags.END
    assert json.loads(valid.parameters_json) == {"note": "hi"}


@pytest.mark.parametrize(
    ("key", "param", "message"),
    [
        (
            "priority",
            int64_parameter(-1),
            "invalid value for 'priority', expected value >= 0.",
        ),
        (
            # NOTE: a parameter with no value set (infer_handler.cc: none of its choices)
            "scale",
            Parameter(None),
            "invalid value type for 'scale' parameter, expected int64_param, bool_param, or "
            "string_param.",
        ),
        (
            "priority",
            string_parameter("high"),
            "invalid value type for 'priority' parameter, expected int64_param or uint64_param.",
        ),
        (
            "timeout",
            uint64_parameter(5),
            "invalid value type for 'timeout' parameter, expected int64_param.",
        ),
        (
            "sequence_id",
            uint64_parameter(1),
            "invalid value type for 'sequence_id' parameter, expected int64_param or string_param.",
        ),
        (
            "sequence_end",
            string_parameter("y"),
            "invalid value type for 'sequence_end' parameter, expected bool_param.",
        ),
        (
            "triton_x",
            bool_parameter(True),
            "parameter keys starting with 'triton_' are reserved for Triton usage. Only the "
            "following keys starting with 'triton_' are allowed: "
            "triton_enable_empty_final_response",
        ),
        *(
            (
                # NOTE: infer_handler.cc SetStateParameterFromTritonParameter
                "triton_enable_empty_final_response",
                param,
                "invalid value type for 'triton_enable_empty_final_response' parameter, "
                "expected bool_param.",
            )
            for param in (string_parameter("true"), uint64_parameter(1), Parameter(None))
        ),
        (
            "big",
            uint64_parameter(1),
            "invalid value type for 'big' parameter, expected int64_param, bool_param, or "
            "string_param.",
        ),
    ],
)
def test_malformed_parameters_are_refused(key: str, param: Parameter, message: str) -> None:
    # server grpc/infer_handler.cc: refused by the frontend, so no [request id: ...] prefix
    assert _error(_plain(parameters={key: param})) == (ErrorCode.INVALID_ARG, message)


def test_a_negative_timeout_is_none_as_triton_reads_it_unsigned() -> None:
    assert _valid(_plain(parameters={"timeout": int64_parameter(-5)})).timeout_us == 0


# -------------------------------------------------------------------------------- inputs


def test_unknown_repeated_and_missing_inputs() -> None:
    a = InputTensor("A", "FP32", (2,))
    assert _error(_plain(inputs=(a, InputTensor("C", "FP32", (1,)))))[1] == (
        "unexpected inference input 'C' for model 'plain'"
    )
    assert _error(_plain(inputs=(a, a)))[1] == RID + "input 'A' already exists in request"
    # core ValidateRequestInputs: the count first, the names as Triton's unordered_map has them
    b, c = InputTensor("B", "INT32", (3,)), InputTensor("C", "FP32", (1,))
    assert _error(_plain(inputs=(a, b, c), raw_inputs=(FP32_2, INT32_3, FP32_2)))[1] == (
        RID + "expected 2 inputs but got 3 inputs for model 'plain'. Got input(s) "
        "['B','C','A'], but missing required input(s) ]. Please provide all required input(s)."
    )
    assert _error(_plain(inputs=(a,), raw_inputs=(FP32_2,)))[1] == (
        RID + "expected 2 inputs but got 1 inputs for model 'plain'. Got input(s) ['A'], but "
        "missing required input(s) ['B']. Please provide all required input(s)."
    )


@pytest.mark.parametrize(
    ("tensor", "message"),
    [
        (
            InputTensor("A", "FP64", (2,)),
            "inference input 'A' data-type is 'FP64', but model 'plain' expects 'FP32'",
        ),
        *(
            (
                InputTensor("A", unknown, (2,)),
                "inference input 'A' data-type is '<invalid>', but model 'plain' expects 'FP32'",
            )
            for unknown in ("INT33", "fp32", "", "INVALID")
        ),
        (
            InputTensor("A", "FP32", (-1,)),
            "All input dimensions should be specified for input 'A' for model 'plain', got [-1]",
        ),
        (
            InputTensor("A", "FP32", (3,)),
            "unexpected shape for input 'A' for model 'plain'. Expected [2], got [3]. ",
        ),
        (
            # NOTE: only -1 is "not specified" (core Normalize); another negative mismatches
            InputTensor("A", "FP32", (-4,)),
            "unexpected shape for input 'A' for model 'plain'. Expected [2], got [-4]. ",
        ),
        (
            InputTensor("A", "FP32", (2, -1)),
            "unexpected shape for input 'A' for model 'plain'. Expected [2], got [2,-1]. ",
        ),
    ],
)
def test_datatype_and_shape_follow_the_config(tensor: InputTensor, message: str) -> None:
    req = _plain(inputs=(tensor, InputTensor("B", "INT32", (3,))))
    assert _error(req) == (ErrorCode.INVALID_ARG, RID + message)


def test_a_batching_model_needs_a_batch_dimension_within_its_limit() -> None:
    def req(shape: tuple[int, ...]) -> InferenceRequest:
        n = int(np.prod(shape))
        return InferenceRequest(
            model_name="batched",
            id="r",
            inputs=(InputTensor("A", "FP32", shape),),
            raw_inputs=(np.zeros(n, np.float32).tobytes(),),
        )

    code, message = _error(req((2,)))
    assert message.startswith(
        RID + "unexpected shape for input 'A' for model 'batched'. "
        "Expected [-1,2], got [2]. NOTE: Setting a non-zero max_batch_size"
    )
    assert _error(req((5, 2)))[1] == RID + "inference request batch-size must be <= 4 for 'batched'"
    assert _error(req((0, 2)))[1] == RID + "inference request batch-size must be >= 1 for 'batched'"


def test_byte_sizes_and_data_sources() -> None:
    assert _error(_plain(raw_inputs=(FP32_2[:4], INT32_3)))[1] == (
        RID + "input byte size mismatch for input 'A' for model 'plain'. Expected 8, got 4"
    )
    # server infer_handler.cc InferGRPCToInput: the first input without an entry, before
    # any of the core's checks (no request id); surplus entries are ignored.
    assert _error(_plain(raw_inputs=(FP32_2,)))[1] == (
        "unable to find data for input tensor 'B' for model 'plain' in request."
    )
    bad_shape = (InputTensor("A", "FP32", (3,)), InputTensor("B", "INT32", (3,)))
    assert _error(_plain(inputs=bad_shape, raw_inputs=(FP32_2,)))[1] == (
        "unable to find data for input tensor 'B' for model 'plain' in request."
    )
    valid = _valid(_plain(raw_inputs=(FP32_2, INT32_3, b"surplus")))
    assert [bytes(i.data) for i in valid.inputs] == [FP32_2, INT32_3]
    # A tensor of no elements needs its (empty) entry too.
    empty = (InputTensor("A", "FP32", (2,)), InputTensor("B", "INT32", (0,)))
    assert _error(_plain(inputs=empty, raw_inputs=(FP32_2,)))[1] == (
        "unable to find data for input tensor 'B' for model 'plain' in request."
    )
    assert bytes(_valid(_plain(inputs=empty, raw_inputs=(FP32_2, b""))).inputs[1].data) == b""
    both = InputTensor("A", "FP32", (2,), contents={"fp32_contents": [1.0, 2.0]})
    assert _error(_plain(inputs=(both, InputTensor("B", "INT32", (3,)))))[1] == (
        "contents field must not be specified when using raw_input_contents for 'A' "
        "for model 'plain'"  # NOTE: the gRPC frontend's check: no request id
    )
    none = _plain(raw_inputs=())
    assert (
        _error(none)[1] == "unable to find data for input tensor 'A' for model 'plain' in request."
    )


def test_a_contents_message_without_elements_is_typed_contents() -> None:
    """grpc.messages keeps a ``contents`` message without elements (has_contents())."""
    message = pb.ModelInferRequest(model_name="plain", id="r")
    message.inputs.add(name="A", datatype="FP32", shape=[2]).contents.SetInParent()
    message.inputs.add(name="B", datatype="INT32", shape=[3])
    message.raw_input_contents.append(INT32_3)
    assert _error(request_from_proto(message))[1] == (
        "contents field must not be specified when using raw_input_contents for 'A' for "
        "model 'plain'"
    )
    del message.raw_input_contents[:]
    message.inputs[1].contents.int_contents.extend([1, 2, 3])
    assert _error(request_from_proto(message))[1] == (
        RID + "input byte size mismatch for input 'A' for model 'plain'. Expected 8, got 0"
    )


def test_typed_contents_of_the_wrong_kind_or_count() -> None:
    def typed(contents: dict[str, list[object]]) -> InferenceRequest:
        return _plain(
            inputs=(
                InputTensor("A", "FP32", (2,), contents=contents),
                InputTensor("B", "INT32", (3,), contents={"int_contents": [1, 2, 3]}),
            ),
            raw_inputs=(),
        )

    # server infer_handler.cc InferGRPCToInputHelper: the field's type, then the core's
    # byte-size check counts the elements
    assert _error(typed({"int_contents": [1, 2]}))[1] == (
        "unexpected explicit tensor data for input tensor 'A' for model 'plain' of type "
        "'INT32', expected datatype 'FP32'"
    )
    assert _error(typed({"fp32_contents": [1.0]}))[1] == (
        RID + "input byte size mismatch for input 'A' for model 'plain'. Expected 8, got 4"
    )
    assert _error(typed({"fp32_contents": [1.0, 2.0], "fp64_contents": [1.0]}))[1] == (
        "unexpected explicit tensor data for input tensor 'A' for model 'plain', binary data "
        "was already supplied."
    )
    unknown = InputTensor("A", "FP33", (2,), contents={"fp32_contents": [1.0, 2.0]})
    req = _plain(inputs=(unknown, InputTensor("B", "INT32", (3,))), raw_inputs=())
    assert _error(req)[1] == (
        "unexpected explicit tensor data for input tensor 'A' for model 'plain' of type "
        "'FP32', expected datatype '<invalid>'"
    )


def test_narrow_integer_contents_keep_their_low_bytes() -> None:
    req = InferenceRequest(
        model_name="plain",
        id="r",
        inputs=(
            InputTensor("A", "FP32", (2,), contents={"fp32_contents": [1.0, 2.0]}),
            InputTensor("B", "INT32", (3,), contents={"int_contents": [1, -2, 3]}),
        ),
    )
    valid = _valid(req)
    assert bytes(valid.inputs[1].data) == np.array([1, -2, 3], np.int32).tobytes()


def _el(text: bytes) -> bytes:
    return len(text).to_bytes(4, "little") + text


WHERE = "for inference input 'S' for model 'text'"


@pytest.mark.parametrize(
    ("shape", "raw", "message"),
    [
        (
            (1,),
            b"\x09",
            f"incomplete string length indicator {WHERE}, expecting 4 bytes but only 1 bytes "
            "available. Please make sure the string length indicator is in one buffer.",
        ),
        ((2,), _el(b"ab"), f"expected 2 string elements {WHERE}, got 1"),
        (
            (1,),
            _el(b"a") + _el(b"b"),
            f"unexpected number of string elements 2 {WHERE}, expecting 1",
        ),
        # an element cut off by the buffer's end ends core's walk: the count is checked first
        (
            (3,),
            _el(b"a") + (99).to_bytes(4, "little") + b"xyz",
            f"expected 3 string elements {WHERE}, got 2",
        ),
    ],
)
def test_a_malformed_bytes_tensor_gets_tritons_message(
    shape: tuple[int, ...], raw: bytes, message: str
) -> None:
    # core infer_request.cc ValidateBytesInputs
    req = InferenceRequest(
        model_name="text", id="r", inputs=(InputTensor("S", "BYTES", shape),), raw_inputs=(raw,)
    )
    assert _error(req) == (ErrorCode.INVALID_ARG, RID + message)


def test_a_cut_off_last_bytes_element_gets_the_backends_message() -> None:
    # the count matches, so core passes it; the backend refuses it (backend_common
    # SetStringInputTensor, the python backend's words: no request id, no model name)
    raw = _el(b"a") + (99).to_bytes(4, "little") + b"xyz"
    req = InferenceRequest(
        model_name="text", id="r", inputs=(InputTensor("S", "BYTES", (2,)),), raw_inputs=(raw,)
    )
    assert _error(req) == (
        ErrorCode.INVALID_ARG,
        "incomplete string data for inference input 'S', expecting string of length 99 but "
        "only 3 bytes available",
    )


# ------------------------------------------------------------------------ outputs and shm


def test_unknown_outputs_and_classification() -> None:
    assert _error(_plain(outputs=(RequestedOutput("Z"),)))[1] == (
        "unexpected inference output 'Z' for model 'plain'"
    )
    # core Normalize: the output names (a std::set: sorted) before any input check.
    outputs = (RequestedOutput("Z"), RequestedOutput("X"), RequestedOutput("M"))
    inputs = (InputTensor("A", "FP64", (2,)), InputTensor("C", "INT32", (3,)))
    assert _error(_plain(outputs=outputs, inputs=inputs))[1] == (
        "unexpected inference output 'M' for model 'plain'"
    )
    # A classification output is valid: the response carries its classes.
    classify = RequestedOutput("X", {"classification": int64_parameter(2)})
    assert _valid(_plain(outputs=(classify,))).outputs == ("X",)


def test_shared_memory_tensors_need_a_registered_region() -> None:
    window = {
        "shared_memory_region": string_parameter("r1"),
        "shared_memory_byte_size": int64_parameter(8),
    }
    req = _plain(
        inputs=(InputTensor("A", "FP32", (2,), window), InputTensor("B", "INT32", (3,))),
        raw_inputs=(INT32_3,),
    )
    assert _error(req, SystemShmRegistry(0)) == (
        ErrorCode.NOT_FOUND,
        "Unable to find shared memory region: 'r1'",
    )
    assert _error(req, SystemShmRegistry(0, enabled=False))[0] == ErrorCode.UNSUPPORTED
    # The gRPC frontend looks the window up before the core's checks (InferGRPCToInput,
    # then InferAllocatorPayload for outputs): not a datatype or unknown-output error.
    wrong_type = _plain(
        inputs=(InputTensor("A", "FP64", (2,), window), InputTensor("B", "INT32", (3,))),
        raw_inputs=(INT32_3,),
    )
    assert _error(wrong_type, SystemShmRegistry(0))[0] == ErrorCode.NOT_FOUND
    outputs = (RequestedOutput("NOPE"), RequestedOutput("X", window))
    assert _error(_plain(outputs=outputs), SystemShmRegistry(0)) == (
        ErrorCode.NOT_FOUND,
        "Unable to find shared memory region: 'r1'",
    )


REGION = {"shared_memory_region": string_parameter("r1")}
SIZE = {"shared_memory_byte_size": int64_parameter(8)}
OFFSET = {"shared_memory_offset": int64_parameter(0)}
MUST = "'shared_memory_byte_size' must be specified along with 'shared_memory_region' parameter"


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (REGION, f"{MUST} for tensor '{{t}}'"),
        (
            {"shared_memory_region": int64_parameter(1), **SIZE},
            "invalid value type for 'shared_memory_region' parameter for tensor '{t}', expected "
            "string_param.",
        ),
        (
            OFFSET,
            "'shared_memory_offset' can not be specified without 'shared_memory_region' "
            "parameter for tensor '{t}'",
        ),
        (
            SIZE,
            "'shared_memory_byte_size' can not be specified without 'shared_memory_region' "
            "parameter for tensor '{t}'",
        ),
        (
            {**REGION, "shared_memory_offset": uint64_parameter(0), **SIZE},
            "invalid value type for 'shared_memory_offset' parameter for tensor '{t}', expected "
            "int64_param.",
        ),
        (
            {**REGION, "shared_memory_byte_size": uint64_parameter(8)},
            "invalid value type for 'shared_memory_byte_size' parameter for tensor '{t}', "
            "expected int64_param.",
        ),
    ],
)
def test_malformed_shared_memory_parameters_get_the_grpc_frontends_message(
    params: dict[str, Parameter], message: str
) -> None:
    # server grpc_utils.h ParseSharedMemoryParams: no [request id] prefix, before the
    # core's checks (here the shape of A is wrong too)
    bad_shape = InputTensor("A", "FP32", (5,), params)
    req = _plain(inputs=(bad_shape, InputTensor("B", "INT32", (3,))), raw_inputs=(INT32_3,))
    assert _error(req) == (ErrorCode.INVALID_ARG, message.format(t="A"))
    out = _plain(outputs=(RequestedOutput("X", params),))
    assert _error(out) == (ErrorCode.INVALID_ARG, message.format(t="X"))


def test_negative_shared_memory_numbers_are_read_as_unsigned() -> None:
    # int64_param -1 is SIZE_MAX in Triton's size_t: the region is looked up first
    params = {**REGION, "shared_memory_byte_size": int64_parameter(-1)}
    out = _plain(outputs=(RequestedOutput("X", params),))
    assert _error(out, SystemShmRegistry(0)) == (
        ErrorCode.NOT_FOUND,
        "Unable to find shared memory region: 'r1'",
    )


def _sequence_config(datatype: int) -> mc.ModelConfig:
    cfg = mc.ModelConfig(name="seq")
    ci = cfg.sequence_batching.control_input.add(name="CORRID")
    ci.control.add(
        kind=mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_CORRID, data_type=datatype
    )
    return cfg


def test_the_correlation_id_type_is_checked_against_the_corrid_control() -> None:
    # core InferenceRequest::ValidateCorrelationId; no ID at all is Triton's UINT64 0
    strings, ints = _sequence_config(mc.TYPE_STRING), _sequence_config(mc.TYPE_INT32)
    check_correlation_id_type("a", strings, "seq", RID)
    check_correlation_id_type(7, ints, "seq", RID)
    check_correlation_id_type("a", mc.ModelConfig(name="plain"), "plain", RID)
    with pytest.raises(InvalidRequest) as e:
        check_correlation_id_type(0, strings, "seq", RID)
    assert e.value.message == (
        RID + "sequence batching control 'CORRID' data-type is 'UINT64', but model 'seq' "
        "expects 'BYTES'"
    )
    with pytest.raises(InvalidRequest) as e:
        check_correlation_id_type("a", ints, "seq", RID)
    assert "data-type is 'BYTES', but model 'seq' expects 'INT32'" in e.value.message


def test_a_string_correlation_id_over_128_characters_is_unsupported() -> None:
    assert sequence_id(string_parameter("x" * 128)) == "x" * 128
    with pytest.raises(TritonMPError) as e:
        sequence_id(string_parameter("x" * 129))
    assert (e.value.code, e.value.message) == (
        ErrorCode.UNSUPPORTED,
        "string correlation ID cannot be longer than 128 characters",
    )


def test_a_window_is_checked_as_upstream_main_checks_it() -> None:
    """shared_memory_manager.cc GetMemoryInfo (main, PR #8335): an empty window at offset 0
    passes (what HTTP's missing size becomes; 2.51 refused it), the end must stay within
    the region, and an unsigned overflow is named."""
    key = f"/tmp_validation_{os.getpid()}"
    fd = os.open(f"/dev/shm{key}", os.O_CREAT | os.O_RDWR, 0o600)
    registry = SystemShmRegistry(0)
    try:
        os.ftruncate(fd, 64)
        registry.register("r", key, 0, 64)
        assert registry.window("r", 0, 0).byte_size == 64
        assert registry.window("r", 8, 0).byte_size == 64
        with pytest.raises(InvalidRequest) as e:
            registry.window("r", 8, 57)
        assert e.value.message == "Invalid offset + byte size for shared memory region: 'r'"
        with pytest.raises(InvalidRequest) as e:
            registry.window("r", 64, 0)
        assert e.value.message == "Invalid offset for shared memory region: 'r'"
        with pytest.raises(InvalidRequest) as e:
            registry.window("r", 1, 2**64 - 1)
        assert e.value.message == (
            f"Integer overflow detected: byte_size ({2**64 - 1}) + offset (1) exceeds maximum "
            f"value ({2**64 - 1}) for region 'r'"
        )
    finally:
        registry.unregister("")
        os.close(fd)
        os.unlink(f"/dev/shm{key}")
