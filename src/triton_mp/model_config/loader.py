"""Model repository loader: Triton's directory layout, config sources and version policy.

Owns the way from a directory on disk to the *effective* ``ModelConfig`` of a model:
reading ``config.pbtxt`` (protobuf text format, never a hand-written parser) or a load's
config override, then, in Triton's order, the server-side auto-complete, normalisation,
validation, the backend's auto-complete (the backend registry's hook), default instance
groups, and the choice of version directories. Each model is judged on its own: a bad model
comes back with ``error`` set and never stops the others from loading. Also fingerprints
directories, so a rescan can tell what changed.

Reproduces Triton (core ``model_lifecycle.cc``, ``model_repository_manager.cc``); known
differences are listed in ``load_model``'s docstring.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf import json_format, text_format

from triton_mp._proto import model_config_pb2
from triton_mp.backends.registry import BACKENDS, AutoCompleteOptions
from triton_mp.common.errors import ConfigError, ErrorCode, flatten_exception
from triton_mp.common.process.gpus import MIN_COMPUTE_CAPABILITY
from triton_mp.model_config.autocomplete import auto_complete_backend_fields
from triton_mp.model_config.ensemble import ENSEMBLE_PLATFORM, ensemble_failures
from triton_mp.model_config.labels import read_labels
from triton_mp.model_config.normalize import normalize_instance_group, normalize_model_config
from triton_mp.model_config.validate import (
    validate_instance_group,
    validate_model_config,
    validate_model_io_config,
)

log = logging.getLogger(__name__)

__all__ = [
    "CONFIG_FILENAME",
    "DEFAULT_MAX_BATCH_SIZE",
    "choose_versions",
    "ModelVersion",
    "RepositoryModel",
    "directory_fingerprint",
    "load_model",
    "load_repository",
    "parse_config_override",
    "read_config_pbtxt",
]

CONFIG_FILENAME = "config.pbtxt"
"""Name of the per-model configuration file inside ``<repository>/<model>/``."""

DEFAULT_MAX_BATCH_SIZE = 4
"""Triton's ``--backend-config=onnxruntime,default-max-batch-size`` default."""

# Sub-directories of a model directory that are never versions (model_lifecycle.cc).
_NON_VERSION_DIRS = frozenset({"warmup", "initial_state", "configs"})
_VERSION_RE = re.compile(r"[0-9]+")


@dataclass(frozen=True)
class ModelVersion:
    """One version directory chosen by the version policy.

    Attributes:
        version: the numeric name of the version directory (``<model>/<version>/``).
        path: the version directory.
        model_file: the backend's artifact inside it (``default_model_filename``: model.onnx,
            model.py, model.plan, ...). For an ensemble, which has no artifact, this is the
            version directory itself.
    """

    version: int
    path: Path
    model_file: Path


@dataclass(frozen=True)
class RepositoryModel:
    """The outcome of loading one model directory.

    ``error`` is the success flag: when it is ``None`` the model is loadable, ``config`` is the
    effective configuration (parsed, auto-completed, normalised, validated: what the
    ModelConfig RPC returns) and ``versions`` is non-empty. When ``error`` is set,
    ``versions`` is empty and ``config`` is whatever had been built when loading stopped
    (``None`` if config.pbtxt could not be parsed); it is for diagnostics only and must not be
    served.

    NOTE: ``config`` is a protobuf message and protobuf messages are mutable; treat it as
    read-only (copy it with ``CopyFrom`` before changing anything).

    Attributes:
        name: the model name, which is the directory name.
        directory: the model directory (``<repository>/<name>``).
        config: see above.
        versions: the versions to load per ``version_policy``, ascending.
        error: a Triton-like reason the model failed to load, or ``None``.
    """

    name: str
    directory: Path
    config: model_config_pb2.ModelConfig | None
    versions: tuple[ModelVersion, ...]
    error: str | None
    labels: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Output name -> its classification labels (``model_config.labels``)."""
    failed_versions: tuple[int, ...] = ()
    """With ``error``: the versions the policy chose when a check that Triton makes while
    creating each version failed (the backend's auto-complete, the inputs and outputs, the
    instance groups: core ``Model::Init`` and ``TritonModel::Create``, after the poll), so
    the load fails per version (each reason core's ``Status::AsString`` of an INVALID_ARG:
    ``common.errors.status_text``); empty when the model failed as a whole (the poll's
    checks)."""
    error_code: ErrorCode = ErrorCode.INVALID_ARG
    """With ``failed_versions``: the code of each version's failure (INTERNAL: the python
    model's own code failed in its ``auto_complete_config`` child, as in 2.51's stub)."""


TEXT_PROTO_ERROR = "failed to read text proto from"
NO_VERSION_ERROR = "at least one version must be available under the version policy of model"
"""Core ``ModelLifeCycle::AsyncLoad``'s INVALID_ARG when the version policy picks no version
directory (none exists, or none of the ``specific`` ones): this, then `` '<m>'``."""
"""How ``read_config_pbtxt``'s errors begin (core ``ReadTextProto``'s words)."""


def read_config_pbtxt(path: Path) -> model_config_pb2.ModelConfig:
    """Parse a ``config.pbtxt`` (protobuf text format) into a ``ModelConfig``.

    Uses ``google.protobuf.text_format.Parse``: unknown fields, a singular field given twice
    and bad enum names are errors, exactly as for Triton's C++ parser.

    Raises:
        ConfigError: the file cannot be read or decoded as UTF-8, or does not parse; the
            message names the file and carries the parser's ``line:column`` message.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{TEXT_PROTO_ERROR} {path}: {exc}") from exc
    config = model_config_pb2.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        raise ConfigError(f"{TEXT_PROTO_ERROR} {path}: {exc}") from exc
    return config


def load_repository(
    repository: Path,
    *,
    auto_complete: bool = True,
    default_max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
    gpu_ids: Sequence[int] = (),
    min_compute_capability: float = MIN_COMPUTE_CAPABILITY,
) -> list[RepositoryModel]:
    """Load every model of a repository: each sub-directory is one model.

    Hidden sub-directories (a leading ``.``) and plain files are skipped. After every model
    is loaded, ensembles are checked against the others: an ensemble whose steps name a model
    that is missing or failed fails with "ensemble <m> contains models that are not
    available: ...", and ensembles that depend on each other in a cycle fail with "circular
    dependency between ensembles: ...".

    Args:
        repository: the model repository directory.
        auto_complete: Triton's auto-complete (on unless ``--disable-auto-complete-config``).
        default_max_batch_size: max_batch_size given to batchable ONNX models whose config
            leaves it 0 (Triton's onnxruntime ``default-max-batch-size``).
        gpu_ids: the GPUs instances may use (CUDA ordinals, ``common.process.gpus.Devices.
            supported_ids``); empty means a CPU-only server.
        min_compute_capability: ``--min-supported-compute-capability``, quoted when a
            config names a GPU that is not in ``gpu_ids``.

    Returns:
        One ``RepositoryModel`` per model directory, sorted by name.

    Raises:
        ConfigError: ``repository`` does not exist or is not a directory.
    """
    repository = Path(repository)
    if not repository.is_dir():
        raise ConfigError(f"failed to stat file {repository}: model repository not found")
    models: dict[str, RepositoryModel] = {}
    for entry in sorted(repository.iterdir(), key=lambda p: p.name):
        if entry.name.startswith(".") or not entry.is_dir():
            continue
        models[entry.name] = load_model(
            entry,
            auto_complete=auto_complete,
            default_max_batch_size=default_max_batch_size,
            gpu_ids=gpu_ids,
            min_compute_capability=min_compute_capability,
        )
    _fail_unavailable_ensembles(models)
    return [models[name] for name in sorted(models)]


def parse_config_override(model: str, text: str) -> model_config_pb2.ModelConfig:
    """The ``config`` parameter of RepositoryModelLoad: a JSON ModelConfig (Triton's JSON
    form: int64 fields as numbers or strings) used instead of config.pbtxt.

    Raises:
        ConfigError: "Invalid config override: <detail>" (Triton's INVALID_ARG text).
    """
    config = model_config_pb2.ModelConfig()
    try:
        json_format.Parse(text, config)
    except (json_format.ParseError, ValueError) as e:
        raise ConfigError(f"Invalid config override: {e}") from None
    if not config.name:
        config.name = model
    return config


_IGNORED_FILES = frozenset({"__pycache__"})
"""Directories the server itself writes into a model directory (python's bytecode cache):
never a change of the model."""


def directory_fingerprint(directory: Path, *, skip: Iterable[str] = ()) -> str:
    """A digest of a directory tree's files (relative path, size, mtime in ns), so a rescan
    can tell whether anything changed. Hidden entries, ``__pycache__`` and the top-level
    names in ``skip`` are left out; a missing directory digests as empty."""
    digest = hashlib.sha256()
    skipped = set(skip)
    if not directory.is_dir():
        return digest.hexdigest()
    stack = [directory]
    while stack:
        current = stack.pop()
        try:
            entries = sorted(current.iterdir(), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            if entry.name.startswith(".") or entry.name in _IGNORED_FILES:
                continue
            if current == directory and entry.name in skipped:
                continue
            try:
                st = entry.stat()
            except OSError:
                continue
            rel = str(entry.relative_to(directory))
            if entry.is_dir():
                digest.update(f"d:{rel}\0".encode())
                stack.append(entry)
            else:
                digest.update(f"f:{rel}:{st.st_size}:{st.st_mtime_ns}\0".encode())
    return digest.hexdigest()


def load_model(
    directory: Path,
    *,
    auto_complete: bool = True,
    default_max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
    gpu_ids: Sequence[int] = (),
    min_compute_capability: float = MIN_COMPUTE_CAPABILITY,
    config_override: model_config_pb2.ModelConfig | None = None,
) -> RepositoryModel:
    """Load one model directory: config, auto-complete, normalise, validate, pick versions.

    Never raises for a bad model: any problem is returned in ``RepositoryModel.error`` (and
    logged). The steps, in Triton's order:

    1. read ``config.pbtxt`` (may be absent when ``auto_complete`` is on);
    2. server-side auto-complete (always, as in Triton): name, backend/platform from the
       files of the first version directory, ``default_model_filename``;
    3. normalise (version policy, preferred batch sizes, sequence idle time, pinned memory);
    4. validate the model-level config; without auto-complete also the inputs/outputs;
    5. check the config name against the directory name;
    6. check the backend is one triton-mp knows (a ``backends.registry.BACKENDS`` row, or
       an ensemble);
    7. choose version directories per policy and check each has the model file;
    8. backend auto-complete when ``auto_complete`` is on, the registry row's hook: for
       onnxruntime from the ONNX graph (inputs, outputs, max_batch_size, dynamic batching);
       for python by the model's ``auto_complete_config``, run in a child process;
    9. normalise again, validate inputs/outputs and the whole config, and normalise and
       validate the instance groups against ``gpu_ids``.

    Differences from Triton, on purpose: version directory names must be all digits (Triton's
    ``stoll`` also accepts "1abc"); ONNX auto-complete also completes inputs/outputs the
    config lists partially and adds those it leaves out (Triton only fills an empty list),
    and it keeps max_batch_size 0 when the config's own dims have the graph's full rank;
    duplicate input/output names are rejected; TensorRT's auto-complete is not run here (it
    needs the engine).

    Args:
        directory: ``<repository>/<model>``; its name is the model name.
        auto_complete: see ``load_repository``.
        default_max_batch_size: see ``load_repository``.
        gpu_ids: see ``load_repository``.
        min_compute_capability: see ``load_repository``.
        config_override: used instead of ``config.pbtxt`` (RepositoryModelLoad's
            ``config`` parameter, see ``parse_config_override``); completed and validated
            the same way.
    """
    directory = Path(directory)
    name = directory.name
    loader = _ModelLoader(
        directory,
        auto_complete=auto_complete,
        default_max_batch_size=default_max_batch_size,
        gpu_ids=tuple(sorted(set(gpu_ids))),
        min_compute_capability=min_compute_capability,
        config_override=config_override,
    )
    try:
        versions = loader.run()
    except ConfigError as exc:
        log.error("model '%s' is unavailable: %s", name, exc.message)
        chosen = tuple(v.version for v in loader.versions)
        return RepositoryModel(
            name, directory, loader.config, (), exc.message, {}, chosen, error_code=exc.code
        )
    except Exception as exc:  # NOTE: one broken model must never stop the repository load.
        log.exception("unexpected error loading model '%s'", name)
        reason = f"failed to load '{name}': {flatten_exception(exc)}"
        return RepositoryModel(name, directory, loader.config, (), reason)
    log.info(
        "model '%s' loaded: backend '%s', versions %s",
        name,
        loader.config.backend if loader.config else "",
        [v.version for v in versions],
    )
    return RepositoryModel(name, directory, loader.config, versions, None, loader.labels)


class _ModelLoader:
    """The steps of ``load_model`` for one directory; ``config`` is the work in progress."""

    def __init__(
        self,
        directory: Path,
        *,
        auto_complete: bool,
        default_max_batch_size: int,
        gpu_ids: tuple[int, ...],
        min_compute_capability: float = MIN_COMPUTE_CAPABILITY,
        config_override: model_config_pb2.ModelConfig | None = None,
    ) -> None:
        self.config_override = config_override
        self.directory = directory
        self.name = directory.name
        self.labels: dict[str, tuple[str, ...]] = {}
        self.auto_complete = auto_complete
        self.default_max_batch_size = default_max_batch_size
        self.gpu_ids = gpu_ids
        self.min_compute_capability = min_compute_capability
        self.config: model_config_pb2.ModelConfig | None = None
        self.versions: tuple[ModelVersion, ...] = ()
        """The versions chosen once the poll's checks passed (the later checks are per
        version in Triton)."""

    def run(self) -> tuple[ModelVersion, ...]:
        if not self.directory.is_dir():
            raise ConfigError(f"failed to load '{self.name}': model directory not found")
        config = self._read_config()
        self.config = config
        auto_complete_backend_fields(self.name, self.directory, config)
        normalize_model_config(config)
        validate_model_config(config)
        if not self.auto_complete:
            validate_model_io_config(config)
        if config.name != self.name:
            raise ConfigError(
                f"unexpected directory name '{self.name}' for model '{config.name}', "
                "directory name must equal model name"
            )
        is_ensemble = config.platform == ENSEMBLE_PLATFORM
        if not is_ensemble and config.backend not in BACKENDS:
            supported = ", ".join(sorted(BACKENDS))
            raise ConfigError(
                f"unable to load model '{self.name}': backend '{config.backend}' is not "
                f"supported by triton-mp (supported backends: {supported}, and ensembles)"
            )
        versions = self._versions_to_load(config)
        info = BACKENDS.get(config.backend)
        hook = info.auto_complete_hook() if self.auto_complete and info is not None else None
        if hook is not None:
            # NOTE: Triton auto-completes per version; one config per model here, so the
            # newest loadable version's artifact decides.
            options = AutoCompleteOptions(default_max_batch_size=self.default_max_batch_size)
            try:
                hook(config, versions[-1].model_file, options)
            except ConfigError as exc:
                if exc.code == ErrorCode.INTERNAL:  # NOTE: the model's code: per version
                    self.versions = versions
                raise
        self.versions = versions  # NOTE: Triton makes these checks per version (Model::Init)
        normalize_model_config(config)
        validate_model_io_config(config)
        validate_model_config(config)
        normalize_instance_group(config, self.gpu_ids)
        validate_instance_group(config, self.gpu_ids, self.min_compute_capability)
        # NOTE: core reads the label files in Model::Init too: a file that cannot be used
        # fails each version (2.51 side by side: tests/e2e/test_r22_load_checks.py)
        self.labels = read_labels(self.directory, config)
        self.versions = ()
        return versions

    def _read_config(self) -> model_config_pb2.ModelConfig:
        if self.config_override is not None:
            config = model_config_pb2.ModelConfig()
            config.CopyFrom(self.config_override)
            return config
        path = self.directory / CONFIG_FILENAME
        if path.is_file():
            return read_config_pbtxt(path)
        if self.auto_complete:
            return model_config_pb2.ModelConfig()
        raise ConfigError(
            f"failed to load '{self.name}': {path} not found; a model configuration is "
            "required when auto-complete is disabled"
        )

    def _versions_to_load(self, config: model_config_pb2.ModelConfig) -> tuple[ModelVersion, ...]:
        chosen = choose_versions(
            config.version_policy, _existing_versions(self.directory), self.name
        )
        if not chosen:
            raise ConfigError(f"{NO_VERSION_ERROR} '{self.name}'")
        model_filename = config.default_model_filename
        info = BACKENDS.get(config.backend)
        if not model_filename and info is not None:
            # NOTE: Triton leaves the field empty for a PyTorch config with a platform; the
            # backend itself falls back to its file (pytorch_backend: "model.pt").
            model_filename = info.default_model_filename
        is_ensemble = config.platform == ENSEMBLE_PLATFORM
        loadable: list[ModelVersion] = []
        failures: list[str] = []
        for version in sorted(chosen):
            path = self.directory / str(version)
            model_file = path if is_ensemble else path / model_filename
            if not is_ensemble and not model_file.exists():
                reason = f"version {version}: unable to find '{model_file}'"
                log.error("failed to load '%s' %s", self.name, reason)
                failures.append(reason)
                continue
            loadable.append(ModelVersion(version, path, model_file))
        if not loadable:
            detail = f": {'; '.join(failures)}" if failures else ""
            raise ConfigError(f"failed to load '{self.name}', no version is available{detail}")
        return tuple(loadable)


def choose_versions(
    policy: model_config_pb2.ModelVersionPolicy, existing: set[int], model: str
) -> set[int]:
    """The versions ``policy`` picks among the ``existing`` version directories.

    ``latest`` takes the newest ``num_versions``; ``all`` every one; ``specific`` the listed
    versions that exist (a listed version without a directory is logged and skipped, as in
    Triton's model_lifecycle.cc). ``model`` names the model in that log line.
    """
    which = policy.WhichOneof("policy_choice")
    if which == "all":
        return set(existing)
    if which != "specific":
        return set(sorted(existing, reverse=True)[: policy.latest.num_versions])
    chosen: set[int] = set()
    for v in policy.specific.versions:
        if v in existing:
            chosen.add(int(v))
        else:
            log.error(
                "version %d is specified for model '%s', but the version directory is not present",
                v,
                model,
            )
    return chosen


def _existing_versions(directory: Path) -> set[int]:
    """The valid version numbers among the sub-directories (model_lifecycle VersionsToLoad)."""
    versions: set[int] = set()
    for entry in directory.iterdir():
        if not entry.is_dir() or entry.name in _NON_VERSION_DIRS:
            continue
        if len(entry.name) > 1 and entry.name.startswith("0"):
            log.warning(
                "ignore version directory '%s' which contains leading zeros in its directory name",
                entry.name,
            )
            continue
        if not _VERSION_RE.fullmatch(entry.name):
            log.warning(
                "ignore version directory '%s' which fails to convert to integral number",
                entry.name,
            )
            continue
        versions.add(int(entry.name))
    return versions


def _fail_unavailable_ensembles(models: dict[str, RepositoryModel]) -> None:
    """Fail, in place, the ensembles ``ensemble.ensemble_failures`` finds (missing or failed
    steps, cycles between ensembles)."""
    ensembles = {
        name: [step.model_name for step in model.config.ensemble_scheduling.step]
        for name, model in models.items()
        if model.config is not None and model.config.HasField("ensemble_scheduling")
    }
    failed = {name for name, model in models.items() if model.error is not None}
    for name, reason in ensemble_failures(ensembles, set(models), failed).items():
        model = models[name]
        log.error("failed to load model '%s': %s", model.name, reason)
        models[name] = RepositoryModel(model.name, model.directory, model.config, (), reason)
