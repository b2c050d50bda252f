"""Answers whose text is too large for a ring record still reach the client, and the model
goes on serving: a python model's 100 KB error message (``TritonError`` or an exception's
text) and 65 KB of response parameters. Before, the client never got an answer, and a
100 KB exception held the worker in the log formatter (every later request hung)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.helpers.repos import write_python_model
from tests.helpers.server import ServerProcess, server_factory

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

CONFIG = """
name: "big_py"
backend: "python"
max_batch_size: 0
input [{ name: "IN", data_type: TYPE_INT32, dims: [ 1 ] }]
output [{ name: "OUT", data_type: TYPE_INT32, dims: [ 1 ] }]
"""
SOURCE = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
            v = int(x[0])
            if v == 1:
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("T" * 100000)))
            elif v == 2:
                raise RuntimeError("E" * 100000)
            elif v == 3:
                out.append(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUT", x)], parameters={"long": "p" * 65000}))
            else:
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x)]))
        return out
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server for the module: each test ends by checking it still answers normally."""
    repo = tmp_path_factory.mktemp("repo")
    write_python_model(repo, "big_py", CONFIG, SOURCE)
    with server_factory(tmp_path_factory.mktemp("logs")) as start:
        yield start(repo)


def _grpc(url: str, value: int) -> grpcclient.InferResult:
    client = grpcclient.InferenceServerClient(url)
    try:
        inp = grpcclient.InferInput("IN", [1], "INT32")
        inp.set_data_from_numpy(np.array([value], np.int32))
        return client.infer("big_py", [inp], client_timeout=20)
    finally:
        client.close()


def _http(url: str, value: int) -> requests.Response:
    body = {"inputs": [{"name": "IN", "datatype": "INT32", "shape": [1], "data": [value]}]}
    return requests.post(f"http://{url}/v2/models/big_py/infer", json=body, timeout=20)


def _answers_normally(server: ServerProcess) -> None:
    assert _grpc(server.url, 5).as_numpy("OUT").tolist() == [5]
    assert _http(server.http_url, 6).json()["outputs"][0]["data"] == [6]


def test_a_100kb_triton_error_reaches_the_client_cut(server: ServerProcess) -> None:
    with pytest.raises(InferenceServerException) as err:
        _grpc(server.url, 1)
    assert err.value.status() == "StatusCode.INTERNAL"
    # NOTE: a gRPC status carries 4 KiB at most (frontend.grpc.servicer.status_message).
    assert err.value.message().startswith("T" * 3000)
    # the worker cut it to 16 KiB first; the gRPC cut keeps the end, the worker's marker
    assert err.value.message().endswith("T" * 900 + "... [83616 more bytes cut]")
    resp = _http(server.http_url, 1)
    assert resp.status_code == 500
    assert resp.json()["error"] == "T" * 16384 + "... [83616 more bytes cut]"
    _answers_normally(server)


def test_a_100kb_exception_fails_its_batch_and_the_worker_goes_on(
    server: ServerProcess,
) -> None:
    with pytest.raises(InferenceServerException) as err:
        _grpc(server.url, 2)
    assert "E" * 1000 in err.value.message()
    _answers_normally(server)


def test_65kb_of_response_parameters_answer_an_error(server: ServerProcess) -> None:
    with pytest.raises(InferenceServerException) as err:
        _grpc(server.url, 3)
    assert err.value.status() == "StatusCode.INTERNAL"
    assert "response parameters of 65012 bytes are too large to send" in err.value.message()
    assert _http(server.http_url, 3).status_code == 500
    _answers_normally(server)
