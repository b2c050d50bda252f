"""Unit tests for triton_mp.model_config: Triton's repository layout, config rules, auto-complete.

Every model repository is built in tmp_path; ONNX models are made with onnx.helper. No process
is started and onnxruntime is never imported.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import onnx
import pytest
from google.protobuf import json_format, text_format
from onnx import TensorProto, helper

import triton_mp.model_config
from triton_mp._proto import model_config_pb2 as pb
from triton_mp.common.datatypes import DataType
from triton_mp.common.errors import ConfigError, ErrorCode
from triton_mp.common.json_form import config_to_json
from triton_mp.model_config import loader as loader_mod
from triton_mp.model_config.loader import (
    ModelVersion,
    RepositoryModel,
    load_model,
    load_repository,
    read_config_pbtxt,
)
from triton_mp.model_config.plan import instance_names

KIND_CPU = pb.ModelInstanceGroup.KIND_CPU
KIND_GPU = pb.ModelInstanceGroup.KIND_GPU
KIND_MODEL = pb.ModelInstanceGroup.KIND_MODEL

# ---------------------------------------------------------------------------
# Builders
# ---------------------------------------------------------------------------


def _onnx_model(
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
    return _onnx_model(
        [("INPUT0", TensorProto.FLOAT, ["batch", 4]), ("INPUT1", TensorProto.FLOAT, ["batch", 4])],
        [("OUTPUT0", TensorProto.FLOAT, ["batch", 4])],
    )


def fixed_onnx() -> onnx.ModelProto:
    """INPUT0 INT32 [2, 3] -> OUTPUT0 INT32 [2, 3]; cannot batch."""
    return _onnx_model(
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


# ---------------------------------------------------------------------------
# read_config_pbtxt
# ---------------------------------------------------------------------------


def test_read_config_parses_text_format_variants(tmp_path: Path) -> None:
    path = tmp_path / "config.pbtxt"
    path.write_text(
        """
        name : "m"  # comment
        backend: "python"
        max_batch_size: 8#MAX
        input [ { name: "A", data_type: TYPE_FP32, dims: [ -1 ] } ]
        input { name: "B" data_type: TYPE_STRING dims: 1 }
        dynamic_batching:
        { }
        parameters { key: "k" value: { string_value: "v" } }
        model_transaction_policy { decoupled: True }
        """
    )
    config = read_config_pbtxt(path)
    assert config.name == "m"
    assert config.max_batch_size == 8
    assert [i.name for i in config.input] == ["A", "B"]
    assert list(config.input[1].dims) == [1]
    assert config.HasField("dynamic_batching")
    assert config.parameters["k"].string_value == "v"
    assert config.model_transaction_policy.decoupled is True


def test_read_config_syntax_error_names_file_and_position(tmp_path: Path) -> None:
    path = tmp_path / "config.pbtxt"
    path.write_text('name: "m"\nmax_batch_size: ${mbs}\n')
    with pytest.raises(ConfigError) as info:
        read_config_pbtxt(path)
    assert str(path) in info.value.message
    assert "2:17" in info.value.message
    assert info.value.code == ErrorCode.INVALID_ARG


def test_read_config_rejects_unknown_field_and_repeated_singular(tmp_path: Path) -> None:
    path = tmp_path / "config.pbtxt"
    path.write_text('name: "m"\nnot_a_field: 1\n')
    with pytest.raises(ConfigError, match="not_a_field"):
        read_config_pbtxt(path)
    path.write_text('name: "m"\nname: "n"\n')
    with pytest.raises(ConfigError, match="name"):
        read_config_pbtxt(path)


def test_read_config_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="failed to read text proto from"):
        read_config_pbtxt(tmp_path / "nope.pbtxt")


def test_read_config_empty_file_is_an_empty_config(tmp_path: Path) -> None:
    path = tmp_path / "config.pbtxt"
    path.write_text("")
    assert read_config_pbtxt(path) == pb.ModelConfig()


# ---------------------------------------------------------------------------
# Versions
# ---------------------------------------------------------------------------


def test_latest_policy_defaults_to_the_newest_version(tmp_path: Path) -> None:
    d = python_model(tmp_path, "m", 'backend: "python"', versions=(1, 3, 2, 10))
    model = load_ok(d)
    assert [v.version for v in model.versions] == [10]
    assert model.config.version_policy.latest.num_versions == 1  # type: ignore[union-attr]
    assert model.versions[0] == ModelVersion(10, d / "10", d / "10" / "model.py")


def test_latest_policy_num_versions(tmp_path: Path) -> None:
    config = 'backend: "python" version_policy: { latest { num_versions: 2 } }'
    d = python_model(tmp_path, "m", config, versions=(1, 3, 2))
    assert [v.version for v in load_ok(d).versions] == [2, 3]


def test_all_policy_loads_every_version_ascending(tmp_path: Path) -> None:
    config = 'backend: "python" version_policy: { all { } }'
    d = python_model(tmp_path, "m", config, versions=(7, 1, 3))
    assert [v.version for v in load_ok(d).versions] == [1, 3, 7]


def test_specific_policy_logs_missing_versions(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = 'backend: "python" version_policy: { specific { versions: [ 1, 4 ] } }'
    d = python_model(tmp_path, "m", config, versions=(1, 2, 3))
    with caplog.at_level(logging.ERROR, logger="triton_mp.model_config.loader"):
        model = load_ok(d)
    assert [v.version for v in model.versions] == [1]
    assert "version 4 is specified for model 'm', but the version directory is not present" in (
        caplog.text
    )


def test_specific_policy_with_no_present_version_fails(tmp_path: Path) -> None:
    config = 'backend: "python" version_policy: { specific { versions: 9 } }'
    d = python_model(tmp_path, "m", config, versions=(1,))
    assert load_err(d) == "failed to load 'm', no version is available"


def test_no_version_directory_fails(tmp_path: Path) -> None:
    d = python_model(tmp_path, "m", 'backend: "python"', versions=())
    assert load_err(d) == "failed to load 'm', no version is available"


def test_bad_version_names_are_ignored_with_warnings(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    d = python_model(
        tmp_path,
        "m",
        'backend: "python" version_policy: { all { } }',
        versions=(1, "01", "v2", "1abc", "warmup", "configs", "initial_state", "0"),
    )
    with caplog.at_level(logging.WARNING, logger="triton_mp.model_config.loader"):
        model = load_ok(d)
    assert [v.version for v in model.versions] == [0, 1]
    assert "ignore version directory '01' which contains leading zeros" in caplog.text
    assert "ignore version directory 'v2' which fails to convert to integral number" in (
        caplog.text
    )
    assert "'1abc'" in caplog.text
    for skipped in ("warmup", "configs", "initial_state"):
        assert f"'{skipped}'" not in caplog.text


def test_version_without_model_file_is_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    d = python_model(tmp_path, "m", 'backend: "python" version_policy: { all { } }', versions=(1,))
    (d / "2").mkdir()  # no model.py
    with caplog.at_level(logging.ERROR, logger="triton_mp.model_config.loader"):
        model = load_ok(d)
    assert [v.version for v in model.versions] == [1]
    assert f"unable to find '{d / '2' / 'model.py'}'" in caplog.text


def test_latest_version_without_model_file_fails_the_model(tmp_path: Path) -> None:
    d = python_model(tmp_path, "m", 'backend: "python"', versions=(1,))
    (d / "2").mkdir()
    error = load_err(d)
    assert error.startswith("failed to load 'm', no version is available")
    assert f"version 2: unable to find '{d / '2' / 'model.py'}'" in error


def test_default_model_filename_names_the_model_file(tmp_path: Path) -> None:
    config = 'backend: "python" default_model_filename: "my_model.py"'
    d = make_model(tmp_path, "m", config, files={"my_model.py": ""})
    model = load_ok(d)
    assert model.versions[0].model_file == d / "1" / "my_model.py"


# ---------------------------------------------------------------------------
# config.pbtxt presence and name
# ---------------------------------------------------------------------------


def test_missing_config_allowed_with_auto_complete(tmp_path: Path) -> None:
    d = make_model(tmp_path, "m", None, files={"model.py": ""})
    model = load_ok(d)
    assert model.config.name == "m"  # type: ignore[union-attr]
    assert model.config.backend == "python"  # type: ignore[union-attr]


def test_missing_config_rejected_without_auto_complete(tmp_path: Path) -> None:
    d = make_model(tmp_path, "m", None, files={"model.py": ""})
    error = load_err(d, auto_complete=False)
    assert "config.pbtxt" in error
    assert "'m'" in error


def test_config_name_must_match_directory(tmp_path: Path) -> None:
    d = python_model(tmp_path, "dir_name", 'name: "other" backend: "python"')
    assert load_err(d) == (
        "unexpected directory name 'dir_name' for model 'other', directory name must equal "
        "model name"
    )


def test_empty_config_name_is_set_from_directory(tmp_path: Path) -> None:
    d = python_model(tmp_path, "m", 'backend: "python"')
    assert load_ok(d).config.name == "m"  # type: ignore[union-attr]


def test_syntax_error_returns_error_and_no_config(tmp_path: Path) -> None:
    d = python_model(tmp_path, "m", "backend: python")
    model = load_model(d)
    assert model.config is None
    assert model.error is not None
    assert "failed to read text proto from" in model.error


def test_missing_model_directory_returns_error(tmp_path: Path) -> None:
    model = load_model(tmp_path / "absent")
    assert model.error is not None
    assert "model directory not found" in model.error


# ---------------------------------------------------------------------------
# Backend / platform inference
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("filename", "backend", "platform"),
    [
        ("model.onnx", "onnxruntime", "onnxruntime_onnx"),
        ("model.py", "python", ""),
        ("model.plan", "tensorrt", "tensorrt_plan"),
    ],
)
def test_backend_inferred_from_model_file(
    tmp_path: Path, filename: str, backend: str, platform: str
) -> None:
    content: object = fixed_onnx() if filename == "model.onnx" else ""
    d = make_model(tmp_path, "m", None, files={filename: content})  # type: ignore[dict-item]
    config = load_ok(d).config
    assert config is not None
    assert (config.backend, config.platform, config.default_model_filename) == (
        backend,
        platform,
        filename,
    )


@pytest.mark.parametrize(
    ("config_text", "backend", "platform", "filename"),
    [
        ('platform: "onnxruntime_onnx"', "onnxruntime", "onnxruntime_onnx", "model.onnx"),
        ('backend: "onnxruntime"', "onnxruntime", "onnxruntime_onnx", "model.onnx"),
        ('platform: "tensorrt_plan"', "tensorrt", "tensorrt_plan", "model.plan"),
        ('backend: "tensorrt"', "tensorrt", "tensorrt_plan", "model.plan"),
        ('default_model_filename: "model.plan"', "tensorrt", "tensorrt_plan", "model.plan"),
        ('backend: "python"', "python", "", "model.py"),
    ],
)
def test_platform_and_backend_filled_both_ways(
    tmp_path: Path, config_text: str, backend: str, platform: str, filename: str
) -> None:
    d = make_model(tmp_path, "m", config_text + IO_FP32, files={filename: ""})
    config = load_ok(d, auto_complete=False).config
    assert config is not None
    assert (config.backend, config.platform, config.default_model_filename) == (
        backend,
        platform,
        filename,
    )


def test_mismatched_platform_backend_pair_rejected(tmp_path: Path) -> None:
    d = make_model(
        tmp_path, "m", 'platform: "tensorrt_plan" backend: "onnxruntime"', files={"model.onnx": ""}
    )
    assert load_err(d) == "unexpected 'platform' and 'backend' pair, got:tensorrt_plan, onnxruntime"


def test_ensemble_must_have_empty_backend(tmp_path: Path) -> None:
    d = make_model(tmp_path, "m", 'platform: "ensemble" backend: "python"')
    assert (
        load_err(d)
        == "Ensemble model 'm' must have platform type 'ensemble' and empty backend type"
    )


def test_unknown_platform_without_backend(tmp_path: Path) -> None:
    d = make_model(tmp_path, "m", 'platform: "custom"')
    assert load_err(d) == "unexpected platform type 'custom' for m"


def test_backend_cannot_be_determined(tmp_path: Path) -> None:
    d = make_model(tmp_path, "m", None, files={"weights.bin": ""})
    assert load_err(d) == (
        "Invalid model name: Could not determine backend for model 'm' with no backend in "
        "model configuration. Expected model name of the form 'model.<backend_name>'."
    )


def test_custom_backend_from_directory_name_is_unsupported(tmp_path: Path) -> None:
    d = make_model(tmp_path, "m.identity", None, files={"model.identity": ""})
    model = load_model(d)
    assert model.config is not None
    assert model.config.backend == "identity"
    assert model.config.default_model_filename == "model.identity"
    assert model.error is not None
    assert "backend 'identity' is not supported by triton-mp" in model.error


def test_unsupported_backend_fails_clearly(tmp_path: Path) -> None:
    d = make_model(tmp_path, "m", 'backend: "dali"' + IO_FP32, files={"model.dali": ""})
    error = load_err(d)
    assert error.startswith("unable to load model 'm': backend 'dali' is not supported")
    assert "onnxruntime, python, pytorch, tensorrt" in error


def test_tensorrt_without_plan_file_fails_clearly(tmp_path: Path) -> None:
    d = make_model(tmp_path, "m", 'platform: "tensorrt_plan"' + IO_FP32)
    error = load_err(d)
    assert "no version is available" in error
    assert "model.plan" in error


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
    model = _onnx_model(
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
    model = _onnx_model(
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


# ---------------------------------------------------------------------------
# Normalisation
# ---------------------------------------------------------------------------


def test_normalisation_defaults(tmp_path: Path) -> None:
    d = python_model(
        tmp_path, "m", 'backend: "python" max_batch_size: 8 dynamic_batching { }' + IO_FP32
    )
    config = load_ok(d).config
    assert config is not None
    assert list(config.dynamic_batching.preferred_batch_size) == [8]
    assert config.version_policy.WhichOneof("policy_choice") == "latest"
    assert config.version_policy.latest.num_versions == 1
    assert config.optimization.input_pinned_memory.enable is True
    assert config.optimization.output_pinned_memory.enable is True


def test_preferred_batch_size_left_empty_when_not_batching(tmp_path: Path) -> None:
    d = python_model(tmp_path, "m", 'backend: "python" dynamic_batching { }' + IO_FP32)
    config = load_ok(d).config
    assert config is not None
    assert list(config.dynamic_batching.preferred_batch_size) == []


def test_explicit_preferred_batch_size_kept(tmp_path: Path) -> None:
    config_text = (
        'backend: "python" max_batch_size: 8 dynamic_batching { preferred_batch_size: [ 2, 4 ] }'
    )
    d = python_model(tmp_path, "m", config_text + IO_FP32)
    config = load_ok(d).config
    assert config is not None
    assert list(config.dynamic_batching.preferred_batch_size) == [2, 4]


def test_sequence_batching_normalisation(tmp_path: Path) -> None:
    config_text = 'backend: "python" max_batch_size: 4 sequence_batching { oldest { } }'
    d = python_model(tmp_path, "m", config_text + IO_FP32)
    config = load_ok(d).config
    assert config is not None
    assert config.sequence_batching.max_sequence_idle_microseconds == 1_000_000
    assert list(config.sequence_batching.oldest.preferred_batch_size) == [4]


def test_sequence_idle_kept_when_set(tmp_path: Path) -> None:
    config_text = (
        'backend: "python" sequence_batching { max_sequence_idle_microseconds: 5 direct { } }'
    )
    d = python_model(tmp_path, "m", config_text + IO_FP32)
    config = load_ok(d).config
    assert config is not None
    assert config.sequence_batching.max_sequence_idle_microseconds == 5


# ---------------------------------------------------------------------------
# Instance groups
# ---------------------------------------------------------------------------


def test_default_instance_group_onnx_cpu(tmp_path: Path) -> None:
    d = make_model(tmp_path, "m", None, files={"model.onnx": fixed_onnx()})
    config = load_ok(d).config
    assert config is not None
    assert [(g.name, g.kind, g.count, list(g.gpus)) for g in config.instance_group] == [
        ("m", KIND_CPU, 2, [])
    ]
    assert instance_names(config) == [("m_0", KIND_CPU, -1), ("m_1", KIND_CPU, -1)]


def test_default_instance_group_python_cpu(tmp_path: Path) -> None:
    d = python_model(tmp_path, "m", 'backend: "python"')
    config = load_ok(d).config
    assert config is not None
    assert [(g.name, g.kind, g.count) for g in config.instance_group] == [("m", KIND_CPU, 1)]
    assert instance_names(config) == [("m_0", KIND_CPU, -1)]


def test_default_instance_group_with_gpus(tmp_path: Path) -> None:
    d = python_model(tmp_path, "m", 'backend: "python"')
    config = load_ok(d, gpu_ids=[1, 0]).config
    assert config is not None
    assert [(g.name, g.kind, g.count, list(g.gpus)) for g in config.instance_group] == [
        ("m", KIND_GPU, 1, [0, 1])
    ]
    assert instance_names(config) == [("m_0", KIND_GPU, 0), ("m_0", KIND_GPU, 1)]


def test_unnamed_groups_are_named_by_index(tmp_path: Path) -> None:
    config_text = """backend: "onnxruntime"
    instance_group [ { kind: KIND_CPU }, { name: "mine" count: 3 kind: KIND_CPU },
                     { kind: KIND_GPU count: 2 } ]"""
    d = make_model(tmp_path, "m", config_text + IO_FP32, files={"model.onnx": ""})
    config = load_ok(d, auto_complete=False, gpu_ids=(0, 1)).config
    assert config is not None
    assert [(g.name, g.kind, g.count, list(g.gpus)) for g in config.instance_group] == [
        ("m_0", KIND_CPU, 2, []),
        ("mine", KIND_CPU, 3, []),
        ("m_2", KIND_GPU, 2, [0, 1]),
    ]
    assert instance_names(config) == [
        ("m_0_0", KIND_CPU, -1),
        ("m_0_1", KIND_CPU, -1),
        ("mine_0", KIND_CPU, -1),
        ("mine_1", KIND_CPU, -1),
        ("mine_2", KIND_CPU, -1),
        ("m_2_0", KIND_GPU, 0),
        ("m_2_0", KIND_GPU, 1),
        ("m_2_1", KIND_GPU, 0),
        ("m_2_1", KIND_GPU, 1),
    ]


def test_kind_auto_resolution(tmp_path: Path) -> None:
    config_text = 'backend: "python" instance_group [ { count: 1 }, { gpus: [ 1 ] } ]'
    d = python_model(tmp_path, "m", config_text)
    config = load_ok(d, gpu_ids=(0, 1)).config
    assert config is not None
    assert [(g.kind, list(g.gpus)) for g in config.instance_group] == [
        (KIND_GPU, [0, 1]),
        (KIND_GPU, [1]),
    ]
    d = python_model(tmp_path, "n", 'backend: "python" instance_group [ { count: 1 } ]')
    cpu = load_ok(d).config
    assert cpu is not None
    assert [(g.kind, list(g.gpus)) for g in cpu.instance_group] == [(KIND_CPU, [])]


def test_kind_auto_with_absent_gpu_becomes_cpu_and_fails(tmp_path: Path) -> None:
    d = python_model(tmp_path, "m", 'backend: "python" instance_group [ { gpus: [ 5 ] } ]')
    assert load_err(d, gpu_ids=(0,)) == (
        "instance group m_0 of model m has kind KIND_CPU but specifies one or more GPUs"
    )


def test_kind_gpu_without_gpus_available(tmp_path: Path) -> None:
    d = python_model(tmp_path, "m", 'backend: "python" instance_group [ { kind: KIND_GPU } ]')
    assert (
        load_err(d) == "instance group m_0 of model m has kind KIND_GPU but no GPUs are available"
    )


def test_kind_gpu_with_unknown_gpu_id(tmp_path: Path) -> None:
    config_text = 'backend: "python" instance_group [ { kind: KIND_GPU gpus: [ 0, 3 ] } ]'
    d = python_model(tmp_path, "m", config_text)
    assert load_err(d, gpu_ids=(0, 1)) == (
        "instance group m_0 of model m specifies invalid or unsupported gpu id 3. GPUs with at "
        "least the minimum required CUDA compute compatibility of 6.000000 are: 0, 1"
    )
    error = load_err(d)
    assert error.startswith(
        "instance group m_0 of model m specifies invalid or unsupported gpu id 0"
    )


def test_kind_cpu_and_model_with_gpus_rejected(tmp_path: Path) -> None:
    d = python_model(
        tmp_path, "m", 'backend: "python" instance_group [ { kind: KIND_CPU gpus: 0 } ]'
    )
    assert load_err(d, gpu_ids=(0,)).endswith("has kind KIND_CPU but specifies one or more GPUs")
    d = python_model(
        tmp_path, "n", 'backend: "python" instance_group [ { kind: KIND_MODEL gpus: 0 } ]'
    )
    assert load_err(d, gpu_ids=(0,)) == (
        "instance group n_0 of model n has kind KIND_MODEL but specifies one or more GPUs"
    )


def test_kind_model_instance(tmp_path: Path) -> None:
    d = python_model(tmp_path, "m", 'backend: "python" instance_group [ { kind: KIND_MODEL } ]')
    config = load_ok(d).config
    assert config is not None
    assert instance_names(config) == [("m_0_0", KIND_MODEL, -1)]


def test_profile_only_for_tensorrt(tmp_path: Path) -> None:
    d = python_model(
        tmp_path, "m", 'backend: "python" instance_group [ { kind: KIND_CPU profile: "0" } ]'
    )
    assert "specifies profile field which is only supported for TensorRT models" in load_err(d)
    config_text = (
        'platform: "tensorrt_plan" instance_group [ { kind: KIND_GPU profile: "-1" } ]' + IO_FP32
    )
    d = make_model(tmp_path, "t", config_text, files={"model.plan": ""})
    assert "specifies invalid profile -1" in load_err(d, gpu_ids=(0,))


def test_ensemble_has_no_instance_groups(tmp_path: Path) -> None:
    d = make_model(tmp_path, "e", ENSEMBLE)
    config = load_ok(d).config
    assert config is not None
    assert len(config.instance_group) == 0
    assert not config.HasField("optimization")
    assert instance_names(config) == []


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config_text", "error"),
    [
        ("max_batch_size: -1", "'max_batch_size' must be non-negative value for m"),
        (
            "max_batch_size: 4 dynamic_batching { preferred_batch_size: [ 0 ] }",
            "dynamic batching preferred size must be positive for m",
        ),
        (
            "max_batch_size: 4 dynamic_batching { preferred_batch_size: [ 8 ] }",
            "dynamic batching preferred size must be <= max batch size for m",
        ),
        (
            "dynamic_batching { priority_levels: 3 }",
            "default priority level must be in range [1, 3] for m",
        ),
        (
            "dynamic_batching { priority_levels: 3 default_priority_level: 4 }",
            "default priority level must be in range [1, 3] for m",
        ),
        (
            "dynamic_batching { priority_levels: 2 default_priority_level: 1 "
            "priority_queue_policy { key: 3 value: { } } }",
            "priority queue policy must have priority level in range [1, 2] for m",
        ),
        (
            "dynamic_batching { priority_levels: 2 default_priority_level: 1 "
            "preserve_ordering: true }",
            "Only one priority level is allowed when 'preserve_ordering' is true for m",
        ),
        (
            "dynamic_batching { preserve_ordering: true default_queue_policy { "
            "timeout_action: DELAY default_timeout_microseconds: 10 } }",
            "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true "
            "for m",
        ),
        (
            "max_batch_size: 4 sequence_batching { oldest { preferred_batch_size: [ 5 ] } }",
            "sequence batching preferred batch size must be <= max batch size for m",
        ),
        (
            "sequence_batching { direct { minimum_slot_utilization: 1.5 } }",
            "sequence batching minimum slot utilization must be in range (0.0, 1.0] for m",
        ),
        (
            'sequence_batching { control_input [ { name: "C" control [ { kind: '
            "CONTROL_SEQUENCE_CORRID data_type: TYPE_FP32 } ] } ] }",
            "unexpected data type for control CONTROL_SEQUENCE_CORRID for m. Allowed data types "
            "are TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING",
        ),
        (
            'sequence_batching { control_input [ { name: "S" control [ { kind: '
            "CONTROL_SEQUENCE_START } ] } ] }",
            "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or "
            "'bool_false_true' for CONTROL_SEQUENCE_START for m",
        ),
        (
            'sequence_batching { control_input [ { name: "S" control [ { kind: '
            "CONTROL_SEQUENCE_END int32_false_true: [ 0, 1, 2 ] } ] } ] }",
            "sequence batching control 'int32_false_true' must have exactly 2 entries for "
            "CONTROL_SEQUENCE_END for m",
        ),
        (
            "sequence_batching { } response_cache { enable: true }",
            "Response Cache does not currently support model m with sequence batching scheduler. "
            "Please disable the response cache.",
        ),
        (
            "model_transaction_policy { decoupled: true } response_cache { enable: true }",
            "Response Cache does not currently support model m with 'decoupled' transaction "
            "policy. Please disable the response cache.",
        ),
        (
            'model_metrics { metric_control [ { metric_identifier { family: "f" } } ] }',
            "metric control must specify 'histogram_options'",
        ),
    ],
)
def test_model_config_validation(tmp_path: Path, config_text: str, error: str) -> None:
    d = python_model(tmp_path, "m", 'backend: "python" ' + config_text + IO_FP32)
    assert load_err(d) == error


@pytest.mark.parametrize(
    ("io_text", "error"),
    [
        ("input [ { data_type: TYPE_FP32 dims: 1 } ]", "model input must specify 'name' for m"),
        ('input [ { name: "A" dims: 1 } ]', "model input 'A' must specify 'data_type' for m"),
        (
            'input [ { name: "A" data_type: TYPE_FP32 } ]',
            "model input 'A' must specify 'dims' for m",
        ),
        (
            'output [ { name: "A" data_type: TYPE_FP32 dims: [ 2, 0 ] } ]',
            "model output 'A' dimension must be integer >= 1, or -1 to indicate a variable-size "
            "dimension for m",
        ),
        (
            'input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] reshape { shape: [ 3 ] } } ]',
            "model input 'A' has different size for dims and reshape for m",
        ),
        (
            'input [ { name: "A" data_type: TYPE_FP32 dims: [ 1 ] reshape { shape: [ ] } } ]',
            "model input 'A' cannot have empty reshape for non-batching model as scalar tensors "
            "are not supported for m",
        ),
        (
            'input [ { name: "A" data_type: TYPE_FP32 dims: [ 2, -1 ] '
            "reshape { shape: [ -1, -1 ] } } ]",
            "model input 'A' has different number of variable-size dimensions for dims and "
            "reshape for m",
        ),
        (
            'input [ { name: "A" data_type: TYPE_FP32 dims: [ 2, -1, 3 ] '
            "reshape { shape: [ 3, -1, 2 ] } } ]",
            "model input 'A' has different size for dims and reshape for m",
        ),
        (
            'input [ { name: "A" data_type: TYPE_FP32 format: FORMAT_NCHW dims: [ 3, 4 ] } ]',
            "model input NHWC/NCHW require 3 dims for m",
        ),
        (
            'input [ { name: "A" data_type: TYPE_INT32 dims: 1 is_shape_tensor: true } ]',
            "shape tensors are only supported for TensorRT platform for m",
        ),
        (
            'input [ { name: "A" data_type: TYPE_FP32 dims: 1 }, '
            '{ name: "A" data_type: TYPE_FP32 dims: 1 } ]',
            "model input 'A' is specified more than once for m",
        ),
        (
            'output [ { name: "O" data_type: TYPE_FP32 dims: 1 }, '
            '{ name: "O" data_type: TYPE_FP32 dims: 1 } ]',
            "model output 'O' is specified more than once for m",
        ),
        (
            'input [ { name: "A" data_type: TYPE_FP32 dims: 1 } ] batch_input [ { kind: '
            'BATCH_ELEMENT_COUNT target_name: "T" data_type: TYPE_FP32 '
            'source_input: [ "A", "A" ] } ]',
            "batch input kind 'BATCH_ELEMENT_COUNT' expects 1 source input, got 2 for m",
        ),
        (
            'output [ { name: "O" data_type: TYPE_FP32 dims: 1 } ] batch_output [ { target_name: '
            '[ "O", "O" ] kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "A" } ] '
            'input [ { name: "A" data_type: TYPE_FP32 dims: 1 } ]',
            "target output name 'O' can only be specified once for m",
        ),
    ],
)
@pytest.mark.parametrize("auto_complete", [True, False])
def test_io_validation(tmp_path: Path, io_text: str, error: str, auto_complete: bool) -> None:
    d = python_model(tmp_path, "m", 'backend: "python" ' + io_text)
    assert load_err(d, auto_complete=auto_complete) == error


def test_valid_reshapes_accepted(tmp_path: Path) -> None:
    io_text = """max_batch_size: 2
    input [ { name: "A" data_type: TYPE_FP32 dims: [ 2, 4, -1, 6 ]
              reshape { shape: [ 8, -1, 1, 6 ] } },
            { name: "B" data_type: TYPE_FP32 dims: [ 1 ] reshape { shape: [ ] } } ]
    output [ { name: "O" data_type: TYPE_FP32 dims: [ 3, 224, 224 ]
               reshape { shape: [ 1, 3, 224, 224 ] } } ]"""
    d = python_model(tmp_path, "m", 'backend: "python" ' + io_text)
    load_ok(d, auto_complete=False)


def test_failing_model_keeps_partial_config(tmp_path: Path) -> None:
    d = python_model(tmp_path, "m", 'backend: "python" max_batch_size: -3')
    model = load_model(d)
    assert model.error is not None
    assert model.config is not None
    assert model.config.max_batch_size == -3
    assert model.versions == ()


# ---------------------------------------------------------------------------
# Ensembles
# ---------------------------------------------------------------------------

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


def test_ensemble_loads_without_model_file(tmp_path: Path) -> None:
    d = make_model(tmp_path, "e", ENSEMBLE)
    model = load_ok(d)
    assert model.versions == (ModelVersion(1, d / "1", d / "1"),)
    assert model.config.backend == ""  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("replace", "error"),
    [
        (
            ('value: "MID" } },', 'value: "X" } },'),
            "output 'OUT' for ensemble 'e' is not written: at least one of its depending tensors, "
            "'MID', is not connected",
        ),
        (
            ('value: "OUT" }', 'value: "MID" }'),
            "ensemble tensor 'MID' can appear in an output map only once for ensemble 'e' step 1",
        ),
        (
            ('model_name: "b"', 'model_name: ""'),
            "must specify 'model_name' in step 1 of ensemble 'e'",
        ),
        (('name: "IN"', 'name: "UNUSED"'), "ensemble input 'UNUSED' for ensemble e' is not used"),
        (
            (
                "ensemble_scheduling {",
                "optimization { priority: PRIORITY_MAX }\nensemble_scheduling {",
            ),
            "optimization should not be specified for ensemble 'e'",
        ),
        (
            (
                "ensemble_scheduling {",
                "instance_group [ { kind: KIND_CPU } ]\nensemble_scheduling {",
            ),
            "instance group should not be specified for ensemble 'e'",
        ),
        (
            (
                "ensemble_scheduling {",
                'model_warmup [ { name: "w" batch_size: 1 } ]\nensemble_scheduling {',
            ),
            "model_warmup can not be specified for ensemble 'e'",
        ),
        (
            ('input_map { key: "INPUT0" value: "IN" }', ""),
            "must specify 'input_map' in step 0 of ensemble 'e'",
        ),
        (
            ('output_map { key: "OUTPUT0" value: "OUT" }', ""),
            "must specify 'output_map' in step 1 of ensemble 'e'",
        ),
        (
            ('output [ { name: "OUT"', 'output [ { name: "OUT2"'),
            "ensemble output 'OUT2' for ensemble e' is not used",
        ),
        (
            (
                "  ]\n}",
                '  , { model_name: "c" input_map { key: "INPUT0" value: "MID" }\n'
                '      output_map { key: "OUTPUT0" value: "SPARE" } } ]\n}',
            ),
            "ensemble tensor 'SPARE' is unused in ensemble 'e'",
        ),
    ],
)
def test_ensemble_validation(tmp_path: Path, replace: tuple[str, str], error: str) -> None:
    d = make_model(tmp_path, "e", ENSEMBLE.replace(*replace, 1))
    assert load_err(d) == error


def test_ensemble_scheduling_without_steps_is_refused(tmp_path: Path) -> None:
    config = ENSEMBLE[: ENSEMBLE.index("ensemble_scheduling")] + "ensemble_scheduling { }"
    d = make_model(tmp_path, "e", config)
    assert load_err(d) == "must specify 'step' for ensemble 'e'"


def test_ensemble_platform_requires_scheduling(tmp_path: Path) -> None:
    d = make_model(tmp_path, "e", 'platform: "ensemble"')
    assert (
        load_err(d) == "ensemble scheduling must be set for ensemble e whose platform is ensemble"
    )


# ---------------------------------------------------------------------------
# load_repository
# ---------------------------------------------------------------------------


def test_load_repository_sorted_and_isolates_failures(tmp_path: Path) -> None:
    make_model(tmp_path, "b_onnx", None, files={"model.onnx": batchable_onnx()})
    python_model(tmp_path, "a_python", 'backend: "python"')
    python_model(tmp_path, "c_bad", 'name: "wrong" backend: "python"')
    (tmp_path / "README.md").write_text("not a model")
    (tmp_path / ".hidden").mkdir()
    models = load_repository(tmp_path)
    assert [m.name for m in models] == ["a_python", "b_onnx", "c_bad"]
    assert [m.error is None for m in models] == [True, True, False]
    assert models[1].directory == tmp_path / "b_onnx"


def test_load_repository_missing_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="model repository not found"):
        load_repository(tmp_path / "absent")


def test_load_repository_passes_options(tmp_path: Path) -> None:
    make_model(tmp_path, "m", 'backend: "onnxruntime"', files={"model.onnx": batchable_onnx()})
    (model,) = load_repository(tmp_path, default_max_batch_size=2, gpu_ids=(0,))
    assert model.config is not None
    assert model.config.max_batch_size == 2
    assert model.config.instance_group[0].kind == KIND_GPU
    (model,) = load_repository(tmp_path, auto_complete=False)
    assert model.config is not None
    assert model.config.max_batch_size == 0


def test_ensemble_with_available_steps(tmp_path: Path) -> None:
    make_model(tmp_path, "e", ENSEMBLE)
    make_model(tmp_path, "a", None, files={"model.onnx": batchable_onnx()})
    make_model(tmp_path, "b", None, files={"model.onnx": batchable_onnx()})
    assert [m.error for m in load_repository(tmp_path)] == [None, None, None]


def test_ensemble_with_missing_or_failed_steps(tmp_path: Path) -> None:
    make_model(tmp_path, "e", ENSEMBLE)
    python_model(tmp_path, "a", 'backend: "python" max_batch_size: -1')
    models = {m.name: m for m in load_repository(tmp_path)}
    assert models["e"].error == "ensemble e contains models that are not available: a, b"
    assert models["e"].versions == ()


def test_ensemble_of_failed_ensemble_fails(tmp_path: Path) -> None:
    make_model(tmp_path, "e", ENSEMBLE)
    outer = ENSEMBLE.replace('model_name: "a"', 'model_name: "e"')
    make_model(tmp_path, "outer", outer)
    make_model(tmp_path, "b", None, files={"model.onnx": batchable_onnx()})
    models = {m.name: m for m in load_repository(tmp_path)}
    assert models["e"].error == "ensemble e contains models that are not available: a"
    assert models["outer"].error == "ensemble outer contains models that are not available: e"
    assert models["b"].error is None


def test_circular_ensembles_fail(tmp_path: Path) -> None:
    make_model(tmp_path, "x", ENSEMBLE.replace('model_name: "a"', 'model_name: "y"'))
    make_model(tmp_path, "y", ENSEMBLE.replace('model_name: "a"', 'model_name: "x"'))
    make_model(tmp_path, "b", None, files={"model.onnx": batchable_onnx()})
    models = {m.name: m for m in load_repository(tmp_path)}
    assert models["x"].error == "circular dependency between ensembles: x -> y -> x"
    assert models["y"].error == "circular dependency between ensembles: y -> x -> y"


# ---------------------------------------------------------------------------
# JSON and data types
# ---------------------------------------------------------------------------


def test_config_to_json_shape(tmp_path: Path) -> None:
    config_text = """
    backend: "python"
    max_batch_size: 0
    version_policy { specific { versions: [ 1 ] } }
    input [ { name: "A" data_type: TYPE_STRING dims: [ -1, 3 ] reshape { shape: [ -1, 3 ] } } ]
    output [ { name: "O" data_type: TYPE_FP32 dims: [ 1 ] } ]
    dynamic_batching {
      max_queue_delay_microseconds: 18446744073709551615
      priority_levels: 2 default_priority_level: 1
      priority_queue_policy { key: 2 value: { default_timeout_microseconds: 7 } }
    }
    model_warmup [ { name: "w" batch_size: 1 inputs { key: "A" value: {
      data_type: TYPE_STRING dims: [ 3 ] zero_data: true } } } ]
    """
    d = python_model(tmp_path, "m", config_text)
    config = load_ok(d).config
    assert config is not None
    doc = config_to_json(config)
    assert json.loads(json.dumps(doc)) == doc
    assert doc["max_batch_size"] == 0
    assert doc["platform"] == ""
    assert doc["name"] == "m"
    assert doc["input"][0]["dims"] == [-1, 3]
    assert doc["input"][0]["reshape"] == {"shape": [-1, 3]}
    assert doc["input"][0]["data_type"] == "TYPE_STRING"
    assert doc["input"][0]["optional"] is False
    assert doc["output"][0]["label_filename"] == ""
    assert doc["version_policy"] == {"specific": {"versions": [1]}}
    db = doc["dynamic_batching"]
    assert db["max_queue_delay_microseconds"] == 18446744073709551615
    assert db["priority_levels"] == 2
    assert db["default_priority_level"] == 1
    assert db["preferred_batch_size"] == []
    assert db["priority_queue_policy"]["2"]["default_timeout_microseconds"] == 7
    assert doc["model_warmup"][0]["inputs"]["A"]["dims"] == [3]
    assert doc["instance_group"][0]["kind"] == "KIND_CPU"
    assert doc["instance_group"][0]["gpus"] == []
    assert doc["parameters"] == {}
    # Triton's JSON parses back into the same config
    back = json_format.ParseDict(doc, pb.ModelConfig())
    assert back == config


def test_config_to_json_sequence_and_ensemble_int64(tmp_path: Path) -> None:
    config = pb.ModelConfig()
    text_format.Parse(
        """
        name: "m"
        sequence_batching {
          max_sequence_idle_microseconds: 5
          oldest { max_queue_delay_microseconds: 6 }
          state [ { input_name: "i" output_name: "o" dims: [ 2 ]
                    initial_state [ { dims: [ 2 ] zero_data: true name: "z" } ] } ]
        }
        """,
        config,
    )
    doc = config_to_json(config)
    seq = doc["sequence_batching"]
    assert seq["max_sequence_idle_microseconds"] == 5
    assert seq["oldest"]["max_queue_delay_microseconds"] == 6
    assert seq["state"][0]["dims"] == [2]
    assert seq["state"][0]["initial_state"][0]["dims"] == [2]
    ensemble = pb.ModelConfig()
    text_format.Parse("ensemble_scheduling { step [ { model_version: -1 } ] }", ensemble)
    assert config_to_json(ensemble)["ensemble_scheduling"]["step"][0]["model_version"] == -1


@pytest.mark.parametrize(
    ("dt", "protocol"),
    [
        (pb.TYPE_BOOL, "BOOL"),
        (pb.TYPE_UINT8, "UINT8"),
        (pb.TYPE_UINT16, "UINT16"),
        (pb.TYPE_UINT32, "UINT32"),
        (pb.TYPE_UINT64, "UINT64"),
        (pb.TYPE_INT8, "INT8"),
        (pb.TYPE_INT16, "INT16"),
        (pb.TYPE_INT32, "INT32"),
        (pb.TYPE_INT64, "INT64"),
        (pb.TYPE_FP16, "FP16"),
        (pb.TYPE_FP32, "FP32"),
        (pb.TYPE_FP64, "FP64"),
        (pb.TYPE_STRING, "BYTES"),
        (pb.TYPE_BF16, "BF16"),
    ],
)
def test_datatype_protocol_round_trip(dt: int, protocol: str) -> None:
    assert DataType(dt).wire == protocol
    assert DataType.from_wire(protocol) == dt


@pytest.mark.parametrize("bad", ["STRING", "INVALID", "fp32", "FLOAT", ""])
def test_unknown_protocol_strings(bad: str) -> None:
    assert DataType.from_wire(bad) == pb.TYPE_INVALID


def test_invalid_datatype_to_protocol() -> None:
    assert DataType(pb.TYPE_INVALID).wire == "INVALID"


def test_package_does_not_import_onnxruntime() -> None:
    for path in Path(triton_mp.model_config.__file__).parent.glob("*.py"):
        assert "import onnxruntime" not in path.read_text(), path.name


def test_onnx_autocomplete_rejects_unsupported_element_type(tmp_path: Path) -> None:
    model = _onnx_model(
        [("INPUT0", TensorProto.COMPLEX64, ["b", 2])], [("OUTPUT0", TensorProto.FLOAT, ["b", 2])]
    )
    d = make_model(tmp_path, "m", None, files={"model.onnx": model})
    assert load_err(d) == (
        "autofill failed for model 'm': unsupported ONNX data type COMPLEX64 for input 'INPUT0' "
        "of model 'm'"
    )


def test_unexpected_exception_becomes_the_model_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(*_args: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(loader_mod, "auto_complete_backend_fields", boom)
    d = python_model(tmp_path, "m", 'backend: "python"')
    assert load_err(d) == "failed to load 'm': RuntimeError: boom"
