"""End to end: the recent python-backend API, through tritonclient gRPC and HTTP.

One repository of python models written here, served by triton-mp and, where the peers
are installed (``.peers/``), by the real Triton 2.51 in the same test; the answers are
compared where 2.51 has the feature (each test says). Covered: response parameters
(``InferenceResponse(parameters=...)``) reaching the client over gRPC, HTTP and a decoupled
stream, upstream's validation messages, and a BLS response's ``parameters()`` from the
called model.
"""

from __future__ import annotations

import json
import queue
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import server_factory, write_python_model
from tests.server import ServerProcess
from tests.triton_peer import start_triton

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

PARAMS_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
"""
PARAMS_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils

BAD = {1: {"ratio": 1.5}, 2: {3: "three"}, 3: {"items": [1]}}


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0])
            out = [pb_utils.Tensor("OUT", np.array([mode], np.int32))]
            if mode in BAD:
                try:
                    pb_utils.InferenceResponse(out, parameters=BAD[mode])
                    text = "accepted"
                except Exception as e:
                    text = str(e)
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(text, pb_utils.TritonError.INVALID_ARG)))
                continue
            params = {"flag": True, "count": 7 + mode, "name": "ok", "off": False}
            responses.append(pb_utils.InferenceResponse(out, parameters=params))
        return responses
"""
"""MODE 0: a response with one parameter of each type; 1-3: the message upstream's
constructor raises for a float value, an int key, a list value."""

PARAMS_DEC_CONFIG = """
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
PARAMS_DEC_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            sender = request.get_response_sender()
            for i in range(n):
                sender.send(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUT", np.array([i], np.int32))],
                    parameters={"index": i, "last": i == n - 1}))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

BLS_PARAMS_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "PARAMS" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
BLS_PARAMS_MODEL = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            mode = pb_utils.get_input_tensor_by_name(request, "MODE")
            answer = pb_utils.InferenceRequest(
                model_name="params_py", requested_output_names=["OUT"], inputs=[mode]
            ).exec()
            seen = json.loads(answer.parameters())
            text = json.dumps(seen, sort_keys=True).encode()
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("PARAMS", np.array([text], np.object_))]))
        return responses
"""
"""Calls ``params_py`` through BLS and returns the parameters of its response."""

EXPECTED_PARAMS = {"flag": True, "count": 7, "name": "ok", "off": False}


def _repository(root: Path) -> Path:
    repo = root / "repo"
    repo.mkdir()
    write_python_model(repo, "params_py", PARAMS_CONFIG, PARAMS_MODEL)
    write_python_model(repo, "params_dec_py", PARAMS_DEC_CONFIG, PARAMS_DEC_MODEL)
    write_python_model(repo, "bls_params_py", BLS_PARAMS_CONFIG, BLS_PARAMS_MODEL)
    return repo


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _repository(tmp_path_factory.mktemp("pyapi"))


@pytest.fixture(scope="module")
def server(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with server_factory(tmp_path_factory.mktemp("logs")) as start:
        yield start(repo)


@pytest.fixture(scope="module")
def triton(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """The real Triton on the same repository: (gRPC url, HTTP url), or a skip."""
    peer = start_triton(repo, tmp_path_factory.mktemp("triton") / "triton.log")
    try:
        yield peer.url, peer.http_url
    finally:
        peer.stop()


def _urls(server: ServerProcess, request: pytest.FixtureRequest, which: str) -> tuple[str, str]:
    if which == "triton-mp":
        return server.url, server.http_url
    result: tuple[str, str] = request.getfixturevalue("triton")
    return result


SERVERS = pytest.mark.parametrize("which", ["triton-mp", "triton"])
"""Run the test against both servers (the feature exists in Triton 2.51)."""
MP_ONLY = pytest.mark.parametrize("which", ["triton-mp"])
"""Upstream main has the feature, Triton 2.51 does not: triton-mp alone."""


def _mode(value: int, module: object = grpcclient) -> object:
    inp = module.InferInput("MODE", [1], "INT32")  # type: ignore[attr-defined]
    inp.set_data_from_numpy(np.array([value], np.int32))
    return inp


def _grpc_params(response: object) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, p in response.parameters.items():  # type: ignore[attr-defined]
        out[key] = getattr(p, p.WhichOneof("parameter_choice"))
    return out


# ---------------------------------------------------------------- response parameters
# NOTE: upstream main only: the python backend of Triton 2.51 has no ``parameters=`` on
# ``InferenceResponse`` ("incompatible constructor arguments"), so these run against
# triton-mp alone, with upstream main's behaviour and messages (pb_stub.cc
# PyParametersToJSON, http_server.cc FinalizeResponse).


@MP_ONLY
def test_response_parameters_reach_grpc_and_http_clients(
    which: str, server: ServerProcess, request: pytest.FixtureRequest
) -> None:
    grpc_url, http_url = _urls(server, request, which)
    g = grpcclient.InferenceServerClient(grpc_url)
    h = httpclient.InferenceServerClient(http_url)
    try:
        result = g.infer("params_py", [_mode(0)])
        assert _grpc_params(result.get_response()) == EXPECTED_PARAMS
        assert result.as_numpy("OUT").tolist() == [0]
        body = h.infer("params_py", [_mode(0, httpclient)]).get_response()
        assert body["parameters"] == EXPECTED_PARAMS
        assert list(body).index("parameters") < list(body).index("outputs")
    finally:
        g.close()
        h.close()


@MP_ONLY
@pytest.mark.parametrize(
    ("mode", "message"),
    [
        (1, "Expect parameters values to have type bool/int/str, found type <class 'float'>"),
        (2, "Expect parameters keys to have type str, found type <class 'int'>"),
        (3, "Expect parameters values to have type bool/int/str, found type <class 'list'>"),
    ],
)
def test_response_parameters_of_other_types_are_refused_with_upstreams_message(
    which: str, mode: int, message: str, server: ServerProcess, request: pytest.FixtureRequest
) -> None:
    grpc_url, _ = _urls(server, request, which)
    g = grpcclient.InferenceServerClient(grpc_url)
    try:
        with pytest.raises(InferenceServerException) as err:
            g.infer("params_py", [_mode(mode)])
        assert message in err.value.message()
    finally:
        g.close()


@MP_ONLY
def test_decoupled_response_parameters_travel_with_each_stream_response(
    which: str, server: ServerProcess, request: pytest.FixtureRequest
) -> None:
    grpc_url, _ = _urls(server, request, which)
    g = grpcclient.InferenceServerClient(grpc_url)
    got: queue.Queue[object] = queue.Queue()
    g.start_stream(callback=lambda result, error: got.put(error or result))
    try:
        n = grpcclient.InferInput("N", [1], "INT32")
        n.set_data_from_numpy(np.array([3], np.int32))
        g.async_stream_infer("params_dec_py", [n])
        seen = []
        for _ in range(3):
            item = got.get(timeout=30)
            assert not isinstance(item, InferenceServerException), item
            params = _grpc_params(item.get_response())  # type: ignore[attr-defined]
            seen.append((params["index"], params["last"]))
        assert seen == [(0, False), (1, False), (2, True)]
    finally:
        g.stop_stream()
        g.close()


@MP_ONLY
def test_bls_response_exposes_the_called_models_parameters(
    which: str, server: ServerProcess, request: pytest.FixtureRequest
) -> None:
    _, http_url = _urls(server, request, which)
    h = httpclient.InferenceServerClient(http_url)
    try:
        result = h.infer("bls_params_py", [_mode(0, httpclient)])
        assert json.loads(result.as_numpy("PARAMS")[0]) == EXPECTED_PARAMS
    finally:
        h.close()
