"""Tensor forms end to end: config reshape, BYTES (string) tensors, non-batching models.

Models are built with ``onnx.helper`` in the fixture (nothing downloaded):
- ``add_sub_reshape``: the add_sub graph ([batch, 16]) served with ``dims: [4, 4]`` and
  ``reshape: { shape: [16] }``: clients send and receive [batch, 4, 4], the backend sees
  [batch, 16];
- ``string_identity``: an Identity over a string tensor, BYTES in and out;
- ``fixed_matmul``: max_batch_size 0 (no batch dimension), FP64 and INT64 outputs.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
from onnx import TensorProto, helper

from tests.helpers.server import PROJECT_REPOSITORY, ServerProcess, server_factory

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def _save(model: onnx.ModelProto, path: Path) -> None:
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def _string_identity() -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["TEXT"], ["TEXT_OUT"])],
        "string_identity",
        [helper.make_tensor_value_info("TEXT", TensorProto.STRING, ["batch", 2])],
        [helper.make_tensor_value_info("TEXT_OUT", TensorProto.STRING, ["batch", 2])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _fixed_matmul() -> onnx.ModelProto:
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["A", "B"], ["PRODUCT"]),
            helper.make_node("Cast", ["PRODUCT"], ["ROUNDED"], to=TensorProto.INT64),
        ],
        "fixed_matmul",
        [
            helper.make_tensor_value_info("A", TensorProto.DOUBLE, [2, 3]),
            helper.make_tensor_value_info("B", TensorProto.DOUBLE, [3, 2]),
        ],
        [
            helper.make_tensor_value_info("PRODUCT", TensorProto.DOUBLE, [2, 2]),
            helper.make_tensor_value_info("ROUNDED", TensorProto.INT64, [2, 2]),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("repo")
    (repo / "add_sub_reshape" / "1").mkdir(parents=True)
    shutil.copy(
        PROJECT_REPOSITORY / "add_sub" / "1" / "model.onnx",
        repo / "add_sub_reshape" / "1" / "model.onnx",
    )
    io = "\n".join(
        f'{kind} [{{ name: "{name}", data_type: TYPE_FP32, dims: [4, 4], '
        f"reshape: {{ shape: [16] }} }}]"
        for kind, name in (
            ("input", "INPUT0"),
            ("input", "INPUT1"),
            ("output", "OUTPUT0"),
            ("output", "OUTPUT1"),
        )
    )
    (repo / "add_sub_reshape" / "config.pbtxt").write_text(
        f'backend: "onnxruntime"\nmax_batch_size: 8\n{io}\n'
        "instance_group [{ count: 1, kind: KIND_CPU }]\n"
    )
    _save(_string_identity(), repo / "string_identity" / "1" / "model.onnx")
    (repo / "string_identity" / "config.pbtxt").write_text(
        'backend: "onnxruntime"\nmax_batch_size: 4\ninstance_group [{ count: 1, kind: KIND_CPU }]\n'
    )
    _save(_fixed_matmul(), repo / "fixed_matmul" / "1" / "model.onnx")
    with server_factory(tmp_path_factory.mktemp("logs")) as start:
        yield start(repo)


@pytest.fixture
def client(server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    c = server.client()
    yield c
    c.close()


def test_reshape_is_applied_both_ways(client: grpcclient.InferenceServerClient) -> None:
    a = np.arange(2 * 16, dtype=np.float32).reshape(2, 4, 4)
    b = np.ones((2, 4, 4), np.float32)
    inputs = []
    for name, x in (("INPUT0", a), ("INPUT1", b)):
        i = grpcclient.InferInput(name, [2, 4, 4], "FP32")
        i.set_data_from_numpy(x)
        inputs.append(i)
    res = client.infer("add_sub_reshape", inputs)
    assert res.as_numpy("OUTPUT0").shape == (2, 4, 4)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT1"), a - b)
    md = client.get_model_metadata("add_sub_reshape")
    assert [list(t.shape) for t in md.inputs] == [[-1, 4, 4], [-1, 4, 4]]


def test_bytes_tensors_round_trip(client: grpcclient.InferenceServerClient) -> None:
    text = np.array(
        [[b"hello", b""], ["w\u00f6rld".encode(), b"tab\tand\nnewline"]], dtype=np.object_
    )
    i = grpcclient.InferInput("TEXT", [2, 2], "BYTES")
    i.set_data_from_numpy(text)
    res = client.infer("string_identity", [i])
    out = res.as_numpy("TEXT_OUT")
    assert out.shape == (2, 2)
    assert out.tolist() == text.tolist()
    cfg = client.get_model_config("string_identity", as_json=True)["config"]
    assert cfg["input"][0]["data_type"] == "TYPE_STRING"


def test_non_utf8_bytes_to_an_onnx_string_input_fail_cleanly(
    client: grpcclient.InferenceServerClient,
) -> None:
    from tritonclient.utils import InferenceServerException

    i = grpcclient.InferInput("TEXT", [1, 2], "BYTES")
    i.set_data_from_numpy(np.array([[b"ok", b"\xff\xfe"]], dtype=np.object_))
    with pytest.raises(InferenceServerException) as e:
        client.infer("string_identity", [i])
    assert "is not valid UTF-8" in e.value.message()
    ok = grpcclient.InferInput("TEXT", [1, 2], "BYTES")
    ok.set_data_from_numpy(np.array([[b"still", b"serving"]], dtype=np.object_))
    assert client.infer("string_identity", [ok]).as_numpy("TEXT_OUT").tolist() == [
        [b"still", b"serving"]
    ]


def test_bytes_tensor_with_a_short_element_count_is_rejected(
    client: grpcclient.InferenceServerClient,
) -> None:
    from tritonclient.grpc import service_pb2

    req = service_pb2.ModelInferRequest(model_name="string_identity")
    req.inputs.add(name="TEXT", datatype="BYTES", shape=[1, 2])
    req.raw_input_contents.append((3).to_bytes(4, "little") + b"abc")  # one element, not two
    with pytest.raises(Exception) as e:  # noqa: PT011 - grpc raises its own RpcError type
        client._client_stub.ModelInfer(req)
    assert (
        "expected 2 string elements for inference input 'TEXT' for model 'string_identity', got 1"
    ) in str(e.value)


def test_non_batching_model_with_fp64_and_int64(client: grpcclient.InferenceServerClient) -> None:
    cfg = client.get_model_config("fixed_matmul", as_json=True)["config"]
    assert cfg.get("max_batch_size", 0) == 0  # the client drops proto3 defaults from JSON
    a = np.arange(6, dtype=np.float64).reshape(2, 3) / 2
    b = np.arange(6, dtype=np.float64).reshape(3, 2)
    inputs = []
    for name, x in (("A", a), ("B", b)):
        i = grpcclient.InferInput(name, [*x.shape], "FP64")
        i.set_data_from_numpy(x)
        inputs.append(i)
    res = client.infer("fixed_matmul", inputs)
    np.testing.assert_array_equal(res.as_numpy("PRODUCT"), a @ b)
    assert res.as_numpy("ROUNDED").dtype == np.int64
    np.testing.assert_array_equal(res.as_numpy("ROUNDED"), (a @ b).astype(np.int64))
