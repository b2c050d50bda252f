"""A BYTES element whose 4-byte length runs past the tensor's bytes, side by side with the real
Triton 2.51 (python backend).

Core ``ValidateBytesInputs`` counts such an element and ends its walk inside it, so it checks
the element count first ("expected N string elements ..., got M"); when the count matches,
core passes the request and the backend refuses the cut element in its own words ("incomplete
string data for inference input '<name>', expecting string of length <n> but only <m> bytes
available": no request id, no model name) and reports the request as failed (python_be.cc:
an input that cannot be read fails ``ProcessRequests``, so ``fail`` +1).
"""

from __future__ import annotations

import json
import re
import struct
import time
import urllib.request

import grpc
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.helpers.server import ServerProcess
from tests.helpers.triton_peer import PythonModel, RealTriton

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
"""
SIDE_BY_SIDE_MODELS = {"bytes_py": PythonModel(CONFIG)}
"""bytes_py: a BYTES identity (tests/e2e/conftest.py's ``shared_side_by_side`` serves it)."""


def _el(text: bytes) -> bytes:
    return struct.pack("<I", len(text)) + text


def _infer(server: ServerProcess | RealTriton, raw: bytes, shape: list[int]) -> str:
    """One ModelInfer of bytes_py with ``raw`` as INPUT0's raw_input_contents: "served" or
    "<code>: <message>"."""
    req = service_pb2.ModelInferRequest(model_name="bytes_py")
    t = req.inputs.add()
    t.name, t.datatype = "INPUT0", "BYTES"
    t.shape.extend(shape)
    req.raw_input_contents.append(raw)
    with grpc.insecure_channel(server.url) as channel:
        try:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(req, timeout=30)
        except grpc.RpcError as e:
            return f"{e.code().name}: {e.details()}"
    return "served"


CASES = {
    # the second element says 100 bytes, 2 follow: the count (2) matches
    "cut last element": (
        _el(b"ab") + struct.pack("<I", 100) + b"xy",
        [1, 2],
        "INVALID_ARGUMENT: incomplete string data for inference input 'INPUT0', expecting "
        "string of length 100 but only 2 bytes available",
    ),
    # one element swallows the rest: counted once, the shape names 2
    "cut first of two": (
        struct.pack("<I", 0xFFFFFFFF) + b"abc",
        [1, 2],
        "INVALID_ARGUMENT: [request id: <id_unknown>] expected 2 string elements for inference "
        "input 'INPUT0' for model 'bytes_py', got 1",
    ),
    "whole": (_el(b"ab") + _el(b"cde"), [1, 2], "served"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_cut_bytes_element_is_refused_as_triton_does(
    shared_side_by_side: dict[str, ServerProcess | RealTriton], case: str
) -> None:
    raw, shape, expected = CASES[case]
    for name, server in shared_side_by_side.items():
        assert _infer(server, raw, shape) == expected, name


def _fail_counts(server: ServerProcess | RealTriton) -> tuple[int, float]:
    """bytes_py's ``fail`` count and the sum of its ``nv_inference_request_failure``."""
    url = f"http://{server.http_url}/v2/models/bytes_py/stats"
    with urllib.request.urlopen(url, timeout=10) as r:
        stats = json.load(r)["model_stats"][0]["inference_stats"]
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics") as r:
        text = r.read().decode()
    pattern = r'^nv_inference_request_failure\{[^}]*model="bytes_py"[^}]*\} (\S+)$'
    return stats["fail"].get("count", 0), sum(
        float(v) for v in re.findall(pattern, text, re.MULTILINE)
    )


def test_a_cut_last_element_counts_as_a_failure(
    shared_side_by_side: dict[str, ServerProcess | RealTriton],
) -> None:
    raw, shape, _ = CASES["cut last element"]
    for name, server in sorted(shared_side_by_side.items()):  # Triton first: its half passes
        before = _fail_counts(server)
        _infer(server, raw, shape)
        # NOTE: the python backend reports a request's statistics after its answer is sent
        deadline = time.monotonic() + 5
        while _fail_counts(server) == before and time.monotonic() < deadline:
            time.sleep(0.05)
        after = _fail_counts(server)
        assert (after[0] - before[0], after[1] - before[1]) == (1, 1.0), name
