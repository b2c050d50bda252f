#!/usr/bin/env python3
"""Write an ONNX stand-in for bench/model_repository into DIR.

Same model names, tensors and scheduling as the python models, but on the onnxruntime backend:
- add_sub_py: model_repository/add_sub/1/model.onnx (OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 =
  INPUT0 - INPUT1, FP32 [16]), max_batch_size 64, dynamic batching 500 us, 2 CPU instances;
- identity_py: an ONNX Identity, INPUT0 FP32 [-1] -> OUTPUT0, max_batch_size 0, 1 instance.

It lets bench_vs_triton.py exercise triton-mp (``--mp-repository DIR``) before triton-mp has a
python backend. The triton-mp figures it gives are for onnxruntime, not for the python models
that Triton runs: a check of the bench, not a comparison.
Usage: python bench/make_onnx_standin.py DIR
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

ADD_SUB = """# Stand-in for add_sub_py (python backend): its tensors and scheduling, on onnxruntime.
name: "add_sub_py"
backend: "onnxruntime"
max_batch_size: 64
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] }
]
dynamic_batching { max_queue_delay_microseconds: 500 }
instance_group [ { count: 2 kind: KIND_CPU } ]
"""

IDENTITY = """# Stand-in for identity_py (python backend): an ONNX Identity on onnxruntime.
name: "identity_py"
backend: "onnxruntime"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


def identity_onnx(path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["n"])
    y = helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["n"])
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])], "identity_py", [x], [y]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8  # readable by every onnxruntime this project supports
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    dest = Path(argv[0])
    for name, config in (("add_sub_py", ADD_SUB), ("identity_py", IDENTITY)):
        (dest / name / "1").mkdir(parents=True, exist_ok=True)
        (dest / name / "config.pbtxt").write_text(config)
    shutil.copyfile(
        ROOT / "model_repository" / "add_sub" / "1" / "model.onnx",
        dest / "add_sub_py" / "1" / "model.onnx",
    )
    identity_onnx(dest / "identity_py" / "1" / "model.onnx")
    print(f"wrote {dest}/add_sub_py and {dest}/identity_py (onnxruntime stand-ins)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
