"""An instance_group-only reload done in place (``supervisor.models.regroups``): which
served versions get one, and how old instances match new ones (core
``TritonModel::PrepareInstances`` / ``EquivalentInInstanceConfig``). No process."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
from google.protobuf import json_format

from tests.unit.scheduler_harness import model_spec
from triton_mp._proto import model_config_pb2 as mc
from triton_mp.ipc.protocol.specs import InstanceSpec
from triton_mp.model_config.plan import ModelPlan
from triton_mp.supervisor.models.load_requests import files_fingerprint
from triton_mp.supervisor.models.regroups import (
    Regroup,
    content_digest,
    in_place,
    match,
    regroup_plan,
    signatures,
)


def _config(*groups: dict, **extra: object) -> mc.ModelConfig:
    return json_format.ParseDict(
        {"name": "m", "backend": "python", "max_batch_size": 4, "instance_group": list(groups),
         **extra},
        mc.ModelConfig(),
    )  # fmt: skip


CPU = {"name": "m", "kind": "KIND_CPU"}


def test_a_count_up_keeps_the_instance_and_adds_the_rest() -> None:
    old = signatures(_config({**CPU, "count": 1}))
    new = signatures(_config({**CPU, "count": 3}))
    assert match(old, new) == Regroup(kept=((0, 0),), added=(1, 2), removed=())


def test_a_count_down_keeps_the_last_instances_as_core_pops_existing_back() -> None:
    old = signatures(_config({**CPU, "count": 3}))
    new = signatures(_config({**CPU, "count": 1}))
    assert match(old, new) == Regroup(kept=((0, 2),), added=(), removed=(0, 1))


def test_the_group_name_does_not_count_but_its_other_fields_do() -> None:
    old = signatures(_config({**CPU, "count": 2}))
    renamed = signatures(_config({**CPU, "name": "other", "count": 2}))
    assert match(old, renamed).added == ()
    policy = signatures(_config({**CPU, "count": 2, "host_policy": "p"}))
    assert match(old, policy) == Regroup(kept=(), added=(0, 1), removed=(0, 1))


def test_a_gpu_instance_matches_only_on_its_device() -> None:
    gpu = {"name": "m", "kind": "KIND_GPU", "count": 1}
    old = signatures(_config({**gpu, "gpus": [0, 1]}))
    new = signatures(_config({**gpu, "gpus": [0, 1]}, {**CPU, "count": 1}))
    assert match(old, new) == Regroup(kept=((0, 0), (1, 1)), added=(2,), removed=())
    assert match(old, signatures(_config({**gpu, "gpus": [1]}))).kept == ()  # gpus differ


def _model_dir(root: Path, source: str = "x = 1\n") -> Path:
    (root / "1").mkdir(parents=True)
    (root / "1" / "model.py").write_text(source)
    (root / "config.pbtxt").write_text("# any\n")
    return root


def test_the_same_files_written_again_digest_the_same(tmp_path: Path) -> None:
    a = _model_dir(tmp_path / "a")
    b = _model_dir(tmp_path / "b")
    os.utime(b / "1" / "model.py", (1, 1))
    assert content_digest(a, 1) == content_digest(b, 1)
    (b / "1" / "model.py").write_text("x = 2\n")
    assert content_digest(a, 1) != content_digest(b, 1)
    (a / "2").mkdir()
    (a / "2" / "model.py").write_text("other version\n")
    (a / "config.pbtxt").write_text("# changed\n")
    assert content_digest(a, 1) == content_digest(_model_dir(tmp_path / "c"), 1)


def test_only_an_instance_group_change_with_the_same_files_is_in_place(tmp_path: Path) -> None:
    old_dir, new_dir = _model_dir(tmp_path / "a"), _model_dir(tmp_path / "b")
    served = _config({**CPU, "count": 1}).SerializeToString()
    files = files_fingerprint(old_dir, 1)
    two = _config({**CPU, "count": 2})
    assert in_place(served, two, old_dir, new_dir, 1, files)  # same content elsewhere
    assert in_place(served, two, old_dir, old_dir, 1, files)  # the same directory
    other = _config({**CPU, "count": 2}, parameters={"p": {"string_value": "x"}})
    assert not in_place(served, other, old_dir, new_dir, 1, files)
    assert not in_place(b"", two, old_dir, old_dir, 1, files)
    (new_dir / "1" / "model.py").write_text("x = 2\n")
    assert not in_place(served, two, old_dir, new_dir, 1, files)


def test_files_changed_since_the_version_was_served_are_a_reload(tmp_path: Path) -> None:
    """The served directory is compared with what it was at the load (path, size, mtime):
    its files changed in place are new files, even when a directory elsewhere has them."""
    old_dir, new_dir = _model_dir(tmp_path / "a"), _model_dir(tmp_path / "b", "x = 2\n")
    served = _config({**CPU, "count": 1}).SerializeToString()
    files = files_fingerprint(old_dir, 1)
    (old_dir / "1" / "model.py").write_text("x = 2\n")
    two = _config({**CPU, "count": 2})
    assert not in_place(served, two, old_dir, old_dir, 1, files)
    assert not in_place(served, two, old_dir, new_dir, 1, files)


def test_a_regroup_plan_starts_only_the_added_instances() -> None:
    """1 -> 3 with old instance 7 (``m_0``) kept: the plan starts two; the spec lists 7 and
    keeps the new config, while the started instances read the version's first one (2.51:
    ``StubLauncher`` hands every stub the ModelState's config, parsed once)."""
    spec = msgspec.structs.replace(
        model_spec("m", (50, 51, 52)),
        instance_names=("m_0", "m_1", "m_2"),
        config_json='{"count": 3}',
    )
    other = model_spec("m", (53,))
    other = msgspec.structs.replace(other, version=2)
    planned = [InstanceSpec(instance_id=i, name=f"m_{i - 50}", model="m", version=1)
               for i in (50, 51, 52)]  # fmt: skip
    v2 = InstanceSpec(instance_id=53, name="m_0", model="m", version=2)
    plan = ModelPlan(repo=None, versions=[spec, other], instances=[*planned, v2])  # type: ignore[arg-type]
    rg = match(signatures(_config({**CPU, "count": 1})), signatures(_config({**CPU, "count": 3})))
    new = regroup_plan(plan, 1, (7,), ("m_0",), rg, '{"count": 1}')
    assert new.instance_ids == (7, 51, 52)
    assert new.instance_names == ("m_0", "m_1", "m_2")
    assert new.config_json == '{"count": 3}'
    assert [w.instance_id for w in plan.instances] == [51, 52, 53]
    assert plan.versions == [new, other]
    assert plan.worker_model(new) == msgspec.structs.replace(new, config_json='{"count": 1}')
    assert plan.worker_model(other) is other
