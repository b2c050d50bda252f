"""The classification extension on outputs 2.51 cannot classify, side by side with the real
Triton 2.51 (python backend) where 2.51 answers.

Asking 2.51 for ``classification`` (gRPC ``class_count``, HTTP ``"classification"``) of

- a BYTES output, over gRPC or HTTP, or
- an output with no elements, over HTTP,

kills the server (SIGSEGV; the client sees its connection closed). triton-mp answers
instead (docs/differences.md): a BYTES output is refused as 2.51 refuses a BOOL one
(INVALID_ARGUMENT / HTTP 400, "class result not available for output due to unsupported type
'<type>'"), and an output with no elements is answered over HTTP as 2.51 answers it over gRPC:
BYTES of the output's shape, no data. Those cases are asked of triton-mp alone: asking the
session's shared 2.51 would stop it for every other test. The cases 2.51 survives are asked of
both.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.helpers.server import ServerProcess
from tests.helpers.triton_peer import PythonModel, RealTriton

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [
  { name: "SCORES" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] },
  { name: "FLAGS" data_type: TYPE_BOOL dims: [ -1 ] }
]
"""
MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            n = int(pb_utils.get_input_tensor_by_name(r, "N").as_numpy()[0])
            tensors = [
                pb_utils.Tensor("SCORES", np.arange(n, dtype=np.float32)),
                pb_utils.Tensor("TEXT", np.array([b"ab"] * n, dtype=np.object_)),
                pb_utils.Tensor("FLAGS", np.zeros(n, dtype=np.bool_)),
            ]
            out.append(pb_utils.InferenceResponse(tensors))
        return out
"""
SIDE_BY_SIDE_MODELS = {"classes_py": PythonModel(CONFIG, MODEL)}
"""classes_py: for N = n, SCORES FP32 [0, 1, ..., n-1], TEXT BYTES n times "ab", FLAGS BOOL n
falses (tests/e2e/conftest.py's ``shared_side_by_side`` serves it)."""

Server = ServerProcess | RealTriton
TOP2 = ["2.000000:2", "1.000000:1"]
"""SCORES' top 2 classes for N = 3."""
NO_BYTES = {"binary_data_size": 0}
INVALID = "StatusCode.INVALID_ARGUMENT"


Classes = tuple[str, list[int], list[bytes]]
"""An answer's classes: (datatype, shape, values)."""


def _grpc(server: Server, n: int, output: str, count: int) -> Classes | str:
    """``output``'s top ``count`` classes for N = ``n`` over gRPC: (datatype, shape, values),
    or "<status>: <message>"."""
    t = grpcclient.InferInput("N", [1], "INT32")
    t.set_data_from_numpy(np.array([n], np.int32))
    with grpcclient.InferenceServerClient(server.url) as c:
        try:
            wanted = [grpcclient.InferRequestedOutput(output, class_count=count)]
            r = c.infer("classes_py", [t], outputs=wanted)
        except InferenceServerException as e:
            return f"{e.status()}: {e.message()}"
    head = r.get_response().outputs[0]
    values = r.as_numpy(output)
    return head.datatype, list(head.shape), [] if values is None else values.tolist()


def _http(
    server: Server, n: int, output: str, count: int, binary: bool = False
) -> tuple[int, object]:
    """``output``'s top ``count`` classes for N = ``n`` over HTTP/REST (JSON answer unless
    ``binary``): (status, the output's JSON head or the error's body)."""
    body = {
        "inputs": [{"name": "N", "shape": [1], "datatype": "INT32", "data": [n]}],
        "outputs": [
            {"name": output, "parameters": {"classification": count, "binary_data": binary}}
        ],
    }
    url = f"http://{server.http_url}/v2/models/classes_py/infer"
    req = urllib.request.Request(url, json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            text = r.read()
            size = int(r.headers.get("Inference-Header-Content-Length") or len(text))
            return r.status, json.loads(text[:size])["outputs"]
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_classes_of_a_numeric_output_without_elements(
    shared_side_by_side: dict[str, Server],
) -> None:
    for name, server in shared_side_by_side.items():
        assert _grpc(server, 3, "SCORES", 2) == ("BYTES", [2], [t.encode() for t in TOP2]), name
        assert _grpc(server, 0, "SCORES", 2) == ("BYTES", [0], []), name
        assert _http(server, 3, "SCORES", 2) == (
            200,
            [{"name": "SCORES", "datatype": "BYTES", "shape": [2], "data": TOP2}],
        ), name
    ours = shared_side_by_side["triton-mp"]
    # NOTE: 2.51 dies here (over HTTP only): triton-mp answers as 2.51's gRPC above.
    assert _http(ours, 0, "SCORES", 2) == (
        200,
        [{"name": "SCORES", "datatype": "BYTES", "shape": [0], "data": []}],
    )
    assert _http(ours, 0, "SCORES", 2, binary=True) == (
        200,
        [{"name": "SCORES", "datatype": "BYTES", "shape": [0], "parameters": NO_BYTES}],
    )


def test_classes_of_a_bytes_output_are_refused_as_of_a_bool_one(
    shared_side_by_side: dict[str, Server],
) -> None:
    def refusal(datatype: str) -> str:
        return f"class result not available for output due to unsupported type '{datatype}'"

    for name, server in shared_side_by_side.items():
        for n in (0, 2):
            assert _grpc(server, n, "FLAGS", 1) == f"{INVALID}: {refusal('BOOL')}", name
            assert _http(server, n, "FLAGS", 1) == (400, {"error": refusal("BOOL")}), name
    ours = shared_side_by_side["triton-mp"]
    # NOTE: 2.51 dies on each of these (gRPC and HTTP, with or without elements).
    for n in (0, 2):
        assert _grpc(ours, n, "TEXT", 1) == f"{INVALID}: {refusal('BYTES')}"
        assert _http(ours, n, "TEXT", 1) == (400, {"error": refusal("BYTES")})
