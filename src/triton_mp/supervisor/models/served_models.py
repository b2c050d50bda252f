"""What the supervisor knows of each model it serves: versions, their workers, failures.

Imported by ``supervisor.models.model_control``, which owns the records and changes them one change
at a time (``supervisor.models.change_effects`` for step 3). ``ServedModel.entry`` is the frontends'
view of a model (``ModelEntry``, what RepositoryIndex, ModelReady and ModelMetadata answer
from); ``ServedModel.served`` is the planner's (``supervisor.models.model_changes.Served``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from triton_mp._proto import model_config_pb2 as mc
from triton_mp.ipc.protocol.control_messages import ModelEntry
from triton_mp.ipc.protocol.specs import ModelVersionSpec
from triton_mp.supervisor.models.model_changes import Served
from triton_mp.supervisor.processes.children import Child


@dataclass
class ServedVersion:
    """One served model version and its worker processes."""

    spec: ModelVersionSpec
    children: list[Child]
    fingerprint: str
    files: str = ""
    """Its files' ``load_requests.files_fingerprint`` when it was loaded (``regroups``)."""
    reason: str = ""
    """Why an update of this version in place failed (2.51 keeps it READY with that reason
    in RepositoryIndex until the version is loaded anew)."""
    backend_config: str = ""
    """The config its instances' backends read (``args['model_config']``, Triton's JSON form)
    when it is not ``spec.config_json``: the version's config at its last full load, which an
    in-place change (``supervisor.models.regroups``) keeps, as 2.51 does (the backend's
    ModelState parses the config once, at ``TRITONBACKEND_ModelInitialize``, and core's
    ``UpdateInstanceGroup`` makes no new one); "" when they read ``spec.config_json``."""

    def worker_config(self) -> str:
        """The config its instances read: ``backend_config``, else ``spec.config_json``."""
        return self.backend_config or self.spec.config_json


@dataclass
class ServedModel:
    """A model the server knows: served versions, failures, where it was loaded from."""

    name: str
    config: bytes = b""
    """The effective config of the served versions (serialized ``ModelConfig``)."""
    labels: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Output name -> classification labels of the served config (``label_filename``)."""
    versions: dict[int, ServedVersion] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)
    """Versions that failed to load -> why."""
    failed_fingerprints: dict[int, str] = field(default_factory=dict)
    retired: set[int] = field(default_factory=set)
    """Versions once served that a change stopped serving (version policy)."""
    unloading: set[int] = field(default_factory=set)
    """Retired versions whose workers still drain their requests (UNLOADING). An unloaded
    model with such versions is still in the frontends' table, with no ready version (as
    2.51's lifecycle keeps an unloading model until its last request is done): requests
    to it get the unloaded model's answers, and it leaves the table once they drained."""
    reason: str = ""
    """Why the model (as a whole) is unavailable."""
    unloaded: bool = False
    temp_dir: Path | None = None
    """Where ``file:`` contents of the load that is served were written."""
    older_dirs: list[Path] = field(default_factory=list)
    """Temporary directories of earlier loads whose instances a regroup kept (a restart
    of one reads its files there): removed with ``temp_dir`` at an unload or replace."""
    directory: Path | None = None
    """The model directory the served versions were read from (``regroups.in_place``)."""
    by_name: bool = False
    """Loaded by name (RepositoryModelLoad, ``--load-model``, a polled repository) since its
    last unload, not only as an ensemble's composing model: an unload of the ensemble with
    ``unload_dependents`` keeps it (core's ``explicitly_load_``)."""
    override: tuple[str, str] | None = None
    """``(config JSON, model directory fingerprint)`` of the ``config`` override the served
    versions were loaded with (RepositoryModelLoad's ``config`` parameter), else None."""

    def served(self) -> Served:
        """The planner's view of this model."""
        return Served(
            {v: x.fingerprint for v, x in self.versions.items()},
            dict(self.failed),
            dict(self.failed_fingerprints),
        )

    def entry(self) -> ModelEntry:
        """The frontends' view of this model."""
        retired = tuple(
            sorted(self.retired - set(self.versions) - set(self.failed) - self.unloading)
        )
        if self.unloaded and not self.unloading:
            return ModelEntry(
                name=self.name, config=b"", ready_versions=(), reason=self.reason,
                unloaded=True, retired_versions=retired,
                failed_versions=tuple(sorted(self.failed)), version_reasons=dict(self.failed),
            )  # fmt: skip
        reason = self.reason or "; ".join(
            f"version {v}: {r}" for v, r in sorted(self.failed.items())
        )
        return ModelEntry(
            name=self.name, config=self.config, ready_versions=tuple(sorted(self.versions)),
            failed_versions=tuple(sorted(v for v in self.failed if v not in self.versions)),
            reason=reason, version_reasons=dict(self.failed),
            retired_versions=retired, unloading_versions=tuple(sorted(self.unloading)),
            ready_reasons={v: x.reason for v, x in self.versions.items() if x.reason},
            labels=self.labels,
            readiness_hook=any(
                v.spec.capabilities.readiness_hook for v in self.versions.values()
            ),
        )  # fmt: skip


def served_configs(models: Iterable[ServedModel]) -> dict[str, mc.ModelConfig]:
    """Model name -> the effective config of its served versions, for the models that serve."""
    return {m.name: mc.ModelConfig.FromString(m.config) for m in models if m.versions and m.config}
