"""The classification extension end to end: tritonclient's ``class_count`` over gRPC and
HTTP, side by side with the real Triton 2.51 (``.peers/``): the top k classes as
"<value>:<index>[:<label>]" BYTES, per batch entry for a batching model, labels from the
output's ``label_filename``; an output whose datatype has no classes is refused."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.helpers.server import ServerProcess
from tests.helpers.triton_peer import PythonModel, RealTriton, urls_of

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: {mbs}
input [{{ name: "IN", data_type: {dtype}, dims: [ 5 ] }}]
output [{{ name: "OUT", data_type: {dtype}, dims: [ 5 ]{labels} }}]
"""
MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]
            )
            for r in requests
        ]
"""
LABELS = "zero\none\ntwo\n"
"""Three labels for five classes: classes 3 and 4 have none."""
MODELS = {
    "scores": (4, "TYPE_FP32", True),
    "plain": (0, "TYPE_FP32", False),
    "counts": (0, "TYPE_INT32", True),
    "halves": (0, "TYPE_FP16", False),
}


def _model(name: str, mbs: int, dtype: str, labelled: bool) -> PythonModel:
    labels = ', label_filename: "labels.txt"' if labelled else ""
    config = CONFIG.format(name=name, mbs=mbs, dtype=dtype, labels=labels)
    return PythonModel(config, MODEL, (("labels.txt", LABELS),) if labelled else ())


SIDE_BY_SIDE_MODELS = {name: _model(name, *spec) for name, spec in MODELS.items()}
"""tests/e2e/conftest.py's ``shared_side_by_side`` serves them."""


def _ask(module: object, url: str, model: str, x: np.ndarray, k: int) -> object:
    client = module.InferenceServerClient(url)  # type: ignore[attr-defined]
    try:
        dtype = {np.float32: "FP32", np.int32: "INT32", np.float16: "FP16"}[x.dtype.type]
        i = module.InferInput("IN", list(x.shape), dtype)  # type: ignore[attr-defined]
        i.set_data_from_numpy(x)
        o = module.InferRequestedOutput("OUT", class_count=k)  # type: ignore[attr-defined]
        got = client.infer(model, [i], outputs=[o]).as_numpy("OUT")
        return [[v.decode() for v in row] for row in got.reshape(got.shape[0], -1)]
    except InferenceServerException as e:
        return (str(e.status()), e.message())
    finally:
        client.close()


SCORES = np.array([[0.1, 0.7, 0.05, 0.9, 0.15], [0.5, 0.25, 0.75, 0.0, 1.5]], np.float32)


@pytest.mark.parametrize("which", ["triton-mp", "triton"])
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_top_k_classes_as_triton_writes_them(
    which: str, protocol: str, shared_side_by_side: dict[str, ServerProcess | RealTriton]
) -> None:
    urls = urls_of(shared_side_by_side, which)
    module, url = (grpcclient, urls[0]) if protocol == "grpc" else (httpclient, urls[1])
    # A batch of two: each entry its own top 3; labels where the file has one.
    assert _ask(module, url, "scores", SCORES, 3) == [
        ["0.900000:3", "0.700000:1:one", "0.150000:4"],
        ["1.500000:4", "0.750000:2:two", "0.500000:0:zero"],
    ]
    # k past the classes: all of them; an unbatched model: one entry.
    assert _ask(module, url, "plain", SCORES[0], 9) == [
        ["0.900000:3"],
        ["0.700000:1"],
        ["0.150000:4"],
        ["0.100000:0"],
        ["0.050000:2"],
    ]
    counts = np.array([3, -7, 12, 5, 0], np.int32)
    assert _ask(module, url, "counts", counts, 2) == [["12:2:two"], ["5:3"]]
    bad = _ask(module, url, "halves", SCORES[0].astype(np.float16), 2)
    assert isinstance(bad, tuple)
    assert "class result not available for output due to unsupported type 'FP16'" in bad[1]
