"""Step 3 of a model change for one model (``supervisor.models.change_effects.apply_plan``): what
the model's record becomes, how the load is answered and which instances the commit
activates, rolls back, retires or stops. No process, no shared memory: children are records.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from triton_mp._proto import model_config_pb2 as mc
from triton_mp.common.errors import ErrorCode
from triton_mp.ipc.protocol.messages import ErrorInfo
from triton_mp.ipc.protocol.specs import BatchingSpec, ModelVersionSpec
from triton_mp.model_config.loader import RepositoryModel
from triton_mp.model_config.plan import ModelPlan
from triton_mp.supervisor.models.change_effects import Effects, apply_plan
from triton_mp.supervisor.models.load_requests import LoadRequest, Staged
from triton_mp.supervisor.models.served_models import ServedModel, ServedVersion
from triton_mp.supervisor.processes.children import Child


def _spec(version: int, *instance_ids: int) -> ModelVersionSpec:
    return ModelVersionSpec(
        model="m",
        version=version,
        backend="python",
        model_file="model.py",
        max_batch_size=0,
        batching=BatchingSpec(max_batch_size=0),
        inputs=(),
        outputs=(),
        instance_ids=instance_ids,
    )


def _child(instance_id: int) -> Child:
    return Child("worker", f"m_{instance_id}", b"", instance_id=instance_id)


def _staged(tmp_path: Path, fingerprints: dict[int, str]) -> Staged:
    temp_dir = tmp_path / "load"
    temp_dir.mkdir(parents=True)
    rm = RepositoryModel("m", tmp_path / "m", mc.ModelConfig(name="m"), (), None)
    return Staged(LoadRequest("m"), rm, temp_dir, fingerprints)


def _served(version: int, child: Child, fingerprint: str) -> ServedModel:
    model = ServedModel("m", config=b"old")
    model.versions[version] = ServedVersion(_spec(version, child.instance_id), [child], fingerprint)
    return model


def test_a_first_load_whose_instances_came_up_serves_them(tmp_path: Path) -> None:
    model, s, fx = ServedModel("m"), _staged(tmp_path, {1: "a"}), Effects()
    kid = _child(0)
    apply_plan(model, s, ModelPlan(s.rm, versions=[_spec(1, 0)]), {0: kid}, {}, fx)
    assert s.req.result is None
    assert sorted(model.versions) == [1]
    assert model.versions[1].children == [kid]
    assert model.config == mc.ModelConfig(name="m").SerializeToString()
    assert model.temp_dir == s.temp_dir
    assert s.temp_dir is not None
    assert s.temp_dir.is_dir()
    assert [v.version for v in fx.activate] == [1]
    assert fx.changed == [model]
    assert not (fx.rollback)
    assert not (fx.retire)
    assert not (fx.to_stop)


def test_a_reload_whose_instance_failed_keeps_the_old_one_and_fails_the_load(
    tmp_path: Path,
) -> None:
    old, new = _child(0), _child(1)
    model, s, fx = _served(1, old, "a"), _staged(tmp_path, {1: "b"}), Effects()
    errors = {new.name: "initialize raised"}
    apply_plan(model, s, ModelPlan(s.rm, versions=[_spec(1, 1)]), {1: new}, errors, fx)
    assert model.versions[1].children == [old]
    assert model.config == b"old"
    assert s.req.result is not None
    assert s.req.result.code is ErrorCode.INVALID_ARG
    assert s.req.result.message == (
        "load failed for model 'm': version 1 is at UNAVAILABLE state: initialize raised;\n"
    )
    assert fx.rollback == [new]
    assert not (fx.activate)
    assert not (fx.retire)
    assert not (fx.to_stop)
    assert s.temp_dir is not None
    assert not s.temp_dir.exists()


def test_a_reload_that_drops_a_version_retires_it_and_replaces_a_changed_one(
    tmp_path: Path,
) -> None:
    v1, v2 = _child(0), _child(1)
    model = _served(1, v1, "a")
    model.versions[2] = ServedVersion(_spec(2, 1), [v2], "b")
    s, fx, new = _staged(tmp_path, {2: "B"}), Effects(), _child(2)
    apply_plan(model, s, ModelPlan(s.rm, versions=[_spec(2, 2)]), {2: new}, {}, fx)
    assert sorted(model.versions) == [2]
    assert model.versions[2].children == [new]
    assert fx.retire == [v1]
    assert 1 in model.retired
    assert 1 in model.unloading
    assert fx.unloading == [(model, 1)]
    assert fx.to_stop == [v2]
    assert [v.version for v in fx.activate] == [2]
    assert s.req.result is None
    assert model.entry().unloading_versions == (1,)


def test_a_version_served_again_while_its_old_workers_drain_is_not_unloading(
    tmp_path: Path,
) -> None:
    """The commit answers before retired workers exit (they drain in the background): a
    later load that serves the version again takes it out of ``unloading`` at once."""
    model = _served(2, _child(1), "b")
    model.retired.add(1)
    model.unloading.add(1)
    s, fx, new = _staged(tmp_path, {1: "a", 2: "b"}), Effects(), _child(3)
    plan = ModelPlan(s.rm, versions=[_spec(1, 3), _spec(2, 1)])
    apply_plan(model, s, plan, {3: new}, {}, fx, kept={1: model.versions[2].children[0]})
    assert sorted(model.versions) == [1, 2]
    assert not model.unloading
    assert model.entry().unloading_versions == ()
    assert model.entry().ready_versions == (1, 2)
    assert not fx.unloading


def test_an_unloaded_model_whose_versions_drain_stays_listed_until_they_drained() -> None:
    """An unload answers before its workers exit: until then the frontends keep the model,
    with no ready version and its versions UNLOADING (2.51's lifecycle state), then it is
    an unloaded model whose versions are UNAVAILABLE "unloaded"."""
    model = ServedModel("m", retired={1}, unloading={1}, reason="unloaded", unloaded=True)
    draining = model.entry()
    assert not draining.unloaded
    assert draining.ready_versions == ()
    assert draining.unloading_versions == (1,)
    assert draining.retired_versions == ()
    model.unloading.discard(1)
    gone = model.entry()
    assert gone.unloaded
    assert gone.retired_versions == (1,)
    assert gone.reason == "unloaded"


def test_a_version_whose_load_fails_while_it_drains_shows_the_failure(tmp_path: Path) -> None:
    """A load of an unloaded version that is still draining replaces its UNLOADING row with
    what the load did (2.51 swaps in the new model info), here a failed start."""
    model = ServedModel("m", retired={1}, unloading={1}, reason="unloaded", unloaded=True)
    s, fx, new = _staged(tmp_path, {1: "a"}), Effects(), _child(3)
    plan = ModelPlan(s.rm, versions=[_spec(1, 3)])
    apply_plan(model, s, plan, {3: new}, {new.name: "boom"}, fx)
    assert s.req.result is not None
    assert not model.unloading
    assert model.entry().unloading_versions == ()
    assert 1 in model.failed


def test_an_unusable_model_fails_whole_and_says_why_when_nothing_serves(tmp_path: Path) -> None:
    model, s, fx = ServedModel("m"), _staged(tmp_path, {1: "a"}), Effects()
    s.req.result = ErrorInfo(ErrorCode.INVALID_ARG, "no instance group")
    apply_plan(model, s, ModelPlan(s.rm, error="no instance group"), {}, {}, fx)
    assert model.reason == "no instance group"
    assert not model.versions
    assert fx.changed == [model]
    assert not fx.activate
    assert s.temp_dir is not None
    assert not s.temp_dir.exists()


def _configured(version: int, config_json: str, *instance_ids: int) -> ModelVersionSpec:
    return msgspec.structs.replace(_spec(version, *instance_ids), config_json=config_json)


def test_a_version_updated_in_place_keeps_the_config_its_instances_read(tmp_path: Path) -> None:
    """2.51 makes no new backend ModelState for an in-place change (core
    ``UpdateInstanceGroup``): every instance reads the config of the version's last full
    load (count 1 here) through any number of regroups, while the spec the scheduler and
    the frontends get is the new config; a full reload reads its own config again."""
    kept, added = _child(0), _child(1)
    model = ServedModel("m", config=b"old")
    model.versions[1] = ServedVersion(_configured(1, '{"count": 1}', 0), [kept], "a")
    assert model.versions[1].worker_config() == '{"count": 1}'
    steps = [('{"count": 3}', (0, 1), "b"), ('{"count": 2}', (1,), "c")]
    for n, (config, ids, fingerprint) in enumerate(steps):
        s, fx = _staged(tmp_path / str(n), {1: fingerprint}), Effects()
        s.regrouped.add(1)
        plan = ModelPlan(s.rm, versions=[_configured(1, config, *ids)])
        apply_plan(model, s, plan, {1: added}, {}, fx, {0: kept})
        assert [v.config_json for v in fx.regroup] == [config]
        assert model.versions[1].spec.config_json == config
        assert model.versions[1].worker_config() == '{"count": 1}'
    s, fx, fresh = _staged(tmp_path / "full", {1: "d"}), Effects(), _child(2)
    plan = ModelPlan(s.rm, versions=[_configured(1, '{"count": 4}', 2)])
    apply_plan(model, s, plan, {2: fresh}, {}, fx)
    assert [v.config_json for v in fx.activate] == ['{"count": 4}']
    assert model.versions[1].worker_config() == '{"count": 4}'
