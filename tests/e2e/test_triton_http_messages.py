"""Triton's HTTP statuses and messages for bad requests, side by side: every case runs
against triton-mp and, where ``.peers/`` has it, the real Triton 2.51 on the same python
models; both must answer the same HTTP status and the same JSON ``error`` (server
``http_server.cc``, core ``infer_request.cc`` / ``tritonserver.cc``). Cases marked
``MAIN_ONLY`` follow upstream main where it changed after 2.51; only triton-mp is held to
them.
"""

from __future__ import annotations

import gzip
import http.client
import json
import os
import socket
import urllib.request
from collections.abc import Iterator
from typing import NamedTuple

import pytest

from tests.helpers.repos import FP32_PAIR_CONFIG, IDENTITY_PY, write_python_model
from tests.helpers.server import ServerProcess
from tests.helpers.triton_peer import RealTriton, peers_env

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

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


CASES: dict[str, Case] = {
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
CASES.update(
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
CASES.update(
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
ONE = json.dumps({"inputs": [fp32()]}).encode()
RAW_M = (
    f"{RID}Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in 'm' "
    "model configuration"
)
HEADER = "Inference-Header-Content-Length"
CASES.update(
    {
        # GetInferenceHeaderLength: std::stoi (2.51: std::atoi), whatever follows is ignored
        "a header length with text after the number": Case(
            "POST", M, ONE, 200, "", {HEADER: f" {len(ONE)}xyz"}
        ),
        "a header length that is no number": Case(
            "POST", M, ONE, 400, f"Unable to parse {HEADER}, got: abc", {HEADER: "abc"}
        ),
        "a header length beyond int32": Case(
            "POST",
            M,
            ONE,
            400,
            f"Unable to parse {HEADER}, value is out of range [ -2147483648, 2147483647 ], "
            "got: 99999999999",
            {HEADER: "99999999999"},
        ),
        # DataCompressor::DecompressData ignores zlib's data errors: what inflated goes on
        # (here nothing: a raw request of zero bytes)
        "a corrupt gzip body": Case(
            "POST", M, b"not gzip at all", 400, RAW_M, {"Content-Encoding": "gzip"}
        ),
        "a corrupt gzip body for a BYTES input": Case(
            "POST",
            B,
            b"not gzip at all",
            400,
            f"{RID}For BYTE datatype raw input 'INPUT0', the model must have input shape [1]",
            {"Content-Encoding": "gzip"},
        ),
        "a gzip body with a bad checksum": Case(
            "POST", M, gzip.compress(ONE)[:-8] + bytes(8), 200, "", {"Content-Encoding": "gzip"}
        ),
        "a gzip body sent as deflate": Case(
            "POST", M, gzip.compress(ONE), 200, "", {"Content-Encoding": "deflate"}
        ),
        "an empty gzip body": Case(
            "POST", M, b"", 400, "nothing to be decompressed", {"Content-Encoding": "gzip"}
        ),
    }
)
PARSE = "failed to parse the request JSON buffer: "
CASES.update(
    {
        # triton_json.h Value::Parse: RapidJSON's GetParseError_En and offset, INTERNAL
        f"not JSON: {body.decode()!r}": Case("POST", path, body, 500, PARSE + error)
        for path, body, error in [
            (
                M,
                ONE + b"x",
                f"The document root must not be followed by other values. at {len(ONE)}",
            ),
            (M, b"   ", "The document is empty. at 3"),
            (M, b"{1}", "Missing a name for object member. at 1"),
            (M, b'{"a" 1}', "Missing a colon after a name of object member. at 5"),
            (M, b'{"a": 1 "b": 2}', "Missing a comma or '}' after an object member. at 8"),
            (M, b'{"a": 1', "Missing a comma or '}' after an object member. at 7"),
            (M, b"[1 2]", "Missing a comma or ']' after an array element. at 3"),
            (M, b'{"a": tru}', "Invalid value. at 9"),
            (M, b'{"a": "\\q"}', "Invalid escape character in string. at 7"),
            (M, b'{"a": 1.}', "Miss fraction part in number. at 8"),
            (M, b'{"a": 1e400}', "Number too big to be stored in double. at 6"),
            (M, b'{"a": Nax}', "Invalid value. at 8"),
            (M, b'{"a": Infin}', "Invalid value. at 11"),
            (M, b'{"a": "x\x01"}', "Invalid escape character in string. at 8"),
            (M, b"\xef\xbb\xbf{1}", "Missing a name for object member. at 4"),
            (
                "/v2/repository/index",
                b'{"a" 1}',
                "Missing a colon after a name of object member. at 5",
            ),
            (
                "/v2/systemsharedmemory/region/r/register",
                b"{",
                "Missing a name for object member. at 1",
            ),
        ]
    }
)
SHM_IN = {"name": "INPUT0", "datatype": "FP32", "shape": [4]}
CASES.update(
    {
        # HTTP leaves shared_memory_byte_size at 0; shared_memory_manager.cc checks the region
        "an input in an unknown region without a size": Case(
            "POST",
            M,
            {"inputs": [{**SHM_IN, "parameters": {"shared_memory_region": "nowhere"}}]},
            404,
            "Unable to find shared memory region: 'nowhere'",
        ),
        "an output in an unknown region without a size": Case(
            "POST",
            M,
            {
                "inputs": [fp32()],
                "outputs": [{"name": "OUTPUT0", "parameters": {"shared_memory_region": "nowhere"}}],
            },
            404,
            "Unable to find shared memory region: 'nowhere'",
        ),
    }
)
UNKNOWN_TYPE_HEAD = json.dumps(
    {"inputs": [{"name": "INPUT0", "datatype": "INT33", "shape": [4], "parameters": {
        "binary_data_size": 16}}]}
).encode()  # fmt: skip
CASES.update(
    {
        # core Normalize prints "<invalid>"; JSON data is refused first by http_server.cc
        "an unknown datatype for binary data": Case(
            "POST",
            M,
            UNKNOWN_TYPE_HEAD + bytes(16),
            400,
            f"{RID}inference input 'INPUT0' data-type is '<invalid>', but model 'm' expects 'FP32'",
            {HEADER: str(len(UNKNOWN_TYPE_HEAD))},
        ),
        "an unknown datatype for JSON data": Case(
            "POST",
            M,
            {"inputs": [fp32(datatype="INT33")]},
            400,
            "invalid datatype for input INPUT0",
        ),
    }
)
CUDA = "/v2/cudasharedmemory/region/r/register"
SYS = "/v2/systemsharedmemory/region/r/register"
HANDLE = {"b64": "AAAA"}
LOAD, UNLOAD = "/v2/repository/models/m/load", "/v2/repository/models/zz/unload"
CASES.update(
    {
        # HandleCudaSharedMemory: raw_handle, its b64, byte_size, device_id, in this order
        "a CUDA register with an empty body": Case(
            "POST", CUDA, b"", 500, PARSE + "The document is empty. at 0"
        ),
        "a CUDA register without byte_size": Case(
            "POST",
            CUDA,
            {"raw_handle": HANDLE, "device_id": 0},
            500,
            f"{NO_MEMBER} 'byte_size'",
        ),
        "a CUDA register without device_id": Case(
            "POST", CUDA, {"raw_handle": HANDLE, "byte_size": 4}, 500, f"{NO_MEMBER} 'device_id'"
        ),
        "a CUDA register whose raw_handle is a string": Case(
            "POST",
            CUDA,
            {"raw_handle": "AAAA", "byte_size": 4, "device_id": 0},
            500,
            f"{NO_MEMBER} 'b64'",
        ),
        "a CUDA register whose b64 is a number": Case(
            "POST",
            CUDA,
            {"raw_handle": {"b64": 5}, "byte_size": 4, "device_id": 0},
            500,
            "attempt to access JSON non-string as string",
        ),
        "a CUDA register whose byte_size is a string": Case(
            "POST", CUDA, {"raw_handle": HANDLE, "byte_size": "4", "device_id": 0}, 500, NOT_UINT
        ),
        "a CUDA register whose device_id is negative": Case(
            "POST", CUDA, {"raw_handle": HANDLE, "byte_size": 4, "device_id": -1}, 500, NOT_UINT
        ),
        "a CUDA register whose handle is too short": Case(
            "POST",
            CUDA,
            {"raw_handle": HANDLE, "byte_size": 4, "device_id": 0},
            400,
            "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t",
        ),
        # TritonJson's Find finds nothing in JSON that is not an object
        "a CUDA register with an array body": Case(
            "POST", CUDA, [1], 400, "Shared memory register request has no 'raw_handle' field"
        ),
        "a system register with an array body": Case(
            "POST", SYS, [1], 400, "Shared memory register request has no 'key' field"
        ),
        "an index request with an array body": Case("POST", "/v2/repository/index", [1], 200, ""),
        "a trace setting with an array body": Case("POST", "/v2/trace/setting", [1], 200, ""),
        "a trace setting with an empty body": Case(
            "POST", "/v2/trace/setting", b"", 500, PARSE + "The document is empty. at 0"
        ),
        "a load with an array body": Case("POST", LOAD, [1], 200, ""),
        "a load whose parameters are not an object": Case(
            "POST", LOAD, {"parameters": 3}, 500, "attempt to get members for non-object"
        ),
        "a load whose config is not a string": Case(
            "POST",
            LOAD,
            {"parameters": {"config": 3}},
            500,
            "attempt to access JSON non-string as string",
        ),
        "a load with an unknown parameter": Case(
            "POST",
            LOAD,
            {"parameters": {"foo": "x"}},
            500,
            "unexpected error on creating Triton parameter",
        ),
        "a load whose config does not parse": Case(
            "POST",
            LOAD,
            {"parameters": {"config": "{"}},
            500,
            "failed to load 'm', failed to poll from model repository",
        ),
        "an unload with an array body": Case("POST", UNLOAD, [1], 200, ""),
        "an unload whose parameters are not an object": Case(
            "POST", UNLOAD, {"parameters": 3}, 200, ""
        ),
        "an unload whose unload_dependents is not a boolean": Case(
            "POST", UNLOAD, {"parameters": {"unload_dependents": "x"}}, 200, ""
        ),
        "an unload body that is not JSON": Case(
            "POST", UNLOAD, b"{", 500, PARSE + "Missing a name for object member. at 1"
        ),
        # common.cc ValidateSharedMemoryKey (upstream main)
        # CheckClassificationOutput: 0 classes is no classification
        "a classification of 0": Case(
            "POST",
            M,
            {
                "inputs": [fp32()],
                "outputs": [{"name": "OUTPUT0", "parameters": {"classification": 0}}],
            },
            200,
            "",
        ),
        "a system register with a key of slashes": Case(
            "POST",
            SYS,
            {"key": "//", "byte_size": 4},
            400,
            "cannot register shared memory region 'r' - invalid shm key '//'",
        ),
        "a system register with Triton's reserved key prefix": Case(
            "POST",
            SYS,
            {"key": "/triton_python_backend_shm_region_1", "byte_size": 4},
            400,
            "cannot register shared memory region 'r' with key "
            "'/triton_python_backend_shm_region_1' as the key contains the reserved prefix "
            "'triton_python_backend_shm_region_'",
        ),
    }
)
CASES["a shared-memory register with an empty body"] = Case(
    "POST",
    "/v2/systemsharedmemory/region/r/register",
    b"",
    500,
    PARSE + "The document is empty. at 0",
)
MAIN_ONLY: set[str] = {
    "a header length that is no number",
    "a header length beyond int32",
    "data nested 100 deep",
    "ready not a boolean",
    "an unload body that is not JSON",
    "a system register with a key of slashes",
    "a system register with Triton's reserved key prefix",
}
"""Cases where upstream main answers otherwise than Triton 2.51: only triton-mp is held
(2.51 reads the header length with ``std::atoi``: "abc" is 0, a raw request; main's
``std::stoi`` refuses it. Main's ReadDataFromJson (PR #8676) bounds the nesting of ``data``;
2.51 takes any depth. Main's index refuses a ``ready`` that is no boolean in its
own words, its unload parses its body, and it checks shared-memory keys)."""


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """HTTP addresses: ``triton-mp`` always, ``triton`` when the real Triton is installed."""
    repo = tmp_path_factory.mktemp("http_messages") / "repo"
    write_python_model(repo, "m", FP32_PAIR_CONFIG, IDENTITY_PY)
    write_python_model(repo, "b", BYTES_CONFIG, IDENTITY_PY)
    write_python_model(repo, "i", INT32_CONFIG, IDENTITY_PY)
    write_python_model(repo, "unparsable", 'name: "unparsable"\nthis is { not pbtxt\n', IDENTITY_PY)
    explicit = ("--model-control-mode=explicit", "--load-model=m", "--load-model=b")
    explicit += ("--load-model=i",)
    logs = tmp_path_factory.mktemp("logs")
    trace = [
        f"--trace-config=triton,file={logs / 'trace.json'}",
        "--trace-config=log-frequency=7",
    ]
    ours = ServerProcess(repo, logs / "ours.log", "--allow-client-shm=true", *explicit, *trace)
    theirs: RealTriton | None = None
    try:
        env = peers_env()
        if env is not None:  # NOTE: started before ours is live: side by side
            theirs = RealTriton(
                env, logs / "triton.log", f"--model-repository={repo}", *explicit, *trace
            )
        ours.wait_live()
        urls = {"triton-mp": ours.http_url}
        if theirs is not None:
            theirs.wait_live()
            urls["triton"] = theirs.http_url
        yield urls
    finally:
        ours.stop()
        if theirs is not None:
            theirs.stop()


def call(url: str, case: Case) -> tuple[int, str]:
    """The HTTP status and the ``error`` of the JSON body ("" when there is none)."""
    host, port = url.split(":")
    body = case.body if isinstance(case.body, bytes) else json.dumps(case.body).encode()
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request(case.method, case.path, body=body, headers=case.headers)
        r = conn.getresponse()
        data = r.read()
    finally:
        conn.close()
    try:
        return r.status, json.loads(data).get("error", "")
    except (ValueError, AttributeError):
        return r.status, ""


@pytest.mark.parametrize("name", list(CASES))
def test_bad_http_requests_get_tritons_status_and_message(
    servers: dict[str, str], name: str
) -> None:
    case = CASES[name]
    for server, url in servers.items():
        if server == "triton" and name in MAIN_ONLY:
            continue
        assert call(url, case) == (case.status, case.error), server


def test_the_server_keeps_serving(servers: dict[str, str]) -> None:
    ok = Case("POST", M, {"inputs": [fp32()]}, 200, "")
    for server, url in servers.items():
        assert call(url, ok) == (200, ""), server


SERVED = {
    "input parameters that are no object": {"inputs": [fp32(parameters=5)]},
    "output parameters that are no object": {
        "inputs": [fp32()],
        "outputs": [{"name": "OUTPUT0", "parameters": 5}],
    },
    "a custom parameter with a fraction": {"inputs": [fp32()], "parameters": {"p": 1.5}},
    "a custom parameter past int64": {"inputs": [fp32()], "parameters": {"p": 2**64 - 1}},
}
"""Bodies 2.51 serves (TritonJson finds no member in a non-object; a number that is no
int64 is a double parameter)."""


@pytest.mark.parametrize("name", list(SERVED))
def test_what_triton_serves_is_served(servers: dict[str, str], name: str) -> None:
    ok = Case("POST", M, SERVED[name], 200, "")
    for server, url in servers.items():
        assert call(url, ok) == (200, ""), server


def _trace_setting(url: str, body: object = None) -> tuple[int, dict[str, object]]:
    host, port = url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        if body is None:
            conn.request("GET", "/v2/trace/setting")
        else:
            conn.request("POST", "/v2/trace/setting", body=json.dumps(body).encode())
        r = conn.getresponse()
        return r.status, json.loads(r.read())
    finally:
        conn.close()


def test_trace_settings_triton_lets_through(servers: dict[str, str]) -> None:
    """Triton (2.51 and main's HandleTrace / SetGlobalTraceArgs) ignores a global
    ``log-frequency`` and an unknown level, and reads ``log_frequency`` with ``std::stoi``
    into a uint32 (-5 becomes 4294967291); both servers answer alike."""
    for server, url in servers.items():
        status, setting = _trace_setting(url)
        assert (status, setting["log_frequency"], setting["trace_level"]) == (200, "0", ["OFF"])
        status, setting = _trace_setting(url, {"trace_level": ["BOGUS"]})
        assert (status, setting["trace_level"]) == (200, ["OFF"]), server
        status, setting = _trace_setting(url, {"log_frequency": "-5"})
        assert (status, setting["log_frequency"]) == (200, "4294967291"), server
        status, setting = _trace_setting(url, {"log_frequency": "99999999999"})
        assert (status, setting) == (
            400,
            {
                "error": "Unable to parse 'log_frequency', value is out of range [ 0, "
                "4294967295 ], got: 99999999999"
            },
        ), server
        assert _trace_setting(url, {"log_frequency": "0"})[0] == 200


def _raw(url: str, head: bytes, body_parts: list[bytes]) -> tuple[int, str, bytes]:
    """Send ``head`` and ``body_parts`` on a raw socket; the status, the JSON error and what
    followed the response (b"" when the server closed the connection)."""
    host, port = url.split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(head)
        try:
            for part in body_parts:
                s.sendall(part)
        except (BrokenPipeError, ConnectionResetError):
            pass  # NOTE: the server may stop reading once it has refused the body
        data = b""
        while True:
            try:
                more = s.recv(65536)
            except ConnectionResetError:
                break
            if not more:
                break
            data += more
    head_text, _, rest = data.partition(b"\r\n\r\n")
    status = int(head_text.split(b" ", 2)[1])
    length = next(
        int(line.split(b":", 1)[1])
        for line in head_text.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return status, json.loads(rest[:length]).get("error", ""), rest[length:]


def test_a_chunked_body_of_too_many_chunks_is_refused(servers: dict[str, str]) -> None:
    """Server PR #8770 (upstream main, 2026; 2.51 predates it): more than 65536 non-empty
    chunks answers 400 and closes the connection."""
    url = servers["triton-mp"]
    head = f"POST {M} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
    chunks = [b"1\r\n \r\n" * 65537, b"0\r\n\r\n"]
    status, error, _ = _raw(url, head, chunks)
    assert (status, error) == (
        400,
        "Chunked request body exceeds maximum of 65536 non-empty chunks. Send fewer or "
        "larger HTTP chunks.",
    )
    # 65536 chunks are fine (here: a JSON body cut into them)
    body = json.dumps({"inputs": [fp32()]}).encode()
    body += b" " * (65536 - len(body))
    parts = [b"1\r\n" + body[i : i + 1] + b"\r\n" for i in range(len(body))]
    status, error, _ = _raw(
        url,
        head.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"),
        [b"".join(parts), b"0\r\n\r\n"],
    )
    assert (status, error) == (200, "")


def test_a_body_that_inflates_past_the_limit_is_refused(servers: dict[str, str]) -> None:
    """Server PR #8570 (upstream main; 2.51 predates it): --http-max-input-size bounds the
    inflated body too."""
    bomb = gzip.compress(b" " * (64 * 2**20 + 10))
    case = Case("POST", M, bomb, 400, "", {"Content-Encoding": "gzip"})
    assert call(servers["triton-mp"], case) == (
        400,
        "Decompressed data size exceeds the maximum allowed value of 67108864 bytes. Use "
        "--http-max-input-size to increase the limit.",
    )


def test_a_region_without_a_size_is_an_empty_window(servers: dict[str, str]) -> None:
    """HTTP leaves ``shared_memory_byte_size`` at 0. Upstream main's GetMemoryInfo (PR #8335,
    2025) takes that empty window, so the core refuses the input's byte size and the output
    does not fit; 2.51's end check (``offset + byte_size - 1``, unsigned) refused the window
    itself ("Invalid offset + byte size ..."): only triton-mp is held to main here."""
    key = f"/tmp_http_messages_{os.getpid()}"
    fd = os.open(f"/dev/shm{key}", os.O_CREAT | os.O_RDWR, 0o600)
    url = servers["triton-mp"]
    try:
        os.ftruncate(fd, 64)
        register = Case(
            "POST",
            "/v2/systemsharedmemory/region/sized/register",
            {"key": key, "byte_size": 64},
            200,
            "",
        )
        assert call(url, register) == (200, "")
        body = {"inputs": [{**SHM_IN, "parameters": {"shared_memory_region": "sized"}}]}
        assert call(url, Case("POST", M, body, 400, "")) == (
            400,
            f"{RID}input byte size mismatch for input 'INPUT0' for model 'm'. Expected 16, got 0",
        )
        body = {
            "inputs": [fp32()],
            "outputs": [{"name": "OUTPUT0", "parameters": {"shared_memory_region": "sized"}}],
        }
        assert call(url, Case("POST", M, body, 500, "")) == (
            500,
            "shared memory size specified with the request for output 'OUTPUT0' (0 bytes) "
            "should be at least 16 bytes to hold the results",
        )
        unregister = Case("POST", "/v2/systemsharedmemory/region/sized/unregister", b"", 200, "")
        assert call(url, unregister) == (200, "")
    finally:
        os.close(fd)
        os.unlink(f"/dev/shm{key}")


NUMBERS = b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [%s]}]}'


@pytest.mark.parametrize(
    "body",
    [
        NUMBERS % b"NaN, -Inf, Infinity, -Infinity",
        NUMBERS % b"-NaN, Inf, 1e-400, 2",
        b"\xef\xbb\xbf" + NUMBERS % b"1, 2, 3, 4",
        NUMBERS % b"1, 2, 3, 4" + b"\x00 anything",
    ],
    ids=["NaN and Infinity", "-NaN, Inf", "a byte-order mark", "bytes after a NUL"],
)
def test_json_rapidjson_reads_is_served(servers: dict[str, str], body: bytes) -> None:
    """TritonJson parses with kParseNanAndInfFlag and writes with kWriteNanAndInfFlag;
    RapidJSON skips a UTF-8 byte-order mark and stops at a NUL: both servers answer 200
    with the same data (``NaN``, ``Infinity`` and ``-Infinity`` written as such)."""
    answers = {}
    for server, url in servers.items():
        host, port = url.split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        try:
            conn.request("POST", M, body=body)
            r = conn.getresponse()
            answers[server] = (r.status, repr(json.loads(r.read())["outputs"][0]["data"]))
        finally:
            conn.close()
    assert answers["triton-mp"][0] == 200
    assert len(set(answers.values())) == 1, answers


def test_server_metadata_lists_tritons_extensions_but_cuda_shared_memory(
    servers: dict[str, str],
) -> None:
    """GET /v2: the extensions 2.51 lists, in its order, less ``cuda_shared_memory``, which
    triton-mp registers but does not serve in requests yet."""
    tritons = [
        "classification", "sequence", "model_repository", "model_repository(unload_dependents)",
        "schedule_policy", "model_configuration", "system_shared_memory", "cuda_shared_memory",
        "binary_tensor_data", "parameters", "statistics", "trace", "logging",
    ]  # fmt: skip
    for server, url in servers.items():
        with urllib.request.urlopen(f"http://{url}/v2", timeout=30) as r:
            extensions = json.loads(r.read())["extensions"]
        expected = tritons if server == "triton" else [e for e in tritons if "cuda" not in e]
        assert extensions == expected, server
