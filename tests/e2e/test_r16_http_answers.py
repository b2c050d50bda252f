"""HTTP inference answers side by side with the real Triton 2.51 (python backend) on the
session's shared pair: the ``Content-Type`` of an error the backend makes, and the name a raw
binary request's input takes in core's later checks.

2.51's HandleInfer names ``application/json`` for an error only on its synchronous error
path; an error that comes back in the response (``FinalizeResponse``: the backend refused or
failed the request) goes out before anything names a type, so libevhtp labels it
``text/plain``. A raw binary request (``Inference-Header-Content-Length: 0``) adds its input
as "raw_input" (``EVBufferToRawInput``); core renames the tensor to the config's input but
keeps it keyed by the raw name, which its byte-size and BYTES checks print.
"""

from __future__ import annotations

import http.client
import json

import pytest

from tests.helpers.server import ServerProcess
from tests.helpers.triton_peer import PythonModel, RealTriton

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SIDE_BY_SIDE_MODELS = {
    "r16_strings": PythonModel(
        """
        backend: "python"
        input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
        """
    ),
    "r16_fixed": PythonModel(
        """
        backend: "python"
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
        """,
        """
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                out = []
                for r in requests:
                    t = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
                    if t[0] < 0:
                        error = pb_utils.TritonError("r16_fixed refuses a negative first value")
                        out.append(pb_utils.InferenceResponse(error=error))
                    else:
                        out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", t)]))
                return out
        """,
    ),
}
"""r16_strings: BYTES [-1] identity; r16_fixed: FP32 [4] identity (no batching) that fails
a request whose first value is negative. Both served by tests/e2e/conftest.py's
``shared_side_by_side``."""

Server = ServerProcess | RealTriton


def _post(server: Server, model: str, body: bytes, header_length: int) -> tuple[int, str, bytes]:
    """POST ``body`` to the model's infer endpoint: (status, Content-Type, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
    try:
        headers = {"Inference-Header-Content-Length": str(header_length)}
        conn.request("POST", f"/v2/models/{model}/infer", body=body, headers=headers)
        r = conn.getresponse()
        return r.status, r.getheader("Content-Type", ""), r.read()
    finally:
        conn.close()


def _infer(server: Server, model: str, body: bytes, header_length: int) -> tuple[int, str, object]:
    """``_post`` with its answer's body read as JSON."""
    status, kind, answer = _post(server, model, body, header_length)
    return status, kind, json.loads(answer)


def _binary_strings(data: bytes) -> tuple[bytes, int]:
    """A one-element BYTES request whose serialised element is ``data``: (body, header
    length)."""
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "shape": [1],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(data)},
                }
            ]
        }
    ).encode()
    return header + data, len(header)


def test_a_backend_refusal_is_answered_as_plain_text(
    shared_side_by_side: dict[str, Server],
) -> None:
    """A string element whose length runs past its buffer passes core and is refused by
    the backend: 2.51's answer is in the response, labelled text/plain."""
    cut = (10).to_bytes(4, "little") + b"abc"
    error = (
        "incomplete string data for inference input 'INPUT0', expecting string of length 10 "
        "but only 3 bytes available"
    )
    whole = (3).to_bytes(4, "little") + b"abc"
    for name, server in sorted(shared_side_by_side.items()):  # Triton first
        assert _infer(server, "r16_strings", *_binary_strings(cut)) == (
            400,
            "text/plain",
            {"error": error},
        ), name
        # The request core refuses itself is answered on its synchronous path: JSON.
        status, kind, _ = _infer(server, "r16_strings", *_binary_strings(whole + b"x"))
        assert (status, kind) == (400, "application/json"), name


def test_a_model_error_is_answered_as_plain_text(
    shared_side_by_side: dict[str, Server],
) -> None:
    """The model's error comes back in the response: text/plain, as the refusal above."""
    body = json.dumps(
        {"inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [-1, 0, 0, 0]}]}
    ).encode()
    answers = {
        name: _infer(s, "r16_fixed", body, len(body)) for name, s in shared_side_by_side.items()
    }
    assert answers["triton-mp"] == (
        500,
        "text/plain",
        {"error": "r16_fixed refuses a negative first value"},
    )
    if "triton" in answers:
        assert answers["triton"] == answers["triton-mp"]


def test_a_raw_request_names_its_input_raw_input(
    shared_side_by_side: dict[str, Server],
) -> None:
    """Core's byte-size check after Normalize's rename prints the raw name; its own raw
    checks (not asked here) print the config's."""
    error = (
        "[request id: <id_unknown>] input byte size mismatch for input 'raw_input' for model "
        "'r16_fixed'. Expected 16, got 17"
    )
    for name, server in sorted(shared_side_by_side.items()):  # Triton first
        assert _infer(server, "r16_fixed", bytes(17), 0) == (
            400,
            "application/json",
            {"error": error},
        ), name
        status, kind, answer = _post(server, "r16_fixed", bytes(16), 0)
        assert (status, kind) == (200, "application/octet-stream"), (name, answer)


def test_a_key_given_twice_in_an_input_takes_its_last_value(
    shared_side_by_side: dict[str, Server],
) -> None:
    """rapidjson keeps a repeated key's first value (2.51 serves this request); triton-mp's
    JSON decoder keeps the last (docs/differences.md)."""
    body = json.dumps(
        {"inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
    ).encode()
    body = body.replace(b'"name": "INPUT0"', b'"name": "INPUT0", "name": "X"')
    ours = shared_side_by_side["triton-mp"]
    assert _infer(ours, "r16_fixed", body, len(body)) == (
        400,
        "application/json",
        {"error": "unexpected inference input 'X' for model 'r16_fixed'"},
    )
    if "triton" in shared_side_by_side:
        theirs = _post(shared_side_by_side["triton"], "r16_fixed", body, len(body))
        assert theirs[:2] == (200, "application/json")
