"""Which of two bad inputs a refusal names, side by side with the real Triton 2.51.

Triton's core keeps a request's inputs in an ``unordered_map`` and walks it twice in
``InferenceRequest::Normalize``: first the batch dimension of every input (no shape, batch
mismatch; ``GetInput`` refuses an input the model lacks), then the batch size against
``max_batch_size``, then each input's datatype, shape and byte size. So a request with two bad
inputs is told about the one Triton meets first, which is not always the first one sent (for
two inputs libstdc++ yields the later one first). Every case runs over gRPC and HTTP against
triton-mp and, when ``.peers/`` has it, the real Triton; each must give the stated answer.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from tests.helpers.repos import FP32_PAIR_CONFIG
from tests.helpers.server import PROJECT_REPOSITORY, ServerProcess
from tests.helpers.triton_peer import PythonModel, RealTriton

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

RID = "[request id: <id_unknown>] "
NOTE = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension "
    "to be prepended to each input shape. If you want to specify the full shape including "
    "the batch dim in your input dims config, try setting max_batch_size to zero. See the "
    "model configuration docs for more info on max_batch_size."
)


def dtype(name: str, got: str, model: str) -> str:
    return f"{RID}inference input '{name}' data-type is '{got}', but model '{model}' expects 'FP32'"


def shape(name: str, expected: str, got: str, model: str, note: str = NOTE) -> str:
    return (
        f"{RID}unexpected shape for input '{name}' for model '{model}'. Expected {expected}, "
        f"got {got}. {note}"
    )


class Case(NamedTuple):
    model: str
    inputs: list[tuple[str, np.ndarray]]
    message: str


def f32(*dims: int) -> np.ndarray:
    return np.ones(dims, np.float32)


def f64(*dims: int) -> np.ndarray:
    return np.ones(dims, np.float64)


A = "add_sub_py"
"""INPUT0, INPUT1 FP32 [16], max_batch_size 8 (the project's repository)."""
SIDE_BY_SIDE_MODELS = {A: PROJECT_REPOSITORY / A, "m": PythonModel(FP32_PAIR_CONFIG)}
"""The project's add_sub_py and an identity ``m`` that does not batch (tests/e2e/conftest.py's
``shared_side_by_side`` serves them)."""
CASES = {
    "two wrong datatypes: the later one": Case(
        A, [("INPUT0", f64(1, 16)), ("INPUT1", f64(1, 16))], dtype("INPUT1", "FP64", A)
    ),
    "two wrong datatypes sent the other way round": Case(
        A, [("INPUT1", f64(1, 16)), ("INPUT0", f64(1, 16))], dtype("INPUT0", "FP64", A)
    ),
    "a batch mismatch before any datatype": Case(
        A,
        [("INPUT0", f64(1, 16)), ("INPUT1", f32(2, 16))],
        f"{RID}input 'INPUT0' batch size does not match other inputs for '{A}'",
    ),
    "a batch mismatch names the input met second": Case(
        A,
        [("INPUT1", f32(2, 16)), ("INPUT0", f32(1, 16))],
        f"{RID}input 'INPUT1' batch size does not match other inputs for '{A}'",
    ),
    "a batch over max_batch_size before any datatype": Case(
        A,
        [("INPUT0", f64(9, 16)), ("INPUT1", f32(9, 16))],
        f"{RID}inference request batch-size must be <= 8 for '{A}'",
    ),
    "two wrong shapes: the later one": Case(
        A,
        [("INPUT0", f32(1, 15)), ("INPUT1", f32(1, 14))],
        shape("INPUT1", "[-1,16]", "[1,14]", A),
    ),
    "a wrong shape met before a wrong datatype": Case(
        A,
        [("INPUT0", f64(1, 16)), ("INPUT1", f32(1, 14))],
        shape("INPUT1", "[-1,16]", "[1,14]", A),
    ),
    "no batching: a wrong shape met before a wrong datatype": Case(
        "m",
        [("INPUT0", f64(4)), ("INPUT1", f32(3))],
        shape("INPUT1", "[4]", "[3]", "m", note=""),
    ),
    "no batching: an unknown input before any datatype": Case(
        "m",
        [("BOGUS", f32(4)), ("INPUT0", f64(4))],
        "unexpected inference input 'BOGUS' for model 'm'",
    ),
    "two unknown inputs: the later one": Case(
        A,
        [("BOGUS1", f32(1, 16)), ("BOGUS2", f32(1, 16))],
        f"unexpected inference input 'BOGUS2' for model '{A}'",
    ),
    "a scalar met before an unknown input": Case(
        A,
        [("BOGUS", f32(2, 16)), ("INPUT0", f32())],
        f"{RID}input 'INPUT0' has no shape but model requires batch dimension for '{A}'",
    ),
    "no batching: an unknown input met first": Case(
        "m",
        [("INPUT0", f64(4)), ("BOGUS", f32(4))],
        "unexpected inference input 'BOGUS' for model 'm'",
    ),
}


def _grpc(url: str, case: Case) -> str:
    tensors = []
    for name, data in case.inputs:
        t = grpcclient.InferInput(name, list(data.shape), np_to_triton_dtype(data.dtype))
        t.set_data_from_numpy(data)
        tensors.append(t)
    with grpcclient.InferenceServerClient(url) as client:
        try:
            client.infer(case.model, tensors)
        except InferenceServerException as e:
            return f"{e.status()}: {e.message()}"
    return "served"


def _http(url: str, case: Case) -> str:
    tensors = []
    for name, data in case.inputs:
        t = httpclient.InferInput(name, list(data.shape), np_to_triton_dtype(data.dtype))
        t.set_data_from_numpy(data, binary_data=True)
        tensors.append(t)
    with httpclient.InferenceServerClient(url) as client:
        try:
            client.infer(case.model, tensors)
        except InferenceServerException as e:
            return f"{e.status()}: {e.message()}"
    return "served"


@pytest.mark.parametrize("name", list(CASES))
def test_the_refusal_names_the_input_triton_meets_first(
    shared_side_by_side: dict[str, ServerProcess | RealTriton], name: str
) -> None:
    case = CASES[name]
    for server, proc in shared_side_by_side.items():
        want = f"StatusCode.INVALID_ARGUMENT: {case.message}"
        assert _grpc(proc.url, case) == want, f"{server} gRPC"
        assert _http(proc.http_url, case) == f"400: {case.message}", f"{server} HTTP"


def test_good_requests_are_served_after_the_refusals(
    shared_side_by_side: dict[str, ServerProcess | RealTriton],
) -> None:
    good = Case(A, [("INPUT1", f32(2, 16)), ("INPUT0", f32(2, 16))], "served")
    for server, proc in shared_side_by_side.items():
        assert _grpc(proc.url, good) == "served", server
        assert _http(proc.http_url, good) == "served", server


def test_a_batch_of_zero_is_refused_in_triton_mps_own_words(
    shared_side_by_side: dict[str, ServerProcess | RealTriton],
) -> None:
    """2.51 answers "input byte size mismatch ... Expected 64, got 0" here (its batch size 0
    means none); triton-mp names the batch size (docs/differences.md)."""
    case = Case(
        A,
        [("INPUT0", f32(0, 16)), ("INPUT1", f32(0, 16))],
        f"{RID}inference request batch-size must be >= 1 for '{A}'",
    )
    ours = shared_side_by_side["triton-mp"]
    assert _grpc(ours.url, case) == f"StatusCode.INVALID_ARGUMENT: {case.message}"
    assert _http(ours.http_url, case) == f"400: {case.message}"
