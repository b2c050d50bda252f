"""Unit tests for triton_mp.model_config: the normalised defaults (batching,
sequence idle time) and instance groups (kinds, counts, names, GPUs).

Every model repository is built in tmp_path (``tests.helpers.model_config_builders``).
"""

from __future__ import annotations

from pathlib import Path

from tests.helpers.model_config_builders import (
    ENSEMBLE,
    IO_FP32,
    KIND_CPU,
    KIND_GPU,
    KIND_MODEL,
    fixed_onnx,
    load_err,
    load_ok,
    make_model,
    python_model,
)
from triton_mp.model_config.plan import instance_names

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
