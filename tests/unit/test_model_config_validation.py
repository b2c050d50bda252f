"""Unit tests for triton_mp.model_config: config and I/O validation with
Triton's messages, and the ensembles' rules.

Every model repository is built in tmp_path (``tests.helpers.model_config_builders``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.model_config_builders import (
    ENSEMBLE,
    IO_FP32,
    load_err,
    load_ok,
    make_model,
    python_model,
)
from triton_mp.model_config.loader import (
    ModelVersion,
    load_model,
)

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
