"""A load request and reading the model it names: step 1 of every model change.

Imported by ``supervisor.models.model_control``, ``supervisor.models.change_effects`` and
``supervisor.main`` (the models to load at start). A request names one model directory of
the repository, optionally with a config override (JSON) and ``file:`` contents
(RepositoryModelLoad's parameters, written to a temporary directory that lives as long as
the load it serves: ``remove_temp_dir``). Reading validates the model
(``model_config.loader.load_model``) and fingerprints each version (``Staged``), so the
planner (``supervisor.models.model_changes``) can tell which versions changed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from triton_mp._proto import model_config_pb2 as mc
from triton_mp.common.config import ServerConfig
from triton_mp.common.errors import ConfigError, ErrorCode, StartupError
from triton_mp.ipc.protocol.messages import ErrorInfo
from triton_mp.model_config.loader import (
    CONFIG_FILENAME,
    NO_VERSION_ERROR,
    TEXT_PROTO_ERROR,
    RepositoryModel,
    directory_fingerprint,
    load_model,
    parse_config_override,
)
from triton_mp.model_config.plan import rate_limits
from triton_mp.scheduler.limits.rate_limiter import Limits, check_resources

log = logging.getLogger(__name__)

POLL_FAILED_MESSAGE = "failed to load '{}', failed to poll from model repository"
"""Triton's INTERNAL answer to loading a model the repository does not have, or whose
config (``config.pbtxt`` or the ``config`` parameter) does not parse."""
OVERRIDE_ERROR = "Invalid config override: "
"""How ``parse_config_override``'s refusal starts."""


def is_model_name(name: str) -> bool:
    """Whether ``name`` can name a model directory of the repository: one path component,
    not hidden, not ``.``/``..``, no separators or NUL (a load must never reach outside the
    repository)."""
    return bool(name) and not name.startswith(".") and not any(c in name for c in ("/", "\\", "\0"))


@dataclass
class LoadRequest:
    """One model to (re)load in a change."""

    name: str
    config_json: str | None = None
    """RepositoryModelLoad's ``config`` parameter (JSON), overriding ``config.pbtxt``."""
    files: dict[str, bytes] = field(default_factory=dict)
    """RepositoryModelLoad's ``file:<path>`` parameters: the whole model directory."""
    result: ErrorInfo | None = None
    """The call's answer once decided (None: success)."""


@dataclass
class Staged:
    """A request whose model read and validated: on to planning."""

    req: LoadRequest
    rm: RepositoryModel
    temp_dir: Path | None
    fingerprints: dict[int, str]
    """Version on disk -> its fingerprint."""
    files: dict[int, str] = field(default_factory=dict)
    """Version on disk -> its ``files_fingerprint``."""
    regrouped: set[int] = field(default_factory=set)
    """Served versions this load updates in place (``supervisor.models.regroups``)."""


def remove_temp_dir(temp_dir: Path | None) -> None:
    """Remove a load's temporary model directory (``file:`` contents), if it has one."""
    if temp_dir is not None:
        shutil.rmtree(temp_dir, ignore_errors=True)


def version_fingerprint(model_dir: Path, config: bytes, version: int) -> str:
    """What decides whether a served version must be reloaded: its effective config, its
    version directory and the model directory's other files (``config.pbtxt`` counts only
    through the effective config, so a comment never reloads a model)."""
    digest = hashlib.sha256(config)
    digest.update(files_fingerprint(model_dir, version).encode())
    return digest.hexdigest()


def files_fingerprint(model_dir: Path, version: int) -> str:
    """The files part of ``version_fingerprint``: the version directory and the model
    directory's other files (not ``config.pbtxt``, not other versions), by path, size and
    mtime."""
    others = {p.name for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()}
    rest = directory_fingerprint(model_dir, skip={CONFIG_FILENAME, *others})
    return directory_fingerprint(model_dir / str(version)) + rest


def version_dirs(directory: Path) -> set[int]:
    """The numeric version directories of a model directory."""
    try:
        return {int(p.name) for p in directory.iterdir() if p.is_dir() and p.name.isdigit()}
    except OSError:
        return set()


def load_failure(name: str, failed: dict[int, str], ready: Collection[int] = ()) -> ErrorInfo:
    """Triton's answer when versions fail to load: INVALID_ARG (HTTP 400), one line per
    model (core model_lifecycle.cc OnLoadComplete, model_repository_manager.cc
    LoadUnloadModel). ``ready``: failed versions that core was updating in place
    (``updated_in_place``), which stay READY."""
    detail = "".join(
        f"version {v} is at {'READY' if v in ready else 'UNAVAILABLE'} state: {r};"
        for v, r in sorted(failed.items())
    )
    return ErrorInfo(ErrorCode.INVALID_ARG, f"load failed for model '{name}': {detail}\n")


def updated_in_place(served: bytes, config: mc.ModelConfig) -> bool:
    """Whether core would update a served version to ``config`` in place rather than load
    it anew: its ``ConfigChangeRequiresReload`` is false, the configs differing at most in
    ``instance_group`` and ``version_policy``. ``served``: the served effective config
    (serialized ``ModelConfig``)."""
    old, new = mc.ModelConfig.FromString(served), mc.ModelConfig()
    new.CopyFrom(config)
    for c in (old, new):
        c.ClearField("instance_group")
        c.ClearField("version_policy")
    return old == new


def load_answer(req: LoadRequest, rm: RepositoryModel) -> ErrorInfo | None:
    """The answer to a load whose model read badly: ``req.result`` as it stands, but
    INTERNAL "failed to poll from model repository" when ``config.pbtxt`` does not parse
    (Triton's poll fails there; only its log carries the parser's words), and a model the
    version policy finds no version of as core's repository manager words an ``AsyncLoad``
    refusal: "load failed for model '<m>': <why>" and a newline."""
    if rm.config is None and (rm.error or "").startswith(TEXT_PROTO_ERROR):
        return ErrorInfo(ErrorCode.INTERNAL, POLL_FAILED_MESSAGE.format(req.name))
    if (rm.error or "").startswith(NO_VERSION_ERROR):
        return ErrorInfo(ErrorCode.INVALID_ARG, f"load failed for model '{req.name}': {rm.error}\n")
    return req.result


def _not_found(req: LoadRequest) -> None:
    req.result = ErrorInfo(ErrorCode.INTERNAL, POLL_FAILED_MESSAGE.format(req.name))
    log.error("%s", req.result.message)


def _write_files(req: LoadRequest, server_id: str) -> Path:
    """Write the request's ``file:`` contents to a new temporary directory; returns it.

    Raises:
        ConfigError: a path leaves the model directory once normalised (Triton's "Invalid
            file parameter ... must stay within model directory.") or names the directory
            itself, or the file cannot be written (a NUL byte in its path): the temporary
            directory is removed again.
    """
    temp_dir = Path(tempfile.mkdtemp(prefix=f"triton_mp_{server_id}_"))
    try:
        _write_into(temp_dir, req)
    except (OSError, ValueError) as e:
        shutil.rmtree(temp_dir, ignore_errors=True)
        raise ConfigError(
            f"failed to load '{req.name}': cannot write a file parameter: {e}"
        ) from None
    except BaseException:
        shutil.rmtree(temp_dir, ignore_errors=True)
        raise
    return temp_dir


def _write_into(temp_dir: Path, req: LoadRequest) -> None:
    directory = temp_dir / req.name
    for rel, content in req.files.items():
        # NOTE: as core's LocalizeRepoAgent: the path joins the model directory (an absolute
        # one too, JoinPath), is normalised, and must stay within it.
        normal = os.path.normpath(f"{directory}/{rel.lstrip('/')}")
        if os.path.commonpath([normal, directory]) != str(directory):
            raise ConfigError(
                f"Invalid file parameter 'file:{rel}' with normalized path '{normal}' must "
                "stay within model directory."
            )
        path = PurePosixPath(os.path.relpath(normal, directory))
        if normal == str(directory):
            raise ConfigError(
                f"failed to load '{req.name}': invalid file path '{rel}' "
                "(it must name a file within the model directory)"
            )
        target = directory.joinpath(*path.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)


def read_request(
    req: LoadRequest,
    config: ServerConfig,
    server_id: str,
    seen: dict[str, str],
    gpu_ids: tuple[int, ...] = (),
) -> tuple[RepositoryModel | None, Path | None]:
    """Read the model a request names: its directory (a temporary one for ``file:``
    contents) and the loaded model; sets ``req.result`` and returns ``(None, None)`` when
    there is nothing to load. ``seen`` records each repository directory's fingerprint at
    this attempt (poll mode). ``gpu_ids``: the GPUs instance groups may name
    (``common.process.gpus.Devices.supported_ids``)."""
    if not is_model_name(req.name):
        # NOTE: a name is one directory entry of the repository, never a path.
        _not_found(req)
        return None, None
    override: mc.ModelConfig | None = None
    temp_dir: Path | None = None
    try:
        if req.config_json is not None:
            override = parse_config_override(req.name, req.config_json)
        if req.files:
            temp_dir = _write_files(req, server_id)
            directory = temp_dir / req.name
        else:
            directory = config.repository_path / req.name
            if not directory.is_dir():
                _not_found(req)
                return None, None
    except ConfigError as e:
        if e.message.startswith(OVERRIDE_ERROR):
            # NOTE: Triton's poll fails on an override that does not parse; only its log
            # carries the parser's words.
            log.error("%s", e.message)
            req.result = ErrorInfo(ErrorCode.INTERNAL, POLL_FAILED_MESSAGE.format(req.name))
        else:
            req.result = ErrorInfo(e.code, e.message)
        return None, None
    if not req.files:
        seen[req.name] = directory_fingerprint(directory)
    rm = load_model(
        directory,
        auto_complete=config.auto_complete,
        default_max_batch_size=config.default_max_batch_size,
        gpu_ids=gpu_ids,
        min_compute_capability=config.min_compute_capability,
        config_override=override,
    )
    if rm.error is None and rm.config is not None and config.rate_limit == "execution_count":
        error = rate_limit_error(rm.config, config)
        if error is not None:
            rm = dataclasses.replace(rm, error=error, versions=())
    return rm, temp_dir


def rate_limit_error(model: mc.ModelConfig, config: ServerConfig) -> str | None:
    """Triton's load error for a model whose ``rate_limiter`` resources can never be had
    (core ``RateLimiter::ResourceManager``), or None."""
    limits = [
        Limits(tuple((r.name, r.global_, r.count) for r in s.resources), s.priority, s.device)
        for s in rate_limits(model)
    ]
    explicit = [(r.name, r.count, r.device) for r in config.rate_limit_resources]
    return check_resources(limits, explicit)


def models_at_start(config: ServerConfig) -> list[str]:
    """The models to load at start: all (modes none, poll, explicit with ``*``) or the
    ``--load-model`` ones (explicit).

    Raises:
        StartupError: the repository does not exist.
    """
    repo = config.repository_path
    if not repo.is_dir():
        raise StartupError(f"failed to stat file {repo}: model repository not found")
    present = sorted(p.name for p in repo.iterdir() if p.is_dir() and not p.name.startswith("."))
    if config.model_control_mode != "explicit" or "*" in config.load_models:
        return present
    # NOTE: Triton's explicit mode loads only --load-model models at start.
    for name in sorted(set(config.load_models) - set(present)):
        log.error("failed to load '%s': model not found in the repository", name)
    return [n for n in present if n in set(config.load_models)]
