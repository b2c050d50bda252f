"""Triton's model repository extension: RepositoryIndex, RepositoryModelLoad / Unload.

Imported by the frontend only; no transport. The index is built from the frontend's model
table and the repository directory; loads and unloads are calls to the supervisor over the
control pipe (``frontend.admin.control.SupervisorLink``), allowed only with
``--model-control-mode=explicit``. Messages follow Triton's (server ``grpc_server.cc`` /
``http_server.cc``, core ``model_repository_manager.cc``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from triton_mp.common.errors import ErrorCode, InvalidRequest, TritonMPError
from triton_mp.frontend.model_table import Model, ModelTable
from triton_mp.ipc.protocol.control_messages import ModelLoadCall, ModelUnloadCall

if TYPE_CHECKING:
    # Annotations only: the supervisor imports this module (bls_control) and would otherwise
    # import asyncio through SupervisorLink (~30 ms CPU per server start).
    from triton_mp.frontend.admin.control import SupervisorLink

CONTROL_DISABLED_MESSAGE = "explicit model load / unload is not allowed if polling is enabled"
"""Triton's UNAVAILABLE answer to load/unload outside ``--model-control-mode=explicit``."""

FILE_PREFIX = "file:"
"""RepositoryModelLoad parameters carrying model files: ``file:<version>/<name>``."""


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """One row of RepositoryIndex (``RepositoryIndexResponse.ModelIndex``); "" = unset."""

    name: str
    version: str = ""
    state: str = ""
    """READY, UNLOADING, LOADING or UNAVAILABLE; "" for a model never loaded."""
    reason: str = ""


def _parameter_type(value: object) -> str:
    """TRITONSERVER_ParameterTypeString of a parameter value."""
    if isinstance(value, bool):
        return "BOOL"
    if isinstance(value, int):
        return "INT"
    if isinstance(value, bytes | bytearray):
        return "BYTES"
    return "STRING"


def check_model_name(name: str) -> None:
    """Core ``ValidateModelName`` (model_repository_manager.cc, 2026), run on every load.

    Raises:
        InvalidRequest: the name is empty or blank once trimmed, is ``..`` or holds a ``/``.
    """
    trimmed = name.strip(" \t\n\v\f\r")
    if not trimmed:
        raise InvalidRequest("Model name cannot be empty. Please enter a valid name to deploy.")
    if trimmed == ".." or "/" in trimmed:
        raise InvalidRequest(
            f"invalid model name '{name}', model name must not contain path traversal characters"
        )


def load_arguments(
    name: str, parameters: Mapping[str, object]
) -> tuple[str | None, dict[str, bytes]]:
    """A load's parameters checked as the core checks them (RepositoryModelLoad, and
    ``pb_utils.load_model`` through ``supervisor.models.bls_control``): ``(config, files)``, the
    files keyed by their path within the model directory.

    Raises:
        InvalidRequest: a parameter other than ``config`` (str) or ``file:<path>`` (bytes)
            ("Unrecognized load parameter '<p>' with type '<T>'"), a bad model name
            (``check_model_name``), or files without ``config``.
    """
    config: str | None = None
    files: dict[str, bytes] = {}
    for key, value in parameters.items():
        if key == "config" and isinstance(value, str):
            config = value
        elif key.startswith(FILE_PREFIX) and isinstance(value, bytes | bytearray):
            files[key.removeprefix(FILE_PREFIX)] = bytes(value)
        else:
            raise InvalidRequest(
                f"Unrecognized load parameter '{key}' with type '{_parameter_type(value)}'"
            )
    check_model_name(name)
    if files and config is None:
        raise InvalidRequest(
            f"failed to load '{name}': the 'config' parameter is required when model "
            "files are provided"
        )
    return config, files


def check_repository_name(repository: str) -> None:
    """Refuse a RepositoryModelLoad/Unload that names a repository (Triton serves one
    here; the request's ``repository_name``, or HTTP's ``/v2/repository/{name}/...``).

    Raises:
        TritonMPError: UNSUPPORTED when ``repository`` is not empty.
    """
    if repository:
        raise TritonMPError(
            "'repository_name' specification is not supported", ErrorCode.UNSUPPORTED
        )


def _model_rows(m: Model, ready_only: bool) -> Iterator[tuple[int, IndexEntry]]:
    """(version for sorting, row) of one model in the table."""
    reasons = m.ready_reasons or {}
    for v in m.ready_versions:
        yield v, IndexEntry(m.name, str(v), "READY", reasons.get(v, ""))
    if ready_only:
        return
    for v in m.failed_versions:
        yield v, IndexEntry(m.name, str(v), "UNAVAILABLE", m.version_reason(v))
    for v in m.unloading_versions:
        # NOTE: retired by a change or an unload and still finishing its requests (Triton:
        # UNLOADING, no reason, until the version's last in-flight request is done).
        yield v, IndexEntry(m.name, str(v), "UNLOADING")
    for v in m.retired_versions:
        yield v, IndexEntry(m.name, str(v), "UNAVAILABLE", "unloaded")
    if not m.ready_versions and not m.failed_versions and not m.unloading_versions:
        yield -1, IndexEntry(m.name, state=m.transition or "UNAVAILABLE", reason=m.reason)


class RepositoryApi:
    """The repository extension of one frontend.

    Args:
        models: the model table.
        model_control_mode: ``none``, ``poll`` or ``explicit``.
        link: the control pipe to the supervisor (load/unload).
        repository: the model repository directory (RepositoryIndex lists its models).
    """

    def __init__(
        self,
        *,
        models: ModelTable,
        model_control_mode: str = "none",
        link: SupervisorLink | None = None,
        repository: str = "",
    ) -> None:
        self._models = models
        self._mode = model_control_mode
        self._link = link
        self._repository = Path(repository) if repository else None

    def index(self, ready_only: bool) -> list[IndexEntry]:
        """Triton RepositoryIndex: every model and version with its state and reason.

        Loaded versions are READY (UNLOADING while an unload or reload drains them), failed
        ones UNAVAILABLE with their reason; a model being loaded is LOADING, an unloaded one
        UNAVAILABLE ("unloaded"; each version it served, as Triton lists them, and each
        version that had failed to load with its reason), and a
        model of the repository never loaded appears with its name only. Only the
        repository's directories are listed (a model loaded from ``file:`` overrides alone is
        not). Sorted by name, then version.

        Args:
            ready_only: list READY versions only (the request's ``ready`` flag).
        """
        out: list[tuple[str, int, IndexEntry]] = []
        seen: set[str] = set()
        for m in self._models:
            seen.add(m.name)
            out.extend((m.name, v, row) for v, row in _model_rows(m, ready_only))
        if not ready_only:
            for name, reason in self._models.unloaded().items():
                seen.add(name)
                served = self._models.unloaded_versions(name)
                failed = self._models.unloaded_failures(name)
                out.extend(
                    (name, v, IndexEntry(name, str(v), "UNAVAILABLE", reason))
                    for v in served
                    if v not in failed
                )
                out.extend(
                    (name, v, IndexEntry(name, str(v), "UNAVAILABLE", why))
                    for v, why in failed.items()
                )
                if not served and not failed:
                    out.append((name, -1, IndexEntry(name, state="UNAVAILABLE", reason=reason)))
        if self._repository is not None:
            # NOTE: core lists the repository's directories only (RepositoryIndex walks
            # them): a model loaded from overrides alone serves but is not listed.
            on_disk = self._repository_names()
            out = [t for t in out if t[0] in on_disk]
            if not ready_only:
                out.extend((name, -1, IndexEntry(name)) for name in on_disk - seen)
        out.sort(key=lambda t: (t[0], t[1]))
        return [t[2] for t in out]

    def _repository_names(self) -> set[str]:
        """The model directories of the repository now (hidden ones skipped)."""
        if self._repository is None:
            return set()
        try:
            return {
                p.name
                for p in self._repository.iterdir()
                if p.is_dir() and not p.name.startswith(".")
            }
        except OSError:
            return set()

    def _check_control(self) -> SupervisorLink:
        if self._mode != "explicit" or self._link is None:
            raise TritonMPError(CONTROL_DISABLED_MESSAGE, ErrorCode.UNAVAILABLE)
        return self._link

    async def load(self, name: str, parameters: Mapping[str, object]) -> None:
        """Triton RepositoryModelLoad: (re)load a model, waiting until it is done.

        Args:
            name: the model (a directory of the repository, unless files are given).
            parameters: ``config`` (str): a JSON ModelConfig used instead of config.pbtxt;
                ``file:<version>/<name>`` (bytes): model files, which need ``config`` and
                replace the model directory's content.

        Raises:
            TritonMPError: UNAVAILABLE outside explicit mode; INVALID_ARG for an unknown
                parameter ("Unrecognized load parameter '<p>' with type '<T>'"); the load's
                failure (INTERNAL "failed to load '<m>', ..." and the like).
        """
        link = self._check_control()
        config, files = load_arguments(name, parameters)
        await link.call(
            lambda cid: ModelLoadCall(call_id=cid, model=name, config_json=config, files=files)
        )

    async def unload(self, name: str, unload_dependents: bool) -> None:
        """Triton RepositoryModelUnload: stop serving a model once its in-flight requests
        are answered, then stop its instances.

        Raises:
            TritonMPError: UNAVAILABLE outside explicit mode.
        """
        link = self._check_control()
        await link.call(
            lambda cid: ModelUnloadCall(
                call_id=cid, model=name, unload_dependents=unload_dependents
            )
        )
