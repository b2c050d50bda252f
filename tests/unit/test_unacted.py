"""Unit tests for model_config.unacted: every set field triton-mp ignores is named.

Configs are built in memory; nothing is read or started.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from google.protobuf import text_format

from triton_mp._proto import model_config_pb2 as pb
from triton_mp.model_config.loader import ModelVersion, RepositoryModel
from triton_mp.model_config.plan import plan_models
from triton_mp.model_config.unacted import refusal, unacted_fields

BASE = """
name: "m" backend: "{backend}" max_batch_size: 4
input [ {{ name: "I" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "O" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ name: "g" kind: KIND_CPU count: 1 }} ]
"""


def _config(extra: str = "", backend: str = "python") -> pb.ModelConfig:
    return text_format.Parse(BASE.format(backend=backend) + extra, pb.ModelConfig())


def test_a_plain_config_warns_about_nothing() -> None:
    assert unacted_fields(_config()) == []
    acted = """
    dynamic_batching { max_queue_delay_microseconds: 10 }
    optimization { priority: PRIORITY_MIN
                   input_pinned_memory { enable: true } output_pinned_memory { enable: true } }
    model_warmup [ { name: "w" batch_size: 1 } ]
    response_cache { enable: true }
    parameters [ { key: "anything" value: { string_value: "x" } } ]
    """
    assert unacted_fields(_config(acted)) == []
    ort = """
    optimization { graph { level: 1 }
                   execution_accelerators { cpu_execution_accelerator [ { name: "openvino" } ] } }
    model_operations { op_library_filename: [ "/x.so" ] }
    parameters [ { key: "intra_op_thread_count" value: { string_value: "1" } },
                 { key: "session.x" value: { string_value: "1" } } ]
    """
    assert unacted_fields(_config(ort, backend="onnxruntime")) == []
    torch_params = """
    parameters [ { key: "INFERENCE_MODE" value: { string_value: "false" } },
                 { key: "INTRA_OP_THREAD_COUNT" value: { string_value: "2" } } ]
    """
    assert unacted_fields(_config(torch_params, backend="pytorch")) == []


def test_pytorch_and_cuda_fields_not_acted_on_are_named() -> None:
    cfg = _config(
        'parameters [ { key: "MAX_THREADS" value: { string_value: "2" } } ]\n'
        "optimization { cuda { graphs: true busy_wait_events: true output_copy_stream: true } }",
        backend="pytorch",
    )
    said = unacted_fields(cfg)
    assert "parameters 'MAX_THREADS': not a PyTorch backend parameter" in said
    assert sum("optimization.cuda" in s for s in said) == 3


@pytest.mark.parametrize(
    ("extra", "backend", "field"),
    [
        ('runtime: "model.so"', "python", "runtime"),
        ("optimization { graph { level: 1 } }", "python", "optimization.graph.level"),
        (
            "optimization { execution_accelerators { "
            'cpu_execution_accelerator [ { name: "openvino" } ] } }',
            "python",
            "optimization.execution_accelerators",
        ),
        ("optimization { input_pinned_memory { enable: false } }", "python", "input_pinned_memory"),
        (
            "optimization { output_pinned_memory { enable: false } }",
            "python",
            "output_pinned_memory",
        ),
        (
            "optimization { gather_kernel_buffer_threshold: 4 }",
            "python",
            "gather_kernel_buffer_threshold",
        ),
        ("optimization { eager_batching: true }", "python", "eager_batching"),
        (
            'input [ { name: "F" data_type: TYPE_FP32 dims: [ 1, 1, 1 ] format: FORMAT_NCHW } ]',
            "python",
            "format FORMAT_NCHW",
        ),
        (
            'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "C" data_type: TYPE_FP32 '
            'source_input: "I" } ]',
            "python",
            "batch_input",
        ),
        ('instance_group [ { name: "p" kind: KIND_CPU passive: true } ]', "python", "passive"),
        (
            'instance_group [ { name: "d" kind: KIND_CPU '
            "secondary_devices [ { kind: KIND_NVDLA device_id: 0 } ] } ]",
            "python",
            "secondary_devices",
        ),
        ('metric_tags { key: "team" value: "a" }', "python", "metric_tags"),
        ("model_metrics { }", "python", "model_metrics"),
        ('model_operations { op_library_filename: [ "/x.so" ] }', "python", "model_operations"),
        (
            'parameters [ { key: "EXECUTION_ENV_PATH" value: { string_value: "/env.tar.gz" } } ]',
            "python",
            "EXECUTION_ENV_PATH",
        ),
        (
            'parameters [ { key: "intra_op_threads" value: { string_value: "1" } } ]',
            "onnxruntime",
            "intra_op_threads",
        ),
    ],
)
def test_each_ignored_field_is_named(extra: str, backend: str, field: str) -> None:
    warnings = unacted_fields(_config(extra, backend))
    assert len(warnings) == 1, warnings
    assert field in warnings[0]


def test_iterative_sequence_is_acted_on() -> None:
    """Iterative sequence batching is implemented (the scheduler's sequence batcher)."""
    assert unacted_fields(_config("sequence_batching { iterative_sequence: true }", "python")) == []


def test_repository_agents_are_refused() -> None:
    assert refusal(_config()) == ""
    config = _config('model_repository_agents { agents [ { name: "checksum" } ] }')
    assert refusal(config) == (
        "model repository agents are not supported by triton-mp (requested: 'checksum')"
    )
    d = Path("/repo/m")
    m = RepositoryModel("m", d, config, (ModelVersion(1, d / "1", d / "1/model.py"),), None)
    plans, instances = plan_models([m])
    assert instances == []
    assert "repository agents" in plans[0].error


def test_the_planner_logs_each_warning(caplog: pytest.LogCaptureFixture) -> None:
    d = Path("/repo/m")
    config = _config("optimization { eager_batching: true }")
    m = RepositoryModel("m", d, config, (ModelVersion(1, d / "1", d / "1/model.py"),), None)
    with caplog.at_level(logging.WARNING, logger="triton_mp.model_config.plan"):
        plan_models([m])
    assert any("model 'm': optimization.eager_batching" in r.getMessage() for r in caplog.records)
