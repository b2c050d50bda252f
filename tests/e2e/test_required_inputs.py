"""A request that has the right number of inputs but lacks a required one, end to end.

Triton's core (``InferenceRequest::ValidateRequestInputs``) counts a request's inputs against
the model's required and total counts, and checks each given input is the model's; it does
not check that every required input is among them. So with an optional input present in
place of a required one, the request reaches the backend, and a python model sees it
without the required input (``get_input_tensor_by_name`` gives None). Run side by side with
the real Triton 2.51 (``.peers/``), over gRPC and HTTP, for an unbatched model and a batched
one with dynamic batching. And, as core's ``RequiredEqualInputs``, requests to a model with
optional inputs share a dynamic batch only when they give the same inputs.
"""

from __future__ import annotations

import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.helpers.server import ServerProcess
from tests.helpers.triton_peer import PythonModel, RealTriton, urls_of

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: {mbs}
input [
  {{ name: "REQ", data_type: TYPE_FP32, dims: [ 2 ] }},
  {{ name: "OPT", data_type: TYPE_FP32, dims: [ 2 ], optional: true }}
]
output [{{ name: "GOT", data_type: TYPE_STRING, dims: [ 1 ] }}]
{batching}
"""
MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            names = ",".join(
                n for n in ("REQ", "OPT") if pb_utils.get_input_tensor_by_name(r, n) is not None
            )
            got = np.array([names.encode()], dtype=np.object_)
            given = [pb_utils.get_input_tensor_by_name(r, n) for n in ("REQ", "OPT")]
            shape = next(t for t in given if t is not None).as_numpy().shape
            if len(shape) == 2:
                got = np.repeat(got[None, :], shape[0], axis=0)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("GOT", got)]))
        return out
"""
COUNTED_CONFIG = """
name: "counted"
backend: "python"
max_batch_size: 4
input [
  { name: "REQ", data_type: TYPE_FP32, dims: [ 2 ] },
  { name: "OPT", data_type: TYPE_FP32, dims: [ 2 ], optional: true }
]
output [{ name: "N", data_type: TYPE_INT32, dims: [ 1 ] }]
dynamic_batching { max_queue_delay_microseconds: 400000 }
"""
COUNTED_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        n = np.array([[len(requests)]], np.int32)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("N", n)]) for _ in requests]
"""
SIDE_BY_SIDE_MODELS = {
    "opt_plain": PythonModel(CONFIG.format(name="opt_plain", mbs=0, batching=""), MODEL),
    "opt_batched": PythonModel(
        CONFIG.format(name="opt_batched", mbs=4, batching="dynamic_batching { }"), MODEL
    ),
    "counted": PythonModel(COUNTED_CONFIG, COUNTED_MODEL),
}
"""tests/e2e/conftest.py's ``shared_side_by_side`` serves them."""


def _inputs(module: object, names: tuple[str, ...], batched: bool) -> list[object]:
    shape = [1, 2] if batched else [2]
    made = []
    for n in names:
        t = module.InferInput(n, shape, "FP32")  # type: ignore[attr-defined]
        t.set_data_from_numpy(np.ones(shape, np.float32))
        made.append(t)
    return made


@pytest.mark.parametrize("which", ["triton-mp", "triton"])
@pytest.mark.parametrize("model", ["opt_plain", "opt_batched"])
def test_an_optional_input_in_place_of_a_required_one_reaches_the_model(
    which: str, model: str, shared_side_by_side: dict[str, ServerProcess | RealTriton]
) -> None:
    grpc_url, http_url = urls_of(shared_side_by_side, which)
    batched = model == "opt_batched"
    g = grpcclient.InferenceServerClient(grpc_url)
    h = httpclient.InferenceServerClient(http_url)
    try:
        for names, seen in ((("OPT",), b"OPT"), (("REQ",), b"REQ"), (("REQ", "OPT"), b"REQ,OPT")):
            for client, module in ((g, grpcclient), (h, httpclient)):
                got = client.infer(model, _inputs(module, names, batched)).as_numpy("GOT")
                assert got.reshape(-1).tolist() == [seen], (names, module.__name__)
    finally:
        g.close()
        h.close()


@pytest.mark.parametrize("which", ["triton-mp", "triton"])
def test_requests_batch_together_only_with_the_same_inputs(
    which: str, shared_side_by_side: dict[str, ServerProcess | RealTriton]
) -> None:
    grpc_url, _ = urls_of(shared_side_by_side, which)
    g = grpcclient.InferenceServerClient(grpc_url)
    try:
        for first, second, together in (
            (("REQ",), ("REQ",), True),
            (("REQ", "OPT"), ("OPT", "REQ"), True),
            (("REQ",), ("REQ", "OPT"), False),
        ):
            answers: queue.Queue[object] = queue.Queue()
            for names in (first, second):
                g.async_infer(
                    "counted",
                    _inputs(grpcclient, names, True),
                    lambda result, error, q=answers: q.put(error or result),
                )
            got = [answers.get(timeout=60) for _ in range(2)]
            sizes = [int(r.as_numpy("N")[0, 0]) for r in got]  # type: ignore[attr-defined]
            assert sizes == ([2, 2] if together else [1, 1]), (first, second)
    finally:
        g.close()
