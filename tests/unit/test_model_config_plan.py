"""Unit tests for model_config.plan: loaded models -> version specs and instances.

Configs are built in memory (text format); no file is read and no process is started.
"""

from __future__ import annotations

from pathlib import Path

from google.protobuf import text_format

from triton_mp._proto import model_config_pb2 as pb
from triton_mp.ipc.protocol.specs import QueuePolicySpec
from triton_mp.model_config.loader import ModelVersion, RepositoryModel
from triton_mp.model_config.plan import plan_models

ROOT = Path("/repo")

IO = """
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] optional: true } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ -1 ] reshape: { shape: [ ] } } ]
"""


def _model(
    name: str, text: str, *, versions: tuple[int, ...] = (1,), error: str | None = None
) -> RepositoryModel:
    config = text_format.Parse(f'name: "{name}" {text}', pb.ModelConfig())
    directory = ROOT / name
    chosen = tuple(
        ModelVersion(v, directory / str(v), directory / str(v) / "model.py") for v in versions
    )
    return RepositoryModel(name, directory, config, () if error else chosen, error)


def _python(name: str, extra: str = "", **kwargs: object) -> RepositoryModel:
    groups = 'instance_group [ { name: "g" kind: KIND_CPU count: 2 } ]'
    return _model(name, f'backend: "python" {IO} {groups} {extra}', **kwargs)  # type: ignore[arg-type]


def test_instance_ids_are_dense_across_models_and_versions() -> None:
    plans, instances = plan_models(
        [_python("a", versions=(1, 2)), _python("b")], first_instance_id=10
    )
    assert [i.instance_id for i in instances] == [10, 11, 12, 13, 14, 15]
    assert [(i.model, i.version, i.name) for i in instances] == [
        ("a", 1, "g_0"),
        ("a", 1, "g_1"),
        ("a", 2, "g_0"),
        ("a", 2, "g_1"),
        ("b", 1, "g_0"),
        ("b", 1, "g_1"),
    ]
    a = plans[0]
    assert [v.version for v in a.versions] == [1, 2]
    assert a.versions[1].instance_ids == (12, 13)
    assert a.versions[1].instance_names == ("g_0", "g_1")
    assert a.instances == instances[:4]


def test_only_versions_leaves_the_others_out() -> None:
    plans, instances = plan_models([_python("a", versions=(1, 2, 3))], only_versions={"a": {2}})
    assert [v.version for v in plans[0].versions] == [2]
    assert [i.version for i in instances] == [2, 2]
    plans, instances = plan_models([_python("a")], only_versions={})
    assert plans[0].versions == []
    assert instances == []
    assert plans[0].error == ""


def test_refusals_keep_todays_messages_and_ensembles_plan() -> None:
    plans, instances = plan_models(
        [
            _python("failed", error="it broke"),
            _model("e", 'platform: "ensemble"'),
            _model("trt", 'backend: "tensorrt" platform: "tensorrt_plan"'),
            _model("custom", 'backend: "mine"'),
        ]
    )
    assert [p.error for p in plans] == [
        "it broke",
        "",
        "backend 'tensorrt' is not supported by triton-mp yet",
        "backend 'mine' is not supported by triton-mp yet",
    ]
    assert instances == []


def test_tensor_specs() -> None:
    (plan,), _ = plan_models([_python("a")])
    spec = plan.versions[0]
    assert spec.backend == "python"
    assert spec.model_file == str((ROOT / "a" / "1" / "model.py").resolve())
    assert spec.max_batch_size == 8
    (inp,) = spec.inputs
    assert (inp.name, inp.datatype, inp.dims, inp.reshape, inp.optional) == (
        "IN",
        "FP32",
        (4,),
        None,
        True,
    )
    (out,) = spec.outputs
    assert (out.name, out.datatype, out.dims, out.reshape) == ("OUT", "BYTES", (-1,), ())
    assert spec.sequence is None
    assert not spec.decoupled
    assert '"max_batch_size": 8' in spec.config_json


def test_unknown_data_type_number_is_invalid() -> None:
    m = _model(
        "a",
        'backend: "python" input [ { name: "X" data_type: 99 dims: [ 1 ] } ] '
        'instance_group [ { kind: KIND_CPU count: 1 name: "g" } ]',
    )
    (plan,), _ = plan_models([m])
    assert plan.versions[0].inputs[0].datatype == "INVALID"


def test_batching_specs() -> None:
    default, _ = plan_models([_python("a")])
    assert default[0].versions[0].batching.kind == "default"
    dynamic = """dynamic_batching {
      preferred_batch_size: [ 2, 4 ] max_queue_delay_microseconds: 100 priority_levels: 2
      default_priority_level: 1
      default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 7
                             allow_timeout_override: true max_queue_size: 3 }
      priority_queue_policy { key: 2 value: { max_queue_size: 5 } } }"""
    (plan,), _ = plan_models([_python("a", dynamic)])
    b = plan.versions[0].batching
    assert (b.kind, b.max_batch_size, b.preferred_batch_sizes, b.max_queue_delay_us) == (
        "dynamic",
        8,
        (2, 4),
        100,
    )
    assert (b.priority_levels, b.default_priority_level) == (2, 1)
    assert b.default_queue_policy == QueuePolicySpec(
        timeout_action="DELAY", default_timeout_us=7, allow_timeout_override=True, max_queue_size=3
    )
    assert b.priority_queue_policy == {2: QueuePolicySpec(max_queue_size=5)}


def test_sequence_spec() -> None:
    sequence = """sequence_batching {
      max_sequence_idle_microseconds: 5000
      oldest { max_candidate_sequences: 4 preferred_batch_size: [ 2 ] }
      control_input [
        { name: "S" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
        { name: "R" control [ { kind: CONTROL_SEQUENCE_READY fp32_false_true: [ 0, 2 ] } ] },
        { name: "E" control [ { kind: CONTROL_SEQUENCE_END bool_false_true: [ false, true ] } ] },
        { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] } ]
      state [ { input_name: "SI" output_name: "SO" data_type: TYPE_FP32 dims: [ 2 ]
                initial_state [ { name: "init" data_type: TYPE_FP32 dims: [ 2 ]
                                  data_file: "zeros.bin" } ] },
              { input_name: "ZI" output_name: "ZO" data_type: TYPE_INT32 dims: [ 1 ]
                initial_state [ { name: "z" data_type: TYPE_INT32 dims: [ 1 ]
                                  zero_data: true } ] } ] }"""
    (plan,), _ = plan_models([_python("s", sequence)])
    spec = plan.versions[0]
    assert plan.versions[0].batching.kind == "sequence"
    seq = spec.sequence
    assert seq is not None
    assert (seq.strategy, seq.max_sequence_idle_us, seq.max_candidate_sequences) == (
        "oldest",
        5000,
        4,
    )
    assert seq.preferred_batch_sizes == (2,)
    assert [(c.name, c.kind, c.datatype, c.false_value, c.true_value) for c in seq.controls] == [
        ("S", "START", "INT32", 0.0, 1.0),
        ("R", "READY", "FP32", 0.0, 2.0),
        ("E", "END", "BOOL", 0.0, 1.0),
        ("C", "CORRID", "UINT64", 0.0, 1.0),
    ]
    first, second = seq.states
    assert (first.initial, first.data_file) == (
        "file",
        str(ROOT / "s" / "initial_state" / "zeros.bin"),
    )
    assert (second.initial, second.datatype, second.dims) == ("zero", "INT32", (1,))


def test_direct_sequence_strategy() -> None:
    direct = "sequence_batching { direct { minimum_slot_utilization: 0.5 } }"
    (plan,), _ = plan_models([_python("s", direct)])
    seq = plan.versions[0].sequence
    assert seq is not None
    assert (seq.strategy, seq.minimum_slot_utilization) == ("direct", 0.5)
