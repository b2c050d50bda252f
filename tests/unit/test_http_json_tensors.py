"""JSON tensor data (``frontend.http.json_tensors``), rule by rule, on bytes (no server).

KServe v2 JSON ``data`` packed row-major into raw tensor bytes and back, per datatype, and every
refusal with Triton's message (counts, nesting, element types, half precision).
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pytest

from triton_mp.common.errors import ErrorCode, InvalidRequest, TritonMPError
from triton_mp.frontend.http.infer_codec import build_infer_request
from triton_mp.frontend.http.json_tensors import decode_json, json_tensor_bytes

PACKED = [
    ("BOOL", [[True, False], [False, True]], np.array([1, 0, 0, 1], np.bool_)),
    ("UINT8", [1, 255, 0, 7], np.array([1, 255, 0, 7], np.uint8)),
    ("UINT16", [1, 65535, 0, 7], np.array([1, 65535, 0, 7], np.uint16)),
    ("UINT32", [1, 2, 3, 4], np.array([1, 2, 3, 4], np.uint32)),
    ("UINT64", [1, 2**64 - 1, 3, 4], np.array([1, 2**64 - 1, 3, 4], np.uint64)),
    ("INT8", [-1, 2, -128, 127], np.array([-1, 2, -128, 127], np.int8)),
    ("INT16", [-1, 2, 3, 4], np.array([-1, 2, 3, 4], np.int16)),
    ("INT32", [[-1, 2], [3, 4]], np.array([-1, 2, 3, 4], np.int32)),
    ("INT64", [-(2**63), 2, 3, 2**63 - 1], np.array([-(2**63), 2, 3, 2**63 - 1], np.int64)),
    ("FP32", [[0.5, 1], [2.25, -3]], np.array([0.5, 1, 2.25, -3], np.float32)),
    ("FP64", [0.1, 1, 2, 3], np.array([0.1, 1, 2, 3], np.float64)),
    ("FP32", [10**30, 2**64, 2, 3], np.array([1e30, 2**64, 2, 3], np.float32)),
    ("INT32", [2**40 + 1, 2, 3, 4], np.array([1, 2, 3, 4], np.int32)),  # NOTE: Triton's cast
]


@pytest.mark.parametrize(
    ("datatype", "data", "expected"), PACKED, ids=[f"{p[0]}-{i}" for i, p in enumerate(PACKED)]
)
def test_json_data_packs_each_datatype_row_major(
    datatype: str, data: list[Any], expected: np.ndarray
) -> None:
    assert json_tensor_bytes("X", datatype, data, 4) == expected.tobytes()


def test_json_bytes_data_is_length_prefixed_utf8() -> None:
    got = json_tensor_bytes("X", "BYTES", [["ab", ""], ["é", "z"]], 4)
    assert got == b"".join(struct.pack("<I", len(s)) + s for s in (b"ab", b"", "é".encode(), b"z"))


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_json_data_refuses_half_precision(datatype: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        json_tensor_bytes("X", datatype, [1.0], 1)
    assert e.value.message == (
        f"receiving {datatype} data via JSON is not supported. Please use the binary data "
        "format for input X"
    )


def test_json_data_refuses_an_unknown_datatype() -> None:
    with pytest.raises(InvalidRequest) as e:
        json_tensor_bytes("X", "FLOAT", [1.0], 1)
    assert e.value.message == "invalid datatype for input X"


def test_json_data_must_be_an_array() -> None:
    with pytest.raises(TritonMPError) as e:
        json_tensor_bytes("X", "FP32", 1.0, 1)
    assert (e.value.code, e.value.message) == (
        ErrorCode.INTERNAL,
        "Unable to parse 'data': attempt to access JSON non-array as array",
    )


TOO_MANY = "Unable to parse 'data': Shape does not match true shape of 'data' field"


TOO_FEW = TOO_MANY  # NOTE: 2.51's words for both (upstream main's PR #8676 words fewer otherwise)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([1.0, 2.0, 3.0], TOO_MANY),
        ([[1.0, 2.0], [3.0]], TOO_MANY),
        ([1.0], TOO_FEW),
        ([1.0, 2.0, True], TOO_MANY),  # NOTE: the count is checked before the third's type
        ([True, 2.0, 3.0], "Unable to parse 'data': attempt to access JSON non-number as double"),
    ],
    ids=["more", "ragged", "fewer", "more, then a boolean", "a boolean, then more"],
)
def test_json_data_count_must_match_the_shape(data: list[Any], message: str) -> None:
    # http_server.cc ReadDataFromJson (2.51)
    with pytest.raises(TritonMPError) as e:
        json_tensor_bytes("X", "FP32", data, 2)
    assert (e.value.code, e.value.message) == (ErrorCode.INTERNAL, message)


def test_json_data_nested_too_deep_is_refused() -> None:
    # upstream main's HTTP_MAX_JSON_NESTING_DEPTH: a value 100 arrays deep
    deep: Any = 1.0
    for _ in range(99):
        deep = [deep]
    assert json_tensor_bytes("X", "FP32", deep, 1) == np.float32(1).tobytes()
    message = "JSON nesting depth exceeds maximum allowed limit (100)"
    with pytest.raises(InvalidRequest) as e:
        json_tensor_bytes("X", "FP32", [deep], 1)
    assert e.value.message == f"Unable to parse 'data': {message}"
    with pytest.raises(InvalidRequest) as e:
        json_tensor_bytes("X", "BYTES", [[deep]], 1)
    assert e.value.message == message


@pytest.mark.parametrize(
    ("datatype", "data", "why"),
    [
        ("INT32", [1.5, 2], "non-signed-integer as signed-integer"),
        ("INT32", [True, False], "non-signed-integer as signed-integer"),
        ("UINT8", [-1, 2], "non-unsigned-integer as unsigned-integer"),
        ("FP32", ["1", 2], "non-number as double"),
        ("BOOL", [1, 0], "non-boolean as boolean"),
        ("INT64", [None, 1], "non-signed-integer as signed-integer"),
        ("UINT64", [2**64, 1], "non-unsigned-integer as unsigned-integer"),
        ("INT32", [1, True], "non-signed-integer as signed-integer"),
        ("INT8", [2.0, 1], "non-signed-integer as signed-integer"),
        ("INT64", [2**63, 1], "non-signed-integer as signed-integer"),
        ("UINT32", [1, False], "non-unsigned-integer as unsigned-integer"),
        ("UINT16", [1.0, 1], "non-unsigned-integer as unsigned-integer"),
        ("FP32", [1.5, True], "non-number as double"),
        ("FP64", [None, 1], "non-number as double"),
        ("FP32", [{}, 1], "non-number as double"),
        ("BOOL", [True, 0], "non-boolean as boolean"),
        ("BOOL", [True, "true"], "non-boolean as boolean"),
    ],
    ids=lambda v: str(v),
)
def test_json_data_elements_must_have_the_datatypes_json_type(
    datatype: str, data: list[Any], why: str
) -> None:
    # NOTE: TritonJson's words at INTERNAL, as Triton's ReadDataFromJson answers
    with pytest.raises(TritonMPError) as e:
        json_tensor_bytes("X", datatype, data, 2)
    assert (e.value.code, e.value.message) == (
        ErrorCode.INTERNAL,
        f"Unable to parse 'data': attempt to access JSON {why}",
    )


def test_json_bytes_elements_must_be_strings() -> None:
    with pytest.raises(TritonMPError) as e:
        json_tensor_bytes("X", "BYTES", [1, "a"], 2)
    assert e.value.message == (
        "Unable to parse JSON bytes array: attempt to access JSON non-string as string"
    )


def test_json_nested_deeper_than_the_recursion_limit_is_a_bad_request() -> None:
    with pytest.raises(InvalidRequest, match="nested too deeply"):
        decode_json(b"[" * 100_000 + b"]" * 100_000)


def test_a_shape_whose_int64_count_wraps_below_zero_matches_no_data() -> None:
    # NOTE: 2.51's GetElementCount is int64: [2**63] counts -2**63 elements
    for data in ([1, 2], []):
        header = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [2**63], "data": data}]}
        with pytest.raises(TritonMPError) as e:
            build_infer_request(header, memoryview(b""), "m", "")
        assert e.value.message == TOO_MANY
