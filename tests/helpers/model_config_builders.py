"""Builders of model repositories for the model_config unit tests (``tests/unit/
test_model_config_*.py``): ONNX models made with onnx.helper, python models, config
fragments, and ``load_model`` wrappers that return the model or its error. No process is
started and onnxruntime is never imported."""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper

from triton_mp._proto import model_config_pb2 as pb
from triton_mp.model_config.loader import (
    RepositoryModel,
    load_model,
)

KIND_CPU = pb.ModelInstanceGroup.KIND_CPU
KIND_GPU = pb.ModelInstanceGroup.KIND_GPU
KIND_MODEL = pb.ModelInstanceGroup.KIND_MODEL

# ---------------------------------------------------------------------------
# Builders
# ---------------------------------------------------------------------------


def onnx_model(
    inputs: list[tuple[str, int, list[int | str]]],
    outputs: list[tuple[str, int, list[int | str]]],
    *,
    initializers: list[str] = (),  # type: ignore[assignment]
) -> onnx.ModelProto:
    """A graph whose outputs are Identity copies of the first input (signature is all we read)."""
    value_infos_in = [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs]
    value_infos_out = [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs]
    nodes = [helper.make_node("Identity", [inputs[0][0]], [name]) for name, _, _ in outputs]
    inits = [helper.make_tensor(name, TensorProto.FLOAT, [4], [0.0] * 4) for name in initializers]
    graph = helper.make_graph(nodes, "g", value_infos_in, value_infos_out, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def batchable_onnx() -> onnx.ModelProto:
    """INPUT0/INPUT1 FP32 [batch, 4] -> OUTPUT0 FP32 [batch, 4]; symbolic first dim."""
    return onnx_model(
        [("INPUT0", TensorProto.FLOAT, ["batch", 4]), ("INPUT1", TensorProto.FLOAT, ["batch", 4])],
        [("OUTPUT0", TensorProto.FLOAT, ["batch", 4])],
    )


def fixed_onnx() -> onnx.ModelProto:
    """INPUT0 INT32 [2, 3] -> OUTPUT0 INT32 [2, 3]; cannot batch."""
    return onnx_model(
        [("INPUT0", TensorProto.INT32, [2, 3])], [("OUTPUT0", TensorProto.INT32, [2, 3])]
    )


def make_model(
    root: Path,
    name: str,
    config: str | None = None,
    *,
    versions: tuple[int | str, ...] = (1,),
    files: dict[str, str | bytes | onnx.ModelProto] | None = None,
) -> Path:
    """Create ``root/name`` with an optional config.pbtxt and version dirs holding ``files``."""
    model_dir = root / name
    model_dir.mkdir(parents=True)
    if config is not None:
        (model_dir / "config.pbtxt").write_text(config)
    for version in versions:
        vdir = model_dir / str(version)
        vdir.mkdir()
        for filename, content in (files or {}).items():
            if isinstance(content, onnx.ModelProto):
                onnx.save(content, str(vdir / filename))
            elif isinstance(content, bytes):
                (vdir / filename).write_bytes(content)
            else:
                (vdir / filename).write_text(content)
    return model_dir


def python_model(root: Path, name: str, config: str, **kwargs: object) -> Path:
    """A python-backend model (``model.py`` in each version)."""
    return make_model(root, name, config, files={"model.py": "# model\n"}, **kwargs)  # type: ignore[arg-type]


IO_FP32 = """
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def load_ok(directory: Path, **kwargs: object) -> RepositoryModel:
    model = load_model(directory, **kwargs)  # type: ignore[arg-type]
    assert model.error is None, model.error
    assert model.config is not None
    return model


def load_err(directory: Path, **kwargs: object) -> str:
    model = load_model(directory, **kwargs)  # type: ignore[arg-type]
    assert model.error is not None, "expected the model to fail"
    assert model.versions == ()
    return model.error


ENSEMBLE = """
platform: "ensemble"
max_batch_size: 4
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling {
  step [
    { model_name: "a" model_version: -1 input_map { key: "INPUT0" value: "IN" }
      output_map { key: "OUTPUT0" value: "MID" } },
    { model_name: "b" model_version: -1 input_map { key: "INPUT0" value: "MID" }
      output_map { key: "OUTPUT0" value: "OUT" } }
  ]
}
"""
