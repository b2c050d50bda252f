"""Step 3 of a model change for one model: its plan decided, its effects recorded.

Imported by ``supervisor.models.model_control``, which calls ``apply_plan`` for each staged model of
a change once its new instances came up (or failed to), then commits every model's
``Effects`` at once (activate, roll back, retire, stop). ``apply_plan`` asks the pure planner
(``supervisor.models.model_changes.plan_change``) what the model's versions become, updates the
model's record (``supervisor.models.served_models.ServedModel``: versions, failures, config,
temporary
directory) and answers the load (``LoadRequest.result``); it sends nothing and starts or stops
no process.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from triton_mp.ipc.protocol.specs import ModelVersionSpec
from triton_mp.model_config.plan import ModelPlan
from triton_mp.supervisor.models.load_requests import (
    LoadRequest,
    Staged,
    load_failure,
    remove_temp_dir,
)
from triton_mp.supervisor.models.model_changes import ChangePlan, Outcome, plan_change
from triton_mp.supervisor.models.served_models import ServedModel, ServedVersion
from triton_mp.supervisor.processes.children import Child

log = logging.getLogger(__name__)


@dataclass
class Effects:
    """What a change does once every model's plan is decided (step 3), all at once."""

    activate: list[ModelVersionSpec] = field(default_factory=list)
    to_stop: list[Child] = field(default_factory=list)
    """Old instances of reloaded versions (the scheduler stops them once activated)."""
    rollback: list[Child] = field(default_factory=list)
    retire: list[Child] = field(default_factory=list)
    regroup: list[ModelVersionSpec] = field(default_factory=list)
    """Versions updated in place (``InstancesRegrouped``): their new instance lists."""
    leaving: list[Child] = field(default_factory=list)
    """Instances a regroup removed (the scheduler stops each once its sequences end)."""
    changed: list[ServedModel] = field(default_factory=list)
    unloading: list[tuple[ServedModel, int]] = field(default_factory=list)
    """Versions retired by this change: UNLOADING until their workers exit."""


def apply_plan(
    model: ServedModel,
    s: Staged,
    plan: ModelPlan,
    children: dict[int, Child],
    errors: dict[str, str],
    effects: Effects,
    kept: Mapping[int, Child] | None = None,
) -> None:
    """Step 3 for one model: decide its change and record it in ``effects``. ``children``:
    the instances the change started; ``kept``: the running ones regrouped versions keep
    (``supervisor.models.regroups``), by instance id."""
    req = s.req
    if plan.error:
        _fail_whole(model, req, s.temp_dir)
        effects.changed.append(model)
        return
    kept = kept or {}
    kids = {
        v.version: [children[i] if i in children else kept[i] for i in v.instance_ids]
        for v in plan.versions
    }
    start_errors = {}
    for version, vkids in kids.items():
        err = next((errors[c.name] for c in vkids if c.name in errors), None)
        if err is not None:
            start_errors[version] = err
    cp = plan_change(model.served(), s.fingerprints, set(kids), start_errors, s.regrouped)
    # NOTE: a version this load tried replaces one still draining in the index (2.51's
    # lifecycle swaps in the new model info and keeps the old one in the background).
    model.unloading -= set(kids) | set(cp.failed)
    effects.rollback.extend(
        c for v in sorted(cp.discard) for c in kids[v] if c.instance_id in children
    )
    if cp.outcome is Outcome.FAILED_RELOAD:
        model.failed, model.failed_fingerprints = dict(cp.failed), dict(cp.failed_fingerprints)
        _log_failures(model, start_errors)
        req.result = load_failure(req.name, dict(cp.answer_failures))
        remove_temp_dir(s.temp_dir)
        effects.changed.append(model)
    elif cp.outcome is Outcome.UNCHANGED:
        # NOTE: nothing changed on disk or in the config: nothing to do.
        model.failed = dict(cp.failed)
        if cp.answer_failures:
            req.result = load_failure(req.name, dict(cp.answer_failures))
        remove_temp_dir(s.temp_dir)
        if model.unloaded or model.reason:
            model.unloaded, model.reason = False, ""
            effects.changed.append(model)
    else:
        _apply_changed(model, s, plan, cp, kids, start_errors, effects)


def _apply_changed(
    model: ServedModel,
    s: Staged,
    plan: ModelPlan,
    cp: ChangePlan,
    kids: dict[int, list[Child]],
    start_errors: dict[int, str],
    effects: Effects,
) -> None:
    """Versions start and stop serving: the ``Outcome.CHANGED`` branch of ``apply_plan``."""
    req = s.req
    new = {
        v.version: ServedVersion(
            v, kids[v.version], s.fingerprints[v.version], s.files.get(v.version, "")
        )
        for v in plan.versions
        if v.version in cp.activate or v.version in cp.regroup
    }
    effects.activate.extend(x.spec for v, x in new.items() if v in cp.activate)
    for v in sorted(cp.regroup):
        # NOTE: the version's instances go on reading its config at its last full load.
        new[v].backend_config = model.versions[v].worker_config()
        spec = new[v].spec
        effects.regroup.append(spec)
        stay = set(spec.instance_ids)
        effects.leaving.extend(c for c in model.versions[v].children if c.instance_id not in stay)
    for v, old in list(model.versions.items()):
        if v in cp.retire:
            effects.retire.extend(old.children)
            model.retired.add(v)
            model.unloading.add(v)
            effects.unloading.append((model, v))
        elif v in cp.replace:
            effects.to_stop.extend(old.children)
        if v in cp.retire or v in cp.replace:
            del model.versions[v]
    model.versions.update(new)
    assert s.rm.config is not None
    model.config, model.labels = s.rm.config.SerializeToString(), s.rm.labels
    model.failed, model.failed_fingerprints = dict(cp.failed), dict(cp.failed_fingerprints)
    _log_failures(model, start_errors)
    model.unloaded = False
    if cp.answer_failures:
        req.result = load_failure(req.name, dict(cp.answer_failures))
    model.reason = "" if model.versions else (req.result.message if req.result else "")
    if model.temp_dir is not None and model.temp_dir != s.temp_dir:
        if cp.regroup:
            model.older_dirs.append(model.temp_dir)  # NOTE: kept instances read there
        else:
            remove_temp_dirs(model)
    model.temp_dir, model.directory = s.temp_dir, s.rm.directory
    effects.changed.append(model)
    if model.versions:
        log.info(
            "model '%s' ready: versions %s",
            model.name,
            sorted(model.versions),
            extra={"model": model.name},
        )
    else:
        log.warning("model '%s' has no ready version", model.name, extra={"model": model.name})


def remove_temp_dirs(model: ServedModel) -> None:
    """Remove the model's temporary directories (``temp_dir``, ``older_dirs``)."""
    for d in (model.temp_dir, *model.older_dirs):
        remove_temp_dir(d)
    model.temp_dir, model.older_dirs = None, []


def _log_failures(model: ServedModel, failed: dict[int, str]) -> None:
    for v, reason in failed.items():
        log.error(
            "failed to load model '%s' version %d: %s",
            model.name,
            v,
            reason,
            extra={"model": model.name},
        )


def _fail_whole(model: ServedModel, req: LoadRequest, temp_dir: Path | None) -> None:
    assert req.result is not None
    remove_temp_dir(temp_dir)
    if not model.versions:
        model.reason = req.result.message
        model.unloaded = False
    log.error("failed to load model '%s': %s", model.name, req.result.message)
