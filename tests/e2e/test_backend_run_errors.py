"""A model that fails while it runs: the client gets the backend's status and words, as
Triton's backends answer (onnxruntime: INTERNAL "onnx runtime error <code>: <message>",
``RETURN_IF_ORT_ERROR``; PyTorch: INTERNAL "PyTorch execute failure: <what>"), and the worker
goes on serving."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from tests.helpers.server import ServerProcess, server_factory

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

RESHAPE_CONFIG = """
platform: "onnxruntime_onnx"
max_batch_size: 0
input [{ name: "X", data_type: TYPE_FP32, dims: [ -1 ] }]
output [{ name: "Y", data_type: TYPE_FP32, dims: [ 2, -1 ] }]
"""
RAISES_CONFIG = """
platform: "pytorch_libtorch"
max_batch_size: 0
input [{ name: "INPUT__0", data_type: TYPE_FP32, dims: [ 2 ] }]
output [{ name: "OUTPUT__0", data_type: TYPE_FP32, dims: [ 2 ] }]
"""


def _reshape_model(path: Path) -> None:
    """Y = reshape(X, [2, -1]): fails in onnxruntime for an odd number of elements."""
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["X", "shape"], ["Y"], name="halves")],
        "halves",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, "m"])],
        [helper.make_tensor("shape", TensorProto.INT64, [2], [2, -1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path.parent.mkdir(parents=True)
    onnx.save(model, str(path))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("repo")
    _reshape_model(repo / "halves" / "1" / "model.onnx")
    (repo / "halves" / "config.pbtxt").write_text(textwrap.dedent(RESHAPE_CONFIG))
    torch = pytest.importorskip("torch")
    del torch
    from tests.helpers.torch_models import Raises, save  # noqa: PLC0415 - torch is optional

    save(Raises(), repo / "raises" / "1" / "model.pt")
    (repo / "raises" / "config.pbtxt").write_text(textwrap.dedent(RAISES_CONFIG))
    with server_factory(tmp_path_factory.mktemp("logs")) as start:
        yield start(repo)


def _x(module: object, name: str, values: list[float]) -> object:
    t = module.InferInput(name, [len(values)], "FP32")  # type: ignore[attr-defined]
    t.set_data_from_numpy(np.array(values, np.float32))
    return t


def test_onnxruntime_run_failure_in_the_backends_words(server: ServerProcess) -> None:
    g = grpcclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException) as e:
        g.infer("halves", [_x(grpcclient, "X", [1, 2, 3])])
    assert e.value.status() == "StatusCode.INTERNAL"
    assert e.value.message().startswith(
        "onnx runtime error 1: Non-zero status code returned while running Reshape node. "
        "Name:'halves' "
    ), e.value.message()
    assert "The input tensor cannot be reshaped to the requested shape." in e.value.message()
    # The same worker answers the next request.
    got = g.infer("halves", [_x(grpcclient, "X", [1, 2, 3, 4])]).as_numpy("Y")
    assert got.tolist() == [[1, 2], [3, 4]]
    g.close()
    h = httpclient.InferenceServerClient(server.http_url)
    with pytest.raises(InferenceServerException) as e:
        h.infer("halves", [_x(httpclient, "X", [1])])
    assert e.value.status() == "500"
    assert e.value.message().startswith("onnx runtime error 1: ")
    h.close()


def test_pytorch_execute_failure_in_the_backends_words(server: ServerProcess) -> None:
    g = grpcclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException) as e:
        g.infer("raises", [_x(grpcclient, "INPUT__0", [-1, 1])])
    assert e.value.status() == "StatusCode.INTERNAL"
    assert e.value.message().startswith("PyTorch execute failure: "), e.value.message()
    assert "negative input" in e.value.message()
    got = g.infer("raises", [_x(grpcclient, "INPUT__0", [1, 2])]).as_numpy("OUTPUT__0")
    assert got.tolist() == [1, 2]
    g.close()
