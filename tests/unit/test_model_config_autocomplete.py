"""Unit tests for model_config.autocomplete (AutoCompleteBackendFields) and the version policy
(loader.choose_versions), on small directories; no process is started."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import text_format

from triton_mp._proto import model_config_pb2 as pb
from triton_mp.common.errors import ConfigError
from triton_mp.model_config.autocomplete import auto_complete_backend_fields
from triton_mp.model_config.loader import choose_versions


def _fields(
    tmp_path: Path, config_text: str = "", files: tuple[str, ...] = (), dirs: tuple[str, ...] = ()
) -> tuple[str, str, str]:
    """Run the completion on ``<tmp>/m/1/{files, dirs}``; return (backend, platform, file)."""
    version = tmp_path / "m" / "1"
    version.mkdir(parents=True)
    for name in files:
        (version / name).write_text("")
    for name in dirs:
        (version / name).mkdir()
    config = text_format.Parse(config_text, pb.ModelConfig())
    auto_complete_backend_fields("m", tmp_path / "m", config)
    assert config.name == "m"
    return config.backend, config.platform, config.default_model_filename


@pytest.mark.parametrize(
    ("files", "dirs", "expected"),
    [
        (("model.graphdef",), (), ("tensorflow", "tensorflow_graphdef", "model.graphdef")),
        ((), ("model.savedmodel",), ("tensorflow", "tensorflow_savedmodel", "model.savedmodel")),
        (("model.plan",), (), ("tensorrt", "tensorrt_plan", "model.plan")),
        ((), ("model.onnx",), ("onnxruntime", "onnxruntime_onnx", "model.onnx")),
        (("model.xml",), (), ("openvino", "", "model.xml")),
        # NOTE: as today, a platform inferred from model.pt leaves the file name empty.
        (("model.pt",), (), ("pytorch", "pytorch_libtorch", "")),
        (("model.pt2",), (), ("pytorch", "torch_aoti", "model.pt2")),
        (("model.py",), (), ("python", "", "model.py")),
        # Triton's order decides between several artifacts.
        (("model.plan", "model.onnx"), (), ("tensorrt", "tensorrt_plan", "model.plan")),
        (("model.onnx", "model.py"), (), ("onnxruntime", "onnxruntime_onnx", "model.onnx")),
        (("model.xml", "model.pt"), (), ("openvino", "", "model.xml")),
        (("model.pt", "model.py"), (), ("pytorch", "pytorch_libtorch", "")),
        (
            ("model.graphdef", "model.plan"),
            (),
            ("tensorflow", "tensorflow_graphdef", "model.graphdef"),
        ),
    ],
)
def test_backend_from_the_first_version_directory(
    tmp_path: Path, files: tuple[str, ...], dirs: tuple[str, ...], expected: tuple[str, str, str]
) -> None:
    assert _fields(tmp_path, files=files, dirs=dirs) == expected


def test_a_plan_directory_is_not_tensorrt(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="Could not determine backend"):
        _fields(tmp_path, dirs=("model.plan",))


@pytest.mark.parametrize(
    ("config_text", "expected"),
    [
        ('platform: "libtorch"', ("pytorch", "libtorch", "")),
        ('platform: "torch_aoti"', ("pytorch", "torch_aoti", "model.pt2")),
        ('backend: "pytorch"', ("pytorch", "pytorch_libtorch", "model.pt")),
        ('default_model_filename: "model.xml"', ("openvino", "", "model.xml")),
        (
            'backend: "tensorflow" platform: "tensorflow_savedmodel"',
            ("tensorflow", "tensorflow_savedmodel", "model.savedmodel"),
        ),
        (
            'default_model_filename: "model.graphdef"',
            ("tensorflow", "tensorflow_graphdef", "model.graphdef"),
        ),
        (
            'platform: "tensorflow_graphdef" backend: "onnxruntime"',
            ("onnxruntime", "tensorflow_graphdef", "model.graphdef"),
        ),
        ('backend: "python" default_model_filename: "main.py"', ("python", "", "main.py")),
        ('backend: "mine"', ("mine", "", "")),
        ('platform: "custom"', ("", "custom", "")),
    ],
)
def test_backend_from_the_config(
    tmp_path: Path, config_text: str, expected: tuple[str, str, str]
) -> None:
    assert _fields(tmp_path, config_text, files=("model.py",)) == expected


def test_custom_backend_from_the_directory_name(tmp_path: Path) -> None:
    (tmp_path / "m.identity" / "1").mkdir(parents=True)
    config = pb.ModelConfig()
    auto_complete_backend_fields("m.identity", tmp_path / "m.identity", config)
    assert (config.name, config.backend, config.default_model_filename) == (
        "m.identity",
        "identity",
        "model.identity",
    )


def test_only_the_first_version_directory_counts(tmp_path: Path) -> None:
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "2").mkdir()
    (tmp_path / "m" / "2" / "model.py").write_text("")
    with pytest.raises(ConfigError, match="Could not determine backend"):
        auto_complete_backend_fields("m", tmp_path / "m", pb.ModelConfig())


def _policy(text: str) -> pb.ModelVersionPolicy:
    return text_format.Parse(text, pb.ModelVersionPolicy())


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", {7}),  # NOTE: latest { num_versions: 0 } after normalisation is never seen here
        ("latest { num_versions: 2 }", {3, 7}),
        ("latest { num_versions: 9 }", {1, 3, 7}),
        ("all { }", {1, 3, 7}),
        ("specific { versions: [ 3, 4 ] }", {3}),
    ],
)
def test_version_policy(text: str, expected: set[int]) -> None:
    policy = _policy(text)
    if not text:
        policy.latest.num_versions = 1
    assert choose_versions(policy, {1, 3, 7}, "m") == expected
