"""Unit tests for triton_mp.model_config: reading config.pbtxt, version
directories and policies, the config's presence and name, and how the backend and
platform are found.

Every model repository is built in tmp_path (``tests.helpers.model_config_builders``).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.helpers.model_config_builders import (
    IO_FP32,
    fixed_onnx,
    load_err,
    load_ok,
    make_model,
    python_model,
)
from triton_mp._proto import model_config_pb2 as pb
from triton_mp.common.errors import ConfigError, ErrorCode
from triton_mp.model_config.loader import (
    ModelVersion,
    load_model,
    read_config_pbtxt,
)

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
    expected = "at least one version must be available under the version policy of model 'm'"
    assert load_err(d) == expected


def test_no_version_directory_fails(tmp_path: Path) -> None:
    d = python_model(tmp_path, "m", 'backend: "python"', versions=())
    expected = "at least one version must be available under the version policy of model 'm'"
    assert load_err(d) == expected


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
