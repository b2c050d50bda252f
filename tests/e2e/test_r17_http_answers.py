"""HTTP answers side by side with the real Triton 2.51 on the session's shared pair: a queue
timeout's ``Content-Type``, a request with many header fields; and the header limits that
differ (docs/differences.md), over HTTP and gRPC.

2.51 answers a request its dynamic batcher's queue policy timed out in the request's response
(core ``PriorityQueue`` rejects it with "Request timeout expired"); HandleInfer's
``FinalizeResponse`` returns that error before anything names a type, so libevhtp labels it
``text/plain``, as a backend's error (tests/e2e/test_r16_http_answers.py). libevhtp takes any
number of header fields (each line up to 8190 bytes, as aiohttp's default), so a request with
hundreds of them is read and answered as any other.
"""

from __future__ import annotations

import http.client
import json

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

import triton_mp
from tests.e2e.test_r13_queue_timeout import SIDE_BY_SIDE_MODELS as TIMED_MODELS
from tests.helpers.server import ServerProcess
from tests.helpers.triton_peer import Ensemble, PythonModel, RealTriton

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SIDE_BY_SIDE_MODELS = {
    **TIMED_MODELS,
    "r17_refuser": PythonModel(
        """
        backend: "python"
        max_batch_size: 4
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
        """,
        """
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                error = pb_utils.TritonError("r17_refuser refuses every request")
                return [pb_utils.InferenceResponse(error=error) for _ in requests]
        """,
    ),
    "r17_pass": PythonModel(
        """
        backend: "python"
        max_batch_size: 4
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
        """
    ),
    "r17_pass_ens": Ensemble(
        """
        platform: "ensemble"
        max_batch_size: 4
        input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
        ensemble_scheduling { step [ { model_name: "r17_pass" model_version: -1
          input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "OUT" } } ] }
        """
    ),
    "r17_refuser_ens": Ensemble(
        """
        platform: "ensemble"
        max_batch_size: 4
        input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
        ensemble_scheduling { step [ { model_name: "r17_refuser" model_version: -1
          input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "OUT" } } ] }
        """
    ),
}
"""timed_py: an INT32 [1] identity behind a REJECT queue policy whose timeout a request may
override (tests/e2e/test_r13_queue_timeout.py; the shared pair serves it once);
r17_refuser_ens: an ensemble whose one step, r17_refuser, answers every request an error;
r17_pass_ens: an ensemble of one identity step."""

Server = ServerProcess | RealTriton


def _post(
    server: Server, path: str, body: object, headers: dict[str, str] | None = None
) -> tuple[int, str, object]:
    """POST ``body`` as JSON to ``path``: (status, Content-Type, the answer's JSON)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
    try:
        conn.request("POST", path, body=json.dumps(body).encode(), headers=headers or {})
        r = conn.getresponse()
        return r.status, r.getheader("Content-Type", ""), json.loads(r.read())
    finally:
        conn.close()


def _timed(timeout_us: int) -> dict[str, object]:
    """An inference of timed_py whose queue timeout is ``timeout_us``."""
    tensor = {"name": "INPUT0", "shape": [1, 1], "datatype": "INT32", "data": [3]}
    return {"inputs": [tensor], "parameters": {"timeout": timeout_us}}


def test_a_queue_timeout_is_answered_text_plain(
    shared_side_by_side: dict[str, Server],
) -> None:
    for name, server in shared_side_by_side.items():
        answer = _post(server, "/v2/models/timed_py/infer", _timed(1))
        assert answer == (503, "text/plain", {"error": "Request timeout expired"}), name
        status, kind, _ = _post(server, "/v2/models/timed_py/infer", _timed(5_000_000))
        assert (status, kind) == (200, "application/json"), name


def test_an_ensemble_steps_error_is_answered_text_plain(
    shared_side_by_side: dict[str, Server],
) -> None:
    tensor = {"name": "IN", "shape": [1, 4], "datatype": "FP32", "data": [0, 1, 2, 3]}
    for name, server in shared_side_by_side.items():
        answer = _post(server, "/v2/models/r17_refuser_ens/infer", {"inputs": [tensor]})
        why = "in ensemble 'r17_refuser_ens', r17_refuser refuses every request"
        assert answer == (500, "text/plain", {"error": why}), name


def test_an_ensembles_response_carries_its_requests_sequence_parameters(
    shared_side_by_side: dict[str, Server],
) -> None:
    tensor = {"name": "IN", "shape": [1, 4], "datatype": "FP32", "data": [0, 1, 2, 3]}
    x = grpcclient.InferInput("IN", [1, 4], "FP32")
    x.set_data_from_numpy(np.zeros((1, 4), np.float32))
    for name, server in shared_side_by_side.items():
        _, _, answer = _post(server, "/v2/models/r17_pass_ens/infer", {"inputs": [tensor]})
        assert answer["parameters"] == {  # type: ignore[index]
            "sequence_id": 0,
            "sequence_start": False,
            "sequence_end": False,
        }, name
        with grpcclient.InferenceServerClient(server.url) as c:
            got = c.infer("r17_pass_ens", [x], sequence_id=7, sequence_start=True)
        params = got.get_response().parameters
        assert (
            params["sequence_id"].int64_param,
            params["sequence_start"].bool_param,
            params["sequence_end"].bool_param,
            len(params),
        ) == (7, True, False, 3), name


def test_hundreds_of_header_fields_are_read(
    shared_side_by_side: dict[str, Server],
) -> None:
    headers = {f"X-Field-{i}": "v" * 100 for i in range(600)}
    for name, server in shared_side_by_side.items():
        status, kind, answer = _post(
            server, "/v2/models/timed_py/infer", _timed(5_000_000), headers
        )
        assert (status, kind) == (200, "application/json"), (name, answer)
        assert answer["outputs"][0]["data"] == [3], name  # type: ignore[index]


def test_a_header_line_over_8190_bytes_is_refused_without_a_traceback(
    shared_side_by_side: dict[str, Server],
) -> None:
    ours = shared_side_by_side["triton-mp"]
    assert isinstance(ours, ServerProcess)
    conn = http.client.HTTPConnection("127.0.0.1", ours.http_port, timeout=60)
    try:
        conn.request("POST", "/v2/models/timed_py/infer", body=b"{}", headers={"X-Big": "v" * 9000})
        r = conn.getresponse()
        assert r.status == 400
        assert r.read().decode().startswith("Got more than 8190 bytes when reading: b'vvv")
    finally:
        conn.close()
    status, _, _ = _post(ours, "/v2/models/timed_py/infer", _timed(5_000_000))
    assert status == 200
    assert "Error handling request" not in ours.log()
    assert "LineTooLong" not in ours.log()


def _grpc_answer(server: Server, metadata_bytes: int) -> str:
    """A timed_py inference over gRPC with one header of ``metadata_bytes``: "served" or the
    refusal's status and message."""
    t = grpcclient.InferInput("INPUT0", [1, 1], "INT32")
    t.set_data_from_numpy(np.array([[3]], np.int32))
    with grpcclient.InferenceServerClient(server.url) as c:
        try:
            c.infer("timed_py", [t], headers={"x-big": "v" * metadata_bytes})
        except InferenceServerException as e:
            return f"{e.status()}: {e.message()}"
    return "served"


def test_grpc_metadata_up_to_16_kib_is_served_and_more_refused(
    shared_side_by_side: dict[str, Server],
) -> None:
    """2.51 serves 8-16 KiB at random (a soft limit ramping to a hard one): ours always."""
    for name, server in shared_side_by_side.items():
        assert _grpc_answer(server, 7000) == "served", name
        refused = _grpc_answer(server, 20000)
        assert refused.startswith(f"{grpc.StatusCode.RESOURCE_EXHAUSTED}: received "), name
    ours = shared_side_by_side["triton-mp"]
    assert [_grpc_answer(ours, n) for n in (9000, 15500)] == ["served", "served"]
    status = grpc.StatusCode.RESOURCE_EXHAUSTED
    assert _grpc_answer(ours, 16500) == f"{status}: received initial metadata size exceeds limit"
    if "triton" in shared_side_by_side:
        theirs = _grpc_answer(shared_side_by_side["triton"], 16500)
        assert theirs.startswith(f"{status}: received metadata size exceeds hard limit (")


def test_server_metadata_differs_in_version_and_the_cuda_extension_only(
    shared_side_by_side: dict[str, Server],
) -> None:
    if "triton" not in shared_side_by_side:
        pytest.skip("the real Triton is not installed")
    answers = {}
    for name, server in shared_side_by_side.items():
        conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
        try:
            conn.request("GET", "/v2")
            answers[name] = json.loads(conn.getresponse().read())
        finally:
            conn.close()
    theirs, ours = answers["triton"], answers["triton-mp"]
    assert (theirs["name"], theirs["version"]) == ("triton", "2.51.0")
    assert (ours["name"], ours["version"]) == ("triton", triton_mp.__version__)
    assert [e for e in theirs["extensions"] if e != "cuda_shared_memory"] == ours["extensions"]
