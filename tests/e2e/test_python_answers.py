"""What a python model's answer looks like, side by side: every case runs against triton-mp
and, where ``.peers/`` has it, the real Triton 2.51 on the same models, over gRPC and HTTP
(tritonclient), and both must answer alike: outputs in the order the model put them in its
``output_tensors`` (core adds them as the backend does; the requested order does not count),
and the stub's refusal of a returned value that is not one response per request, prefixed
"Failed to process the request(s) for model '<instance>', message: " for every request of
the batch (python_backend ``pb_stub.cc`` ProcessRequests / ProcessReturnedResponses).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.helpers.repos import write_python_model
from tests.helpers.server import ServerProcess
from tests.helpers.triton_peer import RealTriton, peers_env

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

MODEL = """
import json
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        mode = json.loads(requests[0].parameters() or "{}").get("mode", "ok")
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
            a, b = pb_utils.Tensor("OUT", x + 1), pb_utils.Tensor("OUT2", x * 2)
            out.append(pb_utils.InferenceResponse([b, a] if mode == "reversed" else [a, b]))
        if mode == "none returned":
            return []
        if mode == "one short":
            return out[1:]
        if mode == "a tuple":
            return tuple(out)
        if mode == "a string among them":
            return [out[0], "nope"]
        return out
"""
CONFIG = """
name: "%(name)s"
backend: "python"
max_batch_size: %(mbs)d
input [{ name: "IN", data_type: TYPE_FP32, dims: [ -1 ] }]
output [
  { name: "OUT", data_type: TYPE_FP32, dims: [ -1 ] },
  { name: "OUT2", data_type: TYPE_FP32, dims: [ -1 ] }
]
%(batching)s
"""
BATCHING = "dynamic_batching { max_queue_delay_microseconds: 2000000 preferred_batch_size: [2] }"


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[str, str]]]:
    """(gRPC, HTTP) URLs: ``triton-mp`` always, ``triton`` when the real Triton is installed."""
    repo = tmp_path_factory.mktemp("answers") / "repo"
    write_python_model(
        repo, "order_py", CONFIG % {"name": "order_py", "mbs": 0, "batching": ""}, MODEL
    )
    two = {"name": "pair_py", "mbs": 8, "batching": BATCHING}
    write_python_model(repo, "pair_py", CONFIG % two, MODEL)
    logs = tmp_path_factory.mktemp("logs")
    ours = ServerProcess(repo, logs / "ours.log")
    theirs: RealTriton | None = None
    try:
        env = peers_env()
        if env is not None:  # NOTE: started before ours is live: side by side
            theirs = RealTriton(env, logs / "triton.log", f"--model-repository={repo}")
        ours.wait_live()
        urls = {"triton-mp": (ours.url, ours.http_url)}
        if theirs is not None:
            theirs.wait_live()
            urls["triton"] = (theirs.url, theirs.http_url)
        yield urls
    finally:
        if theirs is not None:
            theirs.stop(wait=False)
        ours.stop()


def _client(urls: tuple[str, str], over: str) -> Any:
    return (
        grpcclient.InferenceServerClient(urls[0])
        if over == "grpc"
        else (httpclient.InferenceServerClient(urls[1], concurrency=2))
    )


def _input(over: str, shape: list[int]) -> Any:
    mod = grpcclient if over == "grpc" else httpclient
    x = mod.InferInput("IN", shape, "FP32")
    x.set_data_from_numpy(np.ones(shape, np.float32))
    return x


def _names(result: Any, over: str) -> list[str]:
    resp = result.get_response()
    return (
        [o.name for o in resp.outputs] if over == "grpc" else [o["name"] for o in resp["outputs"]]
    )


@pytest.mark.parametrize("over", ["grpc", "http"])
def test_outputs_come_in_the_models_order_whatever_the_request_names(
    servers: dict[str, tuple[str, str]], over: str
) -> None:
    mod = grpcclient if over == "grpc" else httpclient
    expected = {
        (None, "ok"): ["OUT", "OUT2"],
        (None, "reversed"): ["OUT2", "OUT"],
        (("OUT2", "OUT"), "ok"): ["OUT", "OUT2"],
        (("OUT2", "OUT"), "reversed"): ["OUT2", "OUT"],
        (("OUT", "OUT2"), "reversed"): ["OUT2", "OUT"],
        (("OUT2",), "reversed"): ["OUT2"],
    }
    for side, urls in servers.items():
        client = _client(urls, over)
        try:
            for (requested, mode), names in expected.items():
                outputs = (
                    None if requested is None else [mod.InferRequestedOutput(n) for n in requested]
                )
                res = client.infer(
                    "order_py", [_input(over, [3])], outputs=outputs, parameters={"mode": mode}
                )
                assert _names(res, over) == names, (side, requested, mode)
                np.testing.assert_array_equal(res.as_numpy("OUT2"), np.full(3, 2, np.float32))
        finally:
            client.close()


def _pair(client: Any, over: str, mode: str) -> list[tuple[str, str]]:
    """Two requests sent together (one batch of 2): each one's (status, message)."""
    params = {"mode": mode}
    got: list[tuple[str, str]] = []
    if over == "http":
        pending = [
            client.async_infer("pair_py", [_input(over, [1, 2])], parameters=params)
            for _ in range(2)
        ]
        for p in pending:
            try:
                p.get_result()
                got.append(("OK", ""))
            except InferenceServerException as e:
                got.append((str(e.status()), e.message() or ""))
        return got
    done = threading.Semaphore(0)

    def back(result: object, error: InferenceServerException | None) -> None:  # noqa: ARG001
        got.append(("OK", "") if error is None else (str(error.status()), error.message()))
        done.release()

    for _ in range(2):
        client.async_infer("pair_py", [_input(over, [1, 2])], back, parameters=params)
    for _ in range(2):
        assert done.acquire(timeout=60)
    return got


# NOTE: a config without instance_group gets one group named after the model (core
# NormalizeInstanceGroup), so its instance is 'pair_py_0' in both servers; a group listed
# without a name is '<model>_<index>', its instances '<model>_0_0', ...
FAILED = "Failed to process the request(s) for model 'pair_py_0', message: "
COUNT = (
    "Number of InferenceResponse objects do not match the number of InferenceRequest objects. "
    "InferenceRequest(s) size is:2, and InferenceResponse(s) size is:%d\n"
)
REFUSALS = {
    "none returned": FAILED + COUNT % 0,
    "one short": FAILED + COUNT % 1,
    "a tuple": FAILED + "Expected a list in the execute return, found type '<class 'tuple'>'.",
    "a string among them": FAILED + "Expected an 'InferenceResponse' object in the execute "
    "function return list, found type '<class 'str'>'.",
}


@pytest.mark.parametrize("over", ["grpc", "http"])
def test_a_return_that_is_not_one_response_per_request_fails_every_request_of_the_batch(
    servers: dict[str, tuple[str, str]], over: str
) -> None:
    status = "StatusCode.INTERNAL" if over == "grpc" else "500"
    for side, urls in servers.items():
        client = _client(urls, over)
        try:
            for mode, message in REFUSALS.items():
                assert _pair(client, over, mode) == [(status, message)] * 2, (side, mode)
            assert _pair(client, over, "ok") == [("OK", "")] * 2, side
        finally:
            client.close()
