"""The frontend's table of models: effective configs, versions and states.

Imported by the frontend only. Built from ``FrontendSpec.models`` and changed by the
supervisor's ``ModelTableUpdate`` messages (a model's entry is replaced in one step, between
two requests of the event loop); answers name/version resolution with Triton's messages
(core ``model_repository_manager.cc``, triton.md §4.9).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from triton_mp._proto import model_config_pb2 as mc
from triton_mp.common.datatypes import DataType
from triton_mp.common.errors import InvalidRequest, ModelNotFound, ModelUnavailable
from triton_mp.ipc.protocol.specs import ModelEntry


@dataclass(frozen=True, slots=True)
class IOSpec:
    """One input or output of a model as the frontend validates it."""

    name: str
    datatype: str
    dims: tuple[int, ...]
    optional: bool


@dataclass(frozen=True)
class Model:
    """One model in the repository, as the frontend knows it."""

    name: str
    config: mc.ModelConfig
    ready_versions: tuple[int, ...]
    failed_versions: tuple[int, ...]
    reason: str
    inputs: dict[str, IOSpec]
    outputs: dict[str, IOSpec]
    transition: str = ""
    """``LOADING`` while the supervisor loads the model (it serves no version yet)."""
    version_reasons: dict[int, str] | None = None
    """Why each failed version failed (``reason`` when absent)."""
    ready_reasons: dict[int, str] | None = None
    """Why an update in place of a ready version failed (its READY row's reason)."""
    decoupled: bool = False
    """``model_transaction_policy.decoupled``: zero or more responses per request."""
    retired_versions: tuple[int, ...] = ()
    """Versions a change stopped serving: UNAVAILABLE "unloaded", as Triton keeps them."""
    unloading_versions: tuple[int, ...] = ()
    """Versions a change stopped serving that still drain their requests: UNLOADING."""
    labels: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Output name -> its classification labels (``label_filename``)."""
    preserve_ordering: bool = False
    """Responses leave in request order (``dynamic_batching.preserve_ordering``, or the
    sequence batcher's ``oldest.preserve_ordering``)."""
    readiness_hook: bool = False
    """Its backend's models may define ``is_ready()``: readiness checks ask the instances."""

    def version_reason(self, version: int) -> str:
        """Why ``version`` is UNAVAILABLE."""
        return (self.version_reasons or {}).get(version, self.reason)

    @property
    def max_batch_size(self) -> int:
        """``max_batch_size`` of the effective config."""
        return int(self.config.max_batch_size)

    @property
    def platform(self) -> str:
        """What ModelMetadata reports: config.platform, else config.backend."""
        return self.config.platform or self.config.backend


def _wire_name(data_type: int) -> str:
    """The protocol datatype string of a config ``DataType`` ("INVALID" when unknown)."""
    try:
        return DataType(data_type).wire
    except ValueError:
        return DataType.INVALID.wire


def _io(t: mc.ModelInput | mc.ModelOutput, optional: bool) -> IOSpec:
    return IOSpec(t.name, _wire_name(t.data_type), tuple(t.dims), optional)


class ModelTable:
    """Name and version resolution over the models a frontend serves."""

    def __init__(self, entries: tuple[ModelEntry, ...]) -> None:
        self._models: dict[str, Model] = {}
        self._unloaded: dict[str, str] = {}
        self._unloaded_versions: dict[str, tuple[int, ...]] = {}
        """Per unloaded model, the versions it served (UNAVAILABLE "unloaded" in Triton)."""
        self._unloaded_failures: dict[str, dict[int, str]] = {}
        """Per unloaded model, the versions that had failed to load -> why (Triton keeps
        them UNAVAILABLE with that reason, and not ready under strict readiness)."""
        self._no_instance: set[tuple[str, int]] = set()
        self.update(entries)

    def update(self, entries: tuple[ModelEntry, ...]) -> None:
        """Replace the entries of these models (the others stay as they are).

        An ``unloaded`` entry removes the model from serving; RepositoryIndex still lists it
        (UNAVAILABLE, with the entry's reason).
        """
        for e in entries:
            self._no_instance = {k for k in self._no_instance if k[0] != e.name}
            if e.unloaded:
                self._models.pop(e.name, None)
                self._unloaded[e.name] = e.reason
                self._unloaded_versions[e.name] = tuple(sorted(e.retired_versions))
                self._unloaded_failures[e.name] = {
                    v: e.version_reasons.get(v, e.reason) for v in e.failed_versions
                }
                continue
            self._unloaded.pop(e.name, None)
            self._unloaded_versions.pop(e.name, None)
            self._unloaded_failures.pop(e.name, None)
            cfg = mc.ModelConfig.FromString(e.config) if e.config else mc.ModelConfig(name=e.name)
            self._models[e.name] = Model(
                name=e.name,
                config=cfg,
                ready_versions=tuple(sorted(e.ready_versions)),
                failed_versions=tuple(sorted(e.failed_versions)),
                reason=e.reason,
                inputs={t.name: _io(t, t.optional) for t in cfg.input},
                outputs={t.name: _io(t, False) for t in cfg.output},
                transition=e.transition,
                version_reasons=dict(e.version_reasons),
                ready_reasons=dict(e.ready_reasons) or None,
                retired_versions=tuple(sorted(e.retired_versions)),
                unloading_versions=tuple(sorted(e.unloading_versions)),
                decoupled=bool(cfg.model_transaction_policy.decoupled),
                readiness_hook=e.readiness_hook,
                labels=dict(e.labels),
                preserve_ordering=bool(
                    cfg.dynamic_batching.preserve_ordering
                    or (
                        cfg.HasField("sequence_batching")
                        and cfg.sequence_batching.oldest.preserve_ordering
                    )
                ),
            )

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._models.values())

    def unloaded(self) -> dict[str, str]:
        """Unloaded models and why (``unloaded`` for an explicit unload)."""
        return dict(self._unloaded)

    def unloaded_versions(self, name: str) -> tuple[int, ...]:
        """The versions an unloaded model served before its unload (ascending)."""
        return self._unloaded_versions.get(name, ())

    def unloaded_failures(self, name: str) -> dict[int, str]:
        """The versions of an unloaded model that had failed to load -> why."""
        return dict(self._unloaded_failures.get(name, {}))

    def all_ready(self) -> bool:
        """Strict readiness (core ``InferenceServer::IsReady``): every model has at least
        one ready version, none failed (an unloaded model's failed versions count) or
        UNLOADING (its reason is not "unloaded" yet), and every ready version has a live
        instance."""
        return (
            not self._no_instance
            and not any(self._unloaded_failures.values())
            and all(
                m.ready_versions and not m.failed_versions and not m.unloading_versions
                for m in self._models.values()
            )
        )

    def set_available(self, name: str, version: int, ready: bool) -> None:
        """Record whether a loaded version has a live instance (from the scheduler).

        NOTE: news of a version this table does not serve (one just unloaded, or not yet
        announced by the supervisor) is dropped: the next table update decides.
        """
        model = self._models.get(name)
        if model is None or version not in model.ready_versions:
            return
        if ready:
            self._no_instance.discard((name, version))
        else:
            self._no_instance.add((name, version))

    def has_live_instance(self, name: str, version: int) -> bool:
        """False while every instance of the version is dead (restarting or given up)."""
        return (name, version) not in self._no_instance

    def is_current(self, model: Model) -> bool:
        """Whether ``model`` is still this table's entry for its name (no update since)."""
        return self._models.get(model.name) is model

    def get(self, name: str) -> Model:
        """The model called ``name``.

        Raises:
            ModelNotFound: "Request for unknown model: '<m>' is not found".
        """
        model = self._models.get(name)
        if model is None:
            raise ModelNotFound(f"Request for unknown model: '{name}' is not found")
        return model

    def resolve(self, name: str, version: str) -> tuple[Model, int]:
        """The model and the concrete version a request addresses ("" = latest ready).

        An unloaded model answers as Triton's model lifecycle, which keeps its versions
        UNAVAILABLE: "has no available versions" for the latest, "... is not at ready
        state" for a version it served.

        Raises:
            ModelNotFound: unknown model or version, or no version available.
            ModelUnavailable: the version exists but failed to load, or a later change stopped
                serving it (core ``ModelLifeCycle::GetModel``: UNAVAILABLE "... version <v>
                is not at ready state").
            InvalidRequest: the version string is not a non-negative integer.
        """
        model = self._models.get(name)
        if model is None and name not in self._unloaded:
            raise ModelNotFound(f"Request for unknown model: '{name}' is not found")
        if not version:
            if model is None or not model.ready_versions:
                raise ModelNotFound(
                    f"Request for unknown model: '{name}' has no available versions"
                )
            return model, model.ready_versions[-1]
        v = version_number(version)
        if model is not None and v in model.ready_versions:
            return model, v
        if model is None:
            unavailable = v in self._unloaded_versions.get(name, ())
        else:
            unavailable = (
                v in model.failed_versions
                or v in model.retired_versions
                or v in model.unloading_versions
            )
        if unavailable:
            raise ModelUnavailable(
                f"Request for unknown model: '{name}' version {v} is not at ready state"
            )
        raise ModelNotFound(f"Request for unknown model: '{name}' version {v} is not found")


_STOL = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")
"""What ``std::stol`` reads: leading white space, a sign, digits; the rest is ignored."""


def version_number(version: str) -> int:
    """A request's version string as server ``common.cc`` GetModelVersionFromString reads
    it, with ``std::stol`` ("1x" is 1, " 2" is 2).

    Raises:
        InvalidRequest: no number, one outside int64 (``stol`` throws), or a negative one
            (Triton's messages).
    """
    m = _STOL.match(version)
    v = int(m.group(1)) if m else None
    if v is None or not -(2**63) <= v < 2**63:
        raise InvalidRequest(
            f"failed to get model version from specified version string '{version}' "
            "(details: stol), version should be an integral value > 0"
        )
    if v < 0:
        raise InvalidRequest(
            f"invalid model version specified '{version}' , version should be an integral value > 0"
        )
    return v
