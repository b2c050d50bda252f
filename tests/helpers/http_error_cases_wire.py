"""Bad HTTP requests on the wire and Triton 2.51's answers: the inference header length,
compression, JSON parsing (RapidJSON's words), shared memory in requests and registration, and
``MAIN_ONLY``, the cases where upstream main answers otherwise. ``Case`` and the request
builders are ``http_error_cases``'s.
"""

from __future__ import annotations

import gzip
import json

from tests.helpers.http_error_cases import NO_MEMBER, NOT_UINT, RID, B, Case, M, fp32

WIRE_CASES: dict[str, Case] = {}


ONE = json.dumps({"inputs": [fp32()]}).encode()
RAW_M = (
    f"{RID}Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in 'm' "
    "model configuration"
)
HEADER = "Inference-Header-Content-Length"
WIRE_CASES.update(
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
WIRE_CASES.update(
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
WIRE_CASES.update(
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
WIRE_CASES.update(
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
WIRE_CASES.update(
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
        # NOTE: 2.51 overwrites the parse error with the unload's answer (6dabb879, r14's F6);
        # upstream main refuses it
        "an unload body that is not JSON": Case("POST", UNLOAD, b"{", 200, ""),
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
WIRE_CASES["a shared-memory register with an empty body"] = Case(
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
    "a system register with a key of slashes",
    "a system register with Triton's reserved key prefix",
}
"""Cases where upstream main answers otherwise than Triton 2.51: only triton-mp is held
(2.51 reads the header length with ``std::atoi``: "abc" is 0, a raw request; main's
``std::stoi`` refuses it. Main's ReadDataFromJson (PR #8676) bounds the nesting of ``data``;
2.51 takes any depth. Main's index refuses a ``ready`` that is no boolean in its
own words, and it checks shared-memory keys)."""
