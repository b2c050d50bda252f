"""An instance_group-only reload, done in place: whether a served version gets one, and
which of its instances stay, start or go.

Imported by ``supervisor.models.model_control`` (step 1 of a change) and tested in
tests/unit/test_regroups.py. Core ``ModelLifeCycle::AsyncLoad`` updates a served version in
place when its files are unmodified and its config differs at most in ``instance_group`` and
``version_policy`` (``ConfigChangeRequiresReload`` false): ``TritonModel::UpdateInstanceGroup``
then keeps every instance whose group entry, less ``name`` and ``count``, is equal to one of
the new config's (``EquivalentInInstanceConfig``), on the same device; for each instance the
new config asks for it takes the *last* matching old one (``PrepareInstances`` pops
``existing.back()``), creates the rest and removes the old ones left. Kept instances keep
their processes, names and state (live sequences); a removed instance's live sequences run
to their end first (``scheduler.lifecycle``, ``InstancesRegrouped``). Every instance of the
version, kept, added or restarted after a death, reads in ``args['model_config']`` the config
the version was last fully loaded with (2.51's backend ModelState is not made anew), while
the scheduler, the frontends and ModelConfig serve the new one.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence, Set
from dataclasses import dataclass
from pathlib import Path

import msgspec

from triton_mp._proto import model_config_pb2 as mc
from triton_mp.ipc.protocol.specs import ModelVersionSpec
from triton_mp.model_config.loader import CONFIG_FILENAME
from triton_mp.model_config.plan import ModelPlan
from triton_mp.supervisor.models.load_requests import Staged, files_fingerprint, updated_in_place
from triton_mp.supervisor.models.served_models import ServedModel
from triton_mp.supervisor.processes.children import Child

log = logging.getLogger(__name__)

Signature = tuple[bytes, int]
"""An instance's group entry less ``name`` and ``count`` (serialized ``ModelInstanceGroup``,
deterministic) and its device id (-1 off GPU)."""


def signatures(config: mc.ModelConfig) -> list[Signature]:
    """One signature per instance the config asks for, in ``plan.instance_names`` order
    (per group, ``count`` times, each time once per listed GPU)."""
    out: list[Signature] = []
    if config.HasField("ensemble_scheduling"):
        return out
    for group in config.instance_group:
        entry = mc.ModelInstanceGroup()
        entry.CopyFrom(group)
        entry.ClearField("name")
        entry.ClearField("count")
        key = entry.SerializeToString(deterministic=True)
        gpus = list(group.gpus) if group.kind == mc.ModelInstanceGroup.KIND_GPU else [-1]
        out.extend((key, int(gpu)) for _ in range(group.count) for gpu in gpus)
    return out


@dataclass(frozen=True)
class Regroup:
    """How one version's old instances map onto its new ones (indices in signature order)."""

    kept: tuple[tuple[int, int], ...]
    """(new index, old index) of each instance that stays."""
    added: tuple[int, ...]
    """New indices of the instances to start."""
    removed: tuple[int, ...]
    """Old indices of the instances to stop, ascending."""


def match(old: Sequence[Signature], new: Sequence[Signature]) -> Regroup:
    """Match old instances to new ones as ``PrepareInstances`` does: each new instance, in
    order, takes the last unmatched old one of its signature, if any."""
    pools: dict[Signature, list[int]] = {}
    for i, sig in enumerate(old):
        pools.setdefault(sig, []).append(i)
    kept: list[tuple[int, int]] = []
    added: list[int] = []
    for j, sig in enumerate(new):
        pool = pools.get(sig)
        if pool:
            kept.append((j, pool.pop()))
        else:
            added.append(j)
    removed = sorted(i for pool in pools.values() for i in pool)
    return Regroup(tuple(kept), tuple(added), tuple(removed))


def content_digest(model_dir: Path, version: int) -> str:
    """A digest of what a version's instances read: its version directory and the model
    directory's other files (not ``config.pbtxt``, not other versions), by relative path and
    content. Unlike ``loader.directory_fingerprint`` it ignores mtimes, so the same files
    written again (a ``file:`` override's temporary directory) digest the same."""
    digest = hashlib.sha256()
    others = {p.name for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()}
    skip = {CONFIG_FILENAME, *others} - {str(version)}
    for path in sorted(model_dir.rglob("*")):
        rel = path.relative_to(model_dir)
        if rel.parts[0] in skip or any(p.startswith(".") or p == "__pycache__" for p in rel.parts):
            continue
        if path.is_file():
            digest.update(f"{rel}\0".encode())
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def in_place(
    served: bytes,
    config: mc.ModelConfig,
    old_dir: Path,
    new_dir: Path,
    version: int,
    served_files: str,
) -> bool:
    """Whether the served ``version`` (its effective config ``served``, serialized, read
    from ``old_dir`` when its ``files_fingerprint`` was ``served_files``) is updated in place
    to ``config`` read from ``new_dir``: not an ensemble, the configs differ at most in
    ``instance_group`` and ``version_policy``, and the version's files are the same: those in
    ``old_dir`` untouched since (by path, size and mtime, as core's modification check), and
    those in ``new_dir`` either the same directory or of the same content."""
    if config.HasField("ensemble_scheduling") or not served:
        return False
    if not updated_in_place(served, config):
        return False
    try:
        if files_fingerprint(old_dir, version) != served_files:
            return False
        if old_dir == new_dir:
            return True
        return content_digest(old_dir, version) == content_digest(new_dir, version)
    except OSError:
        return False


def regroup_plan(
    plan: ModelPlan,
    version: int,
    old_ids: Sequence[int],
    old_names: Sequence[str],
    rg: Regroup,
    worker_config: str,
) -> ModelVersionSpec:
    """Rewrite ``plan`` (the new config's whole instance group of ``version``, new ids) so
    that only the added instances start: the version's spec lists the kept instances by
    their old ids and names, in the new order. Returns that spec, which keeps the new
    config (the scheduler's, the frontends'); the added instances read ``worker_config``
    (``ModelPlan.worker_configs``), the config the version was last fully loaded with, as
    2.51's do: python_backend's ``StubLauncher::Initialize`` hands every stub, added or
    restarted, the ModelState's config, parsed once at ``TRITONBACKEND_ModelInitialize``."""
    spec = next(v for v in plan.versions if v.version == version)
    planned = [w for w in plan.instances if w.version == version]
    ids, names = list(spec.instance_ids), list(spec.instance_names)
    for j, i in rg.kept:
        ids[j], names[j] = old_ids[i], old_names[i]
    started = {planned[j].instance_id for j in rg.added}
    plan.instances = [w for w in plan.instances if w.version != version or w.instance_id in started]
    new = msgspec.structs.replace(spec, instance_ids=tuple(ids), instance_names=tuple(names))
    plan.versions = [new if v.version == version else v for v in plan.versions]
    plan.worker_configs[version] = worker_config
    return new


def find_regroups(model: ServedModel, s: Staged, start: Set[int]) -> None:
    """Add to ``s.regrouped`` the versions of ``start`` (``versions_to_start``) that the
    load updates in place (``in_place``)."""
    assert s.rm.config is not None
    for v in sorted(start):
        if v not in model.versions or model.directory is None:
            continue
        files = model.versions[v].files
        if in_place(model.config, s.rm.config, model.directory, s.rm.directory, v, files):
            s.regrouped.add(v)


def plan_regroups(model: ServedModel, s: Staged, plan: ModelPlan) -> dict[int, Child]:
    """Plan only the added instances of each version of ``s.regrouped`` (``match``,
    ``regroup_plan``); returns the running instances they keep, by instance id."""
    assert s.rm.config is not None
    old_config = mc.ModelConfig.FromString(model.config)
    kept: dict[int, Child] = {}
    for v in sorted(s.regrouped):
        old = model.versions[v]
        names = [*old.spec.instance_names, *[""] * len(old.spec.instance_ids)]
        rg = match(signatures(old_config), signatures(s.rm.config))
        spec = regroup_plan(plan, v, old.spec.instance_ids, names, rg, old.worker_config())
        stay = set(spec.instance_ids)
        kept.update((c.instance_id, c) for c in old.children if c.instance_id in stay)
        log.info(
            "model '%s' version %d: instance group updated in place (%d kept, %d added, "
            "%d removed)",
            s.req.name,
            v,
            len(rg.kept),
            len(rg.added),
            len(rg.removed),
            extra={"model": s.req.name},
        )
    return kept
