"""Build ``model_repository/add_sub/1/model.onnx``: Triton's classic add/sub example model.

OUTPUT0 = INPUT0 + INPUT1 and OUTPUT1 = INPUT0 - INPUT1, all FP32 of shape [batch, 16] with a
symbolic batch dimension, so ``max_batch_size: 8`` in its config.pbtxt applies. The graph is
written with ``onnx.helper`` only; the output is byte-for-byte reproducible (no timestamps), and
``tests/unit/test_add_sub_model.py`` checks that the committed file matches this script.

Usage: ``python scripts/make_add_sub_onnx.py [--output PATH]``
"""

from __future__ import annotations

import argparse
from pathlib import Path

import onnx
from onnx import TensorProto, helper

DEFAULT_OUTPUT = Path(__file__).resolve().parent.parent / "model_repository/add_sub/1/model.onnx"

WIDTH = 16
"""Elements per batch item of every tensor, as in Triton's add_sub example."""

OPSET = 13
"""Default-domain opset: Add and Sub exist since opset 1; 13 is loadable by onnxruntime>=1.8."""

IR_VERSION = 8
"""ONNX IR version matching opset 13 (onnx 1.10+), old enough for every supported onnxruntime."""


def build_model() -> onnx.ModelProto:
    """Return the checked add_sub ModelProto (inputs INPUT0/INPUT1, outputs OUTPUT0/OUTPUT1)."""
    shape: list[str | int] = ["batch", WIDTH]
    graph = helper.make_graph(
        nodes=[
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"], name="add"),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"], name="sub"),
        ],
        name="add_sub",
        inputs=[
            helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, shape),
            helper.make_tensor_value_info("INPUT1", TensorProto.FLOAT, shape),
        ],
        outputs=[
            helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, shape),
            helper.make_tensor_value_info("OUTPUT1", TensorProto.FLOAT, shape),
        ],
    )
    model = helper.make_model(
        graph,
        producer_name="triton-mp scripts/make_add_sub_onnx.py",
        opset_imports=[helper.make_opsetid("", OPSET)],
        doc_string="OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1",
    )
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    return model


def serialise(model: onnx.ModelProto) -> bytes:
    """Deterministic bytes of ``model`` (what is written to disk)."""
    return model.SerializeToString(deterministic=True)


def main(argv: list[str] | None = None) -> int:
    """Write the model to ``--output`` (default: the project's add_sub/1/model.onnx)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="file to write")
    args = parser.parse_args(argv)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_bytes(serialise(build_model()))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
