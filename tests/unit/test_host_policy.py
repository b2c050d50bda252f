"""Unit tests for common.process.host_policy and the planner's host policies and nice values.

No process is started; configs are built in memory.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import text_format

from triton_mp._proto import model_config_pb2 as pb
from triton_mp.common.errors import ConfigError, ErrorCode, TritonMPError
from triton_mp.common.process.host_policy import (
    add_host_policy,
    default_policy_name,
    parse_cpu_cores,
    parse_host_policy_option,
    parse_numa_node,
)
from triton_mp.model_config.loader import ModelVersion, RepositoryModel
from triton_mp.model_config.plan import plan_models


def test_the_flag_splits_into_name_setting_and_value() -> None:
    assert parse_host_policy_option("gpu_0,cpu-cores=0-3,6") == ("gpu_0", "cpu-cores", "0-3,6")
    assert parse_host_policy_option("cpu,numa-node=1") == ("cpu", "numa-node", "1")


@pytest.mark.parametrize(
    "bad", ["cpu", "cpu,cpu-cores", ",cpu-cores=1", "cpu,=1", "cpu,numa-node="]
)
def test_a_malformed_flag_gets_tritons_message(bad: str) -> None:
    with pytest.raises(TritonMPError) as info:
        parse_host_policy_option(bad)
    assert info.value.message == (
        f"--host-policy option format is '<policy name>,<setting>=<value>'. Got {bad}"
    )


def test_an_unknown_setting_is_unsupported() -> None:
    with pytest.raises(TritonMPError) as info:
        parse_host_policy_option("cpu,pinned-memory=1")
    assert info.value.code == ErrorCode.UNSUPPORTED
    assert info.value.message == (
        "Unsupported host policy setting 'pinned-memory' is specified, supported settings are "
        "'numa-node', 'cpu-cores'"
    )


def test_a_later_flag_for_the_same_setting_wins() -> None:
    policies = add_host_policy({}, "cpu,cpu-cores=0-1")
    policies = add_host_policy(policies, "cpu,numa-node=0")
    policies = add_host_policy(policies, "cpu,cpu-cores=2-3")
    assert policies == {"cpu": {"cpu-cores": "2-3", "numa-node": "0"}}


@pytest.mark.parametrize(
    ("text", "cores"),
    [
        ("0-3", (0, 1, 2, 3)),
        ("0-3,6", (0, 1, 2, 3, 6)),
        ("6-7,0-1", (0, 1, 6, 7)),
        ("2-2", (2,)),
        ("5", (5,)),
        ("3-1", ()),
    ],
)
def test_cpu_cores_ranges(text: str, cores: tuple[int, ...]) -> None:
    assert parse_cpu_cores(text) == cores


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a-3", "Parsing 'cpu-cores' value: Can't parse 'a' to integer"),
        ("0-b", "Parsing 'cpu-cores' value: Can't parse 'b' to integer"),
        (
            "x",
            "host policy setting 'cpu-cores' format is "
            "'<lower_cpu_core_id>-<upper_cpu_core_id>'. Got x",
        ),
    ],
)
def test_bad_cpu_cores_get_tritons_messages(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_cpu_cores(text)
    assert info.value.message == message


def test_numa_node() -> None:
    assert parse_numa_node("1") == 1
    with pytest.raises(ConfigError, match="Parsing 'numa-node' value: Can't parse 'x'"):
        parse_numa_node("x")


def test_default_policy_names_are_tritons() -> None:
    assert default_policy_name("KIND_CPU", -1) == "cpu"
    assert default_policy_name("KIND_GPU", 3) == "gpu_3"
    assert default_policy_name("KIND_MODEL", -1) == "model"


def _model(text: str) -> RepositoryModel:
    config = text_format.Parse(
        'name: "m" backend: "python" max_batch_size: 0 '
        'input [ { name: "I" data_type: TYPE_FP32 dims: [ 1 ] } ] '
        'output [ { name: "O" data_type: TYPE_FP32 dims: [ 1 ] } ] ' + text,
        pb.ModelConfig(),
    )
    d = Path("/repo/m")
    return RepositoryModel("m", d, config, (ModelVersion(1, d / "1", d / "1/model.py"),), None)


def test_instances_get_their_groups_policy_or_the_default_one() -> None:
    m = _model(
        'instance_group [ { name: "a" kind: KIND_CPU count: 1 host_policy: "fast" }, '
        '{ name: "b" kind: KIND_CPU count: 2 }, '
        '{ name: "c" kind: KIND_CPU count: 1 host_policy: "nowhere" } ]'
    )
    policies = {"fast": {"cpu-cores": "1-1", "numa-node": "0"}, "cpu": {"cpu-cores": "0-1"}}
    _, instances = plan_models([m], host_policies=policies)
    assert [(i.name, i.host_policy, i.cpu_cores, i.numa_node) for i in instances] == [
        ("a_0", "fast", (1,), 0),
        ("b_0", "cpu", (0, 1), -1),
        ("b_1", "cpu", (0, 1), -1),
        ("c_0", "nowhere", (), -1),
    ]


def test_a_policy_that_does_not_parse_fails_the_model() -> None:
    m = _model('instance_group [ { kind: KIND_CPU count: 1 host_policy: "bad" } ]')
    plans, instances = plan_models([m], host_policies={"bad": {"cpu-cores": "z-1"}})
    assert instances == []
    assert plans[0].error == "Parsing 'cpu-cores' value: Can't parse 'z' to integer"


@pytest.mark.parametrize(
    ("priority", "nice"), [("PRIORITY_DEFAULT", 0), ("PRIORITY_MAX", 0), ("PRIORITY_MIN", 19)]
)
def test_priority_is_the_workers_nice_value(priority: str, nice: int) -> None:
    m = _model(
        f"instance_group [ {{ kind: KIND_CPU count: 1 }} ] optimization {{ priority: {priority} }}"
    )
    _, instances = plan_models([m])
    assert [i.nice for i in instances] == [nice]
