"""Unit tests for triton_mp.model_config: ONNX auto-complete (inputs, outputs,
max_batch_size and its scheduler from the model file).

Every model repository is built in tmp_path (``tests.helpers.model_config_builders``).
"""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto

from tests.helpers.model_config_builders import (
    batchable_onnx,
    fixed_onnx,
    load_err,
    load_ok,
    make_model,
    onnx_model,
)
from triton_mp._proto import model_config_pb2 as pb

# ---------------------------------------------------------------------------
# ONNX auto-complete
# ---------------------------------------------------------------------------


def test_onnx_autocomplete_without_config_batchable(tmp_path: Path) -> None:
    d = make_model(tmp_path, "m", None, files={"model.onnx": batchable_onnx()})
    config = load_ok(d).config
    assert config is not None
    assert config.max_batch_size == 4
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [
        ("INPUT0", pb.TYPE_FP32, [4]),
        ("INPUT1", pb.TYPE_FP32, [4]),
    ]
    assert [(o.name, o.data_type, list(o.dims)) for o in config.output] == [
        ("OUTPUT0", pb.TYPE_FP32, [4])
    ]
    assert config.HasField("dynamic_batching")
    assert list(config.dynamic_batching.preferred_batch_size) == [4]


def test_onnx_autocomplete_uses_default_max_batch_size(tmp_path: Path) -> None:
    d = make_model(tmp_path, "m", None, files={"model.onnx": batchable_onnx()})
    config = load_ok(d, default_max_batch_size=16).config
    assert config is not None
    assert config.max_batch_size == 16
    assert list(config.dynamic_batching.preferred_batch_size) == [16]


def test_onnx_autocomplete_default_max_batch_size_one_adds_no_scheduler(tmp_path: Path) -> None:
    d = make_model(tmp_path, "m", None, files={"model.onnx": batchable_onnx()})
    config = load_ok(d, default_max_batch_size=1).config
    assert config is not None
    assert config.max_batch_size == 1
    assert config.WhichOneof("scheduling_choice") is None


def test_onnx_autocomplete_fixed_shape_keeps_max_batch_size_zero(tmp_path: Path) -> None:
    d = make_model(tmp_path, "m", None, files={"model.onnx": fixed_onnx()})
    config = load_ok(d).config
    assert config is not None
    assert config.max_batch_size == 0
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [
        ("INPUT0", pb.TYPE_INT32, [2, 3])
    ]
    assert list(config.output[0].dims) == [2, 3]
    assert config.WhichOneof("scheduling_choice") is None


def test_onnx_autocomplete_completes_partial_config(tmp_path: Path) -> None:
    config_text = """
    max_batch_size: 8
    input [ { name: "INPUT1" } ]
    output [ { name: "OUTPUT0" data_type: TYPE_FP32 } ]
    """
    d = make_model(tmp_path, "m", config_text, files={"model.onnx": batchable_onnx()})
    config = load_ok(d).config
    assert config is not None
    assert config.max_batch_size == 8
    # the listed input keeps its place and is completed; the unlisted one is appended
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [
        ("INPUT1", pb.TYPE_FP32, [4]),
        ("INPUT0", pb.TYPE_FP32, [4]),
    ]
    assert list(config.output[0].dims) == [4]
    assert list(config.dynamic_batching.preferred_batch_size) == [8]


def test_onnx_autocomplete_full_rank_config_dims_keep_max_batch_size_zero(tmp_path: Path) -> None:
    config_text = 'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]'
    d = make_model(tmp_path, "m", config_text, files={"model.onnx": batchable_onnx()})
    config = load_ok(d).config
    assert config is not None
    assert config.max_batch_size == 0
    assert [list(i.dims) for i in config.input] == [[-1, 4], [-1, 4]]
    assert list(config.output[0].dims) == [-1, 4]
    assert config.WhichOneof("scheduling_choice") is None


def test_onnx_autocomplete_keeps_existing_scheduler(tmp_path: Path) -> None:
    config_text = "max_batch_size: 4 sequence_batching { }"
    d = make_model(tmp_path, "m", config_text, files={"model.onnx": batchable_onnx()})
    config = load_ok(d).config
    assert config is not None
    assert config.WhichOneof("scheduling_choice") == "sequence_batching"
    assert config.sequence_batching.max_sequence_idle_microseconds == 1_000_000


def test_onnx_autocomplete_skips_control_and_initializer_inputs(tmp_path: Path) -> None:
    model = onnx_model(
        [
            ("INPUT0", TensorProto.FLOAT, ["b", 4]),
            ("START", TensorProto.INT32, ["b", 1]),
            ("W", TensorProto.FLOAT, [4]),
        ],
        [("OUTPUT0", TensorProto.FLOAT, ["b", 4])],
        initializers=["W"],
    )
    config_text = """
    max_batch_size: 2
    sequence_batching {
      control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START
                                                 int32_false_true: [ 0, 1 ] } ] } ]
    }
    """
    d = make_model(tmp_path, "m", config_text, files={"model.onnx": model})
    config = load_ok(d).config
    assert config is not None
    assert [i.name for i in config.input] == ["INPUT0"]


def test_onnx_autocomplete_scalar_io_gets_reshape_when_batching(tmp_path: Path) -> None:
    model = onnx_model(
        [("INPUT0", TensorProto.FLOAT, ["b"])], [("OUTPUT0", TensorProto.FLOAT, ["b"])]
    )
    d = make_model(tmp_path, "m", None, files={"model.onnx": model})
    config = load_ok(d).config
    assert config is not None
    assert config.max_batch_size == 4
    assert list(config.input[0].dims) == [1]
    assert config.input[0].HasField("reshape")
    assert list(config.input[0].reshape.shape) == []


def test_onnx_autocomplete_rejects_batching_for_fixed_shape(tmp_path: Path) -> None:
    d = make_model(tmp_path, "m", "max_batch_size: 2", files={"model.onnx": fixed_onnx()})
    assert load_err(d) == (
        "autofill failed for model 'm': model does not support batching while non-zero "
        "max_batch_size is specified"
    )


def test_onnx_autocomplete_rejects_unknown_input(tmp_path: Path) -> None:
    config_text = 'input [ { name: "NOPE" data_type: TYPE_FP32 dims: 4 } ]'
    d = make_model(tmp_path, "m", config_text, files={"model.onnx": batchable_onnx()})
    assert load_err(d) == (
        "unable to load model 'm': unexpected inference input 'NOPE', allowed inputs are: "
        "INPUT0, INPUT1"
    )


def test_onnx_autocomplete_rejects_unreadable_model(tmp_path: Path) -> None:
    d = make_model(tmp_path, "m", None, files={"model.onnx": b"\xff\x00 not onnx"})
    error = load_err(d)
    assert error.startswith("unable to load model 'm': failed to read ONNX model")

    d = make_model(tmp_path, "empty", None, files={"model.onnx": b""})
    assert "holds no graph" in load_err(d)


def test_no_onnx_autocomplete_when_disabled(tmp_path: Path) -> None:
    d = make_model(tmp_path, "m", 'backend: "onnxruntime"', files={"model.onnx": b"not read"})
    config = load_ok(d, auto_complete=False).config
    assert config is not None
    assert config.max_batch_size == 0
    assert len(config.input) == 0
    assert config.WhichOneof("scheduling_choice") is None


def test_onnx_autocomplete_reads_newest_version(tmp_path: Path) -> None:
    d = make_model(tmp_path, "m", "version_policy { all { } }", versions=(1,))
    onnx.save(fixed_onnx(), str(d / "1" / "model.onnx"))
    (d / "2").mkdir()
    onnx.save(batchable_onnx(), str(d / "2" / "model.onnx"))
    config = load_ok(d).config
    assert config is not None
    assert config.max_batch_size == 4


def test_onnx_autocomplete_rejects_unsupported_element_type(tmp_path: Path) -> None:
    model = onnx_model(
        [("INPUT0", TensorProto.COMPLEX64, ["b", 2])], [("OUTPUT0", TensorProto.FLOAT, ["b", 2])]
    )
    d = make_model(tmp_path, "m", None, files={"model.onnx": model})
    assert load_err(d) == (
        "autofill failed for model 'm': unsupported ONNX data type COMPLEX64 for input 'INPUT0' "
        "of model 'm'"
    )
