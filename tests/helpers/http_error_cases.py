"""Bad HTTP requests and the status and JSON ``error`` Triton 2.51 answers them with: the model's
rules (input counts, names, shapes, datatypes, JSON tensor data), the repository and the URL.
``Case`` is one request and its answer; tests/e2e/test_triton_http_messages.py sends each to
triton-mp and the real Triton side by side. The wire's cases (header length, compression,
JSON parsing, shared memory) are in ``http_error_cases_wire``.
"""

from __future__ import annotations

import json
from typing import NamedTuple

BYTES_CONFIG = """
name: "b"
backend: "python"
max_batch_size: 0
input [{ name: "INPUT0", data_type: TYPE_STRING, dims: [ -1 ] }]
output [{ name: "OUTPUT0", data_type: TYPE_STRING, dims: [ -1 ] }]
"""
INT32_CONFIG = """
name: "i"
backend: "python"
max_batch_size: 0
input [
  { name: "INPUT0", data_type: TYPE_INT32, dims: [ 4 ] },
  { name: "INPUT1", data_type: TYPE_INT32, dims: [ 4 ], optional: true }
]
output [{ name: "OUTPUT0", data_type: TYPE_INT32, dims: [ 4 ] }]
"""
M, B, IM = "/v2/models/m/infer", "/v2/models/b/infer", "/v2/models/i/infer"
RID = "[request id: <id_unknown>] "


def fp32(name: str = "INPUT0", **fields: object) -> dict[str, object]:
    return {"name": name, "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4], **fields}


def int32(name: str = "INPUT0", datatype: str = "INT32", **fields: object) -> dict[str, object]:
    return {"name": name, "datatype": datatype, "shape": [4], "data": [1, 2, 3, 4], **fields}


def text(name: str = "INPUT0") -> dict[str, object]:
    return {"name": name, "datatype": "BYTES", "shape": [1], "data": ["a"]}


class Case(NamedTuple):
    method: str
    path: str
    body: object
    status: int
    error: str
    headers: dict[str, str] = {}


MODEL_CASES: dict[str, Case] = {
    "one input too many (optional inputs)": Case(
        "POST",
        M,
        {"inputs": [fp32(), fp32("INPUT1"), fp32("EXTRA")]},
        400,
        f"{RID}expected number of inputs between 1 and 2 but got 3 inputs for model 'm'. Got "
        "input(s) ['EXTRA','INPUT1','INPUT0'], but missing required input(s) ]. Please provide "
        "all required input(s).",
    ),
    "one input too many": Case(
        "POST",
        B,
        {"inputs": [text("X1"), text(), text("X2")]},
        400,
        f"{RID}expected 1 inputs but got 3 inputs for model 'b'. Got input(s) "
        "['INPUT0','X2','X1'], but missing required input(s) ]. Please provide all required "
        "input(s).",
    ),
    "too many, the required one absent": Case(
        "POST",
        B,
        {"inputs": [text("X1"), text("X2")]},
        400,
        f"{RID}expected 1 inputs but got 2 inputs for model 'b'. Got input(s) ['X2','X1'], "
        "but missing required input(s) ['INPUT0']. Please provide all required input(s).",
    ),
    "an unknown input within the count": Case(
        "POST",
        M,
        {"inputs": [fp32(), fp32("EXTRA")]},
        400,
        "unexpected inference input 'EXTRA' for model 'm'",
    ),
    "an input twice": Case(
        "POST",
        M,
        {"inputs": [fp32(), fp32()]},
        400,
        f"{RID}input 'INPUT0' already exists in request",
    ),
    "a shape the config refuses": Case(
        "POST",
        M,
        {"inputs": [fp32(shape=[5], data=[1, 2, 3, 4, 5])]},
        400,
        f"{RID}unexpected shape for input 'INPUT0' for model 'm'. Expected [4], got [5]. ",
    ),
    "statistics of a version that is not there": Case(
        "GET",
        "/v2/models/m/versions/7/stats",
        b"",
        400,
        "requested model version is not available for model 'm'",
    ),
}
NO_MEMBER = "attempt to access non-existing object member"
NOT_UINT = "attempt to access JSON non-unsigned-integer as unsigned-integer"
BINARY_HEAD = json.dumps(
    {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "parameters": {
        "binary_data_size": "16"}}]}
).encode()  # fmt: skip
MODEL_CASES.update(
    {
        # TritonJson's words at INTERNAL (500), as http_server.cc's RETURN_MSG_IF_ERR gives them
        "a JSON array for a body": Case(
            "POST", M, [1], 500, f"Unable to parse 'inputs': {NO_MEMBER} 'inputs'"
        ),
        "no inputs": Case("POST", M, {}, 500, f"Unable to parse 'inputs': {NO_MEMBER} 'inputs'"),
        "inputs not an array": Case(
            "POST",
            M,
            {"inputs": 3},
            500,
            "Unable to parse 'inputs': attempt to access JSON non-array as array",
        ),
        "an input without a name": Case(
            "POST",
            M,
            {"inputs": [{"datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}]},
            500,
            f"Unable to parse 'name': {NO_MEMBER} 'name'",
        ),
        "an input without a shape": Case(
            "POST",
            M,
            {"inputs": [{"name": "INPUT0", "datatype": "FP32", "data": [1, 2, 3, 4]}]},
            500,
            f"Unable to parse 'shape': {NO_MEMBER} 'shape'",
        ),
        "a negative dimension": Case(
            "POST",
            M,
            {"inputs": [fp32(shape=[-1])]},
            500,
            f"Unable to parse 'shape': {NOT_UINT}",
        ),
        "fewer data than the shape": Case(
            "POST",
            M,
            {"inputs": [fp32(data=[1, 2, 3])]},
            500,
            "Unable to parse 'data': Shape does not match true shape of 'data' field",
        ),
        "fewer nested data than the shape": Case(
            "POST",
            M,
            {"inputs": [fp32(shape=[2, 2], data=[[1, 2], [3]])]},
            500,
            "Unable to parse 'data': Shape does not match true shape of 'data' field",
        ),
        "a shape whose int64 element count wraps": Case(
            "POST",
            M,
            {"inputs": [fp32(shape=[2**63])]},
            500,
            "Unable to parse 'data': Shape does not match true shape of 'data' field",
        ),
        "more data than the shape": Case(
            "POST",
            M,
            {"inputs": [fp32(data=[1, 2, 3, 4, 5])]},
            500,
            "Unable to parse 'data': Shape does not match true shape of 'data' field",
        ),
        "data that is not an array": Case(
            "POST",
            M,
            {"inputs": [fp32(data=5)]},
            500,
            "Unable to parse 'data': attempt to access JSON non-array as array",
        ),
        "a boolean among FP32 data": Case(
            "POST",
            M,
            {"inputs": [fp32(data=[1, True, 3, 4])]},
            500,
            "Unable to parse 'data': attempt to access JSON non-number as double",
        ),
        "a boolean among INT32 data": Case(
            "POST",
            IM,
            {"inputs": [int32(data=[True, 2, 3, 4])]},
            500,
            "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer",
        ),
        "a float among INT32 data": Case(
            "POST",
            IM,
            {"inputs": [int32(data=[1, 2.0, 3, 4])]},
            500,
            "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer",
        ),
        "a negative number among UINT8 data": Case(
            "POST",
            IM,
            {"inputs": [int32(data=[1, 2, 3, 4]), int32("INPUT1", "UINT8", data=[1, -2, 3, 4])]},
            500,
            "Unable to parse 'data': attempt to access JSON non-unsigned-integer as "
            "unsigned-integer",
        ),
        "a number among BOOL data": Case(
            "POST",
            IM,
            {"inputs": [int32(data=[1, 2, 3, 4]), int32("INPUT1", "BOOL", data=[True, 0, 1, 1])]},
            500,
            "Unable to parse 'data': attempt to access JSON non-boolean as boolean",
        ),
        "data nested 100 deep": Case(
            "POST",
            M,
            {"inputs": [fp32(data=[1, 2, 3, json.loads("[" * 100 + "4" + "]" * 100)])]},
            400,
            "Unable to parse 'data': JSON nesting depth exceeds maximum allowed limit (100)",
        ),
        "a string among FP32 data": Case(
            "POST",
            M,
            {"inputs": [fp32(data=["a", 2, 3, 4])]},
            500,
            "Unable to parse 'data': attempt to access JSON non-number as double",
        ),
        "a number among BYTES data": Case(
            "POST",
            B,
            {"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [2], "data": [1, 2]}]},
            500,
            "Unable to parse JSON bytes array: attempt to access JSON non-string as string",
        ),
        "fewer BYTES data than the shape": Case(
            "POST",
            B,
            {"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [2], "data": ["a"]}]},
            400,
            f"{RID}expected 2 string elements for inference input 'INPUT0' for model 'b', got 1",
        ),
        "an output without a name": Case(
            "POST",
            M,
            {"inputs": [fp32()], "outputs": [{}]},
            500,
            f"Unable to parse 'name': {NO_MEMBER} 'name'",
        ),
        "binary_data not a boolean": Case(
            "POST",
            M,
            {
                "inputs": [fp32()],
                "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": "x"}}],
            },
            500,
            "Unable to parse 'binary_data': attempt to access JSON non-boolean as boolean",
        ),
        "an output's binary_data before its name": Case(
            "POST",
            M,
            {"inputs": [fp32()], "outputs": [{"parameters": {"binary_data": "x"}}]},
            500,
            f"Unable to parse 'name': {NO_MEMBER} 'name'",
        ),
        "an output that is no object": Case(
            "POST",
            M,
            {"inputs": [fp32()], "outputs": [5]},
            500,
            f"Unable to parse 'name': {NO_MEMBER} 'name'",
        ),
        "an input that is no object": Case(
            "POST",
            M,
            {"inputs": [5]},
            400,
            "Input must set only one of the following fields: 'data', 'binary_data_size' in "
            "'parameters', 'shared_memory_region' in 'parameters'. But no field is set",
        ),
        "binary_data not a boolean beside a region": Case(
            "POST",
            M,
            {
                "inputs": [fp32()],
                "outputs": [
                    {
                        "name": "OUTPUT0",
                        "parameters": {"shared_memory_region": "r", "binary_data": "x"},
                    }
                ],
            },
            500,
            "Unable to set 'binary_data': attempt to access JSON non-boolean as boolean",
        ),
        "classification not an integer": Case(
            "POST",
            M,
            {
                "inputs": [fp32()],
                "outputs": [
                    {"name": "OUTPUT0", "parameters": {"classification": "x", "binary_data": "x"}}
                ],
            },
            500,
            f"Unable to set 'classification': {NOT_UINT}",
        ),
        "an output region that is not a string": Case(
            "POST",
            M,
            {
                "inputs": [fp32()],
                "outputs": [{"name": "OUTPUT0", "parameters": {"shared_memory_region": 5}}],
            },
            500,
            "Unable to parse 'shared_memory_region': attempt to access JSON non-string as string",
        ),
        "an input offset that is not an integer": Case(
            "POST",
            M,
            {"inputs": [fp32(parameters={"shared_memory_offset": "x"})]},
            500,
            f"Unable to parse 'shared_memory_offset': {NOT_UINT}",
        ),
        "an input size that is negative": Case(
            "POST",
            M,
            {
                "inputs": [
                    {
                        "name": "INPUT0",
                        "datatype": "FP32",
                        "shape": [4],
                        "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": -1},
                    }
                ]
            },
            500,
            f"Unable to parse 'shared_memory_byte_size': {NOT_UINT}",
        ),
        "an id that is not a string": Case(
            "POST",
            M,
            {"id": 5, "inputs": [fp32()]},
            500,
            "Unable to parse 'id': attempt to access JSON non-string as string",
        ),
        "parameters not an object": Case(
            "POST",
            M,
            {"inputs": [fp32()], "parameters": 3},
            500,
            "failed to get request params.: attempt to get members for non-object",
        ),
        "a negative priority": Case(
            "POST",
            M,
            {"inputs": [fp32()], "parameters": {"priority": -1}},
            500,
            f"Unable to parse 'priority': {NOT_UINT}",
        ),
        "binary_data_size not an integer": Case(
            "POST",
            M,
            BINARY_HEAD + b"\0" * 16,
            500,
            f"Unable to parse 'binary_data_size': {NOT_UINT}",
            {"Inference-Header-Content-Length": str(len(BINARY_HEAD))},
        ),
        "ready not a boolean": Case(
            "POST",
            "/v2/repository/index",
            {"ready": "yes"},
            400,
            "Invalid value for 'ready': expected a boolean",
        ),
        "a shared-memory key that is not a string": Case(
            "POST",
            "/v2/systemsharedmemory/region/r/register",
            {"key": 5, "byte_size": 4},
            500,
            "attempt to access JSON non-string as string",
        ),
        "a shared-memory size that is not an integer": Case(
            "POST",
            "/v2/systemsharedmemory/region/r/register",
            {"key": "/k", "byte_size": "4"},
            500,
            NOT_UINT,
        ),
    }
)
MODEL_CASES.update(
    {
        # core model_repository_manager.cc: the poll fails, the log has the parser's words
        "loading a model whose config does not parse": Case(
            "POST",
            "/v2/repository/models/unparsable/load",
            b"",
            500,
            "failed to load 'unparsable', failed to poll from model repository",
        ),
        # Triton's routes match the undecoded URL: a percent-escape is part of the name
        "an escaped path in a model name": Case(
            "POST",
            "/v2/models/..%2F..%2Fm/infer",
            {"inputs": [fp32()]},
            404,
            "Request for unknown model: '..%2F..%2Fm' is not found",
        ),
        "an escaped letter in a model name": Case(
            "GET", "/v2/models/%6D", b"", 404, "Request for unknown model: '%6D' is not found"
        ),
        "an escaped space in a model name": Case(
            "GET",
            "/v2/models/a%20b/config",
            b"",
            404,
            "Request for unknown model: 'a%20b' is not found",
        ),
        "loading an escaped path": Case(
            "POST",
            "/v2/repository/models/..%2F..%2Fm/load",
            b"",
            500,
            "failed to load '..%2F..%2Fm', failed to poll from model repository",
        ),
    }
)
