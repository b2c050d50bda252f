"""``--grpc-header-forward-pattern`` / ``--http-header-forward-pattern`` end to end: headers
a tritonclient sends whose name the pattern matches reach a python model's
``request.parameters()``, after the request's own parameters (a header replaces a
parameter of its name), over gRPC ModelInfer, ModelStreamInfer and HTTP, side by side with
the real Triton 2.51 (``.peers/``). Reserved names are refused as upstream main does since
server PR #8763 (Triton 2.51 forwards them: triton-mp alone)."""

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

from tests.helpers.repos import write_python_model
from tests.helpers.server import server_factory
from tests.helpers.triton_peer import start_triton

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

PATTERN = "^(my-|triton_|priority$)"
"""Also matches reserved names: forwarding them is what upstream main refuses."""
FLAGS = (
    # NOTE: upper case for gRPC, whose metadata keys are lower case: the pattern matches in
    # any case (tritonserver prefixes it with (?i)).
    f"--grpc-header-forward-pattern={PATTERN.upper()}",
    f"--http-header-forward-pattern={PATTERN}",
)

ECHO_CONFIG = """
name: "echo_params"
backend: "python"
max_batch_size: 0
input [{ name: "IN", data_type: TYPE_INT32, dims: [ 1 ] }]
output [{ name: "OUT", data_type: TYPE_STRING, dims: [ 1 ] }]
"""
ECHO_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", np.array([r.parameters().encode()], dtype=np.object_))
            ])
            for r in requests
        ]
"""

HEADERS = {"my-a": "1", "my-b": "from-header", "x-my-c": "no", "other": "no"}
PARAMETERS = {"p": "q", "my-b": "from-parameter"}
EXPECTED = {"p": "q", "my-a": "1", "my-b": "from-header"}
"""``PATTERN`` matches my-a and my-b only; my-b's header value replaces the parameter."""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("hdrfwd")
    write_python_model(repo, "echo_params", ECHO_CONFIG, ECHO_MODEL)
    return repo


@pytest.fixture(scope="module")
def ours(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    with server_factory(tmp_path_factory.mktemp("logs")) as start:
        server = start(repo, *FLAGS)
        yield server.url, server.http_url


@pytest.fixture(scope="module")
def triton(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    with start_triton(repo, tmp_path_factory.mktemp("triton") / "triton.log", *FLAGS) as peer:
        yield peer.url, peer.http_url


def _in(module: object) -> object:
    inp = module.InferInput("IN", [1], "INT32")  # type: ignore[attr-defined]
    inp.set_data_from_numpy(np.array([1], np.int32))
    return inp


def _params(result: object) -> dict[str, object]:
    out: dict[str, object] = json.loads(result.as_numpy("OUT")[0])  # type: ignore[attr-defined]
    return out


@pytest.mark.parametrize("which", ["triton-mp", "triton"])
def test_matching_headers_reach_the_model_after_its_parameters(
    which: str, request: pytest.FixtureRequest
) -> None:
    grpc_url, http_url = request.getfixturevalue("ours" if which == "triton-mp" else "triton")
    g = grpcclient.InferenceServerClient(grpc_url)
    got = g.infer("echo_params", [_in(grpcclient)], headers=HEADERS, parameters=PARAMETERS)
    assert _params(got) == EXPECTED
    # No header matches: the request's own parameters only.
    got = g.infer("echo_params", [_in(grpcclient)], headers={"other": "x"}, parameters={"p": "q"})
    assert _params(got) == {"p": "q"}
    # Binary metadata: its decoded bytes, as a C string (up to the first NUL).
    binary = {"my-e-bin": b"ab\x00cd", "my-f-bin": b"\x01\x02z"}
    got = g.infer("echo_params", [_in(grpcclient)], headers=binary)  # type: ignore[arg-type]
    assert _params(got) == {"my-e-bin": "ab", "my-f-bin": "\x01\x02z"}

    # A stream's metadata is forwarded with each of its requests.
    answers: queue.Queue[object] = queue.Queue()
    g.start_stream(lambda result, error: answers.put(error or result), headers=HEADERS)
    try:
        for _ in range(2):
            g.async_stream_infer("echo_params", [_in(grpcclient)], parameters=PARAMETERS)
        for _ in range(2):
            assert _params(answers.get(timeout=60)) == EXPECTED
    finally:
        g.stop_stream()
    g.close()

    h = httpclient.InferenceServerClient(http_url)
    # Matched in any case (tritonserver prefixes the pattern with (?i)); the parameter keeps
    # the name as sent.
    got = h.infer(
        "echo_params",
        [_in(httpclient)],
        headers={**HEADERS, "My-D": "4"},
        parameters=PARAMETERS,
    )
    assert _params(got) == {**EXPECTED, "My-D": "4"}
    h.close()


@pytest.mark.parametrize("name", ["triton_secret", "priority"])
def test_reserved_header_names_are_refused_as_upstream_main(
    ours: tuple[str, str], name: str
) -> None:
    grpc_url, http_url = ours
    message = f"Header '{name}' is reserved for Triton usage and cannot be forwarded."
    g = grpcclient.InferenceServerClient(grpc_url)
    with pytest.raises(InferenceServerException) as e:
        g.infer("echo_params", [_in(grpcclient)], headers={name: "1"})
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert e.value.message() == message
    g.close()
    h = httpclient.InferenceServerClient(http_url)
    with pytest.raises(InferenceServerException) as e:
        h.infer("echo_params", [_in(httpclient)], headers={name: "1"})
    assert e.value.status() == "400"
    assert e.value.message() == message
    # The server keeps serving.
    assert _params(h.infer("echo_params", [_in(httpclient)], headers={"my-a": "1"})) == {
        "my-a": "1"
    }
    h.close()
