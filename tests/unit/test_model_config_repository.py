"""Unit tests for triton_mp.model_config: loading a whole repository
(ensembles with their steps, failures kept apart), the JSON form of a config and datatype
names.

Every model repository is built in tmp_path (``tests.helpers.model_config_builders``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from google.protobuf import json_format, text_format

import triton_mp.model_config
from tests.helpers.model_config_builders import (
    ENSEMBLE,
    KIND_GPU,
    batchable_onnx,
    load_err,
    load_ok,
    make_model,
    python_model,
)
from triton_mp._proto import model_config_pb2 as pb
from triton_mp.common.datatypes import DataType
from triton_mp.common.errors import ConfigError
from triton_mp.common.json_form import config_to_json
from triton_mp.model_config import loader as loader_mod
from triton_mp.model_config.loader import (
    load_repository,
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


def test_unexpected_exception_becomes_the_model_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(*_args: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(loader_mod, "auto_complete_backend_fields", boom)
    d = python_model(tmp_path, "m", 'backend: "python"')
    assert load_err(d) == "failed to load 'm': RuntimeError: boom"
