"""Model repository loader: Triton's directory layout, config.pbtxt rules and version policy.

Owns everything between a directory on disk and the *effective* ``ModelConfig`` of a model:
reading ``config.pbtxt`` (protobuf text format, never a hand-written parser), backend and
platform inference from the files, ONNX auto-complete from the graph signature,
normalisation, validation, default instance groups and the choice of version directories.
Imported by the supervisor (and the CLI) at startup; it starts no process and touches no
global state. Each model is judged on its own: a bad model comes back with ``error`` set and
never stops the others from loading.

Reproduces Triton (core ``model_config_utils.cc``, ``model_repository_manager.cc``,
``model_lifecycle.cc``, onnxruntime_backend auto-complete); see
``shared/reference/triton.md`` §3 and §4.1-4.3. Known differences are listed in
``load_model``'s docstring.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import json_format, text_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from triton_mp._proto import model_config_pb2
from triton_mp.common.errors import ConfigError, flatten_exception

log = logging.getLogger(__name__)

__all__ = [
    "CONFIG_FILENAME",
    "DEFAULT_MAX_BATCH_SIZE",
    "SUPPORTED_BACKENDS",
    "ModelVersion",
    "RepositoryModel",
    "config_to_json",
    "datatype_to_protocol",
    "instance_names",
    "load_model",
    "load_repository",
    "protocol_to_datatype",
    "read_config_pbtxt",
]

_pb = model_config_pb2
_ModelConfig = model_config_pb2.ModelConfig

CONFIG_FILENAME = "config.pbtxt"
"""Name of the per-model configuration file inside ``<repository>/<model>/``."""

DEFAULT_MAX_BATCH_SIZE = 4
"""Triton's ``--backend-config=onnxruntime,default-max-batch-size`` default."""

SEQUENCE_IDLE_DEFAULT_US = 1_000_000
"""Triton's SEQUENCE_IDLE_DEFAULT_MICROSECONDS: idle timeout written when the config gives 0."""

MIN_COMPUTE_CAPABILITY = 6.0
"""Triton's TRITON_MIN_COMPUTE_CAPABILITY; only quoted in the invalid-gpu-id message."""

# Triton's names (core constants.h).
ENSEMBLE_PLATFORM = "ensemble"
ONNXRUNTIME_BACKEND = "onnxruntime"
ONNXRUNTIME_PLATFORM = "onnxruntime_onnx"
ONNXRUNTIME_FILENAME = "model.onnx"
TENSORRT_BACKEND = "tensorrt"
TENSORRT_PLATFORM = "tensorrt_plan"
TENSORRT_FILENAME = "model.plan"
PYTHON_BACKEND = "python"
PYTHON_FILENAME = "model.py"
_TF_BACKEND = "tensorflow"
_TF_GRAPHDEF_PLATFORM = "tensorflow_graphdef"
_TF_GRAPHDEF_FILENAME = "model.graphdef"
_TF_SAVEDMODEL_PLATFORM = "tensorflow_savedmodel"
_TF_SAVEDMODEL_FILENAME = "model.savedmodel"
_OPENVINO_BACKEND = "openvino"
_OPENVINO_FILENAME = "model.xml"
_PYTORCH_BACKEND = "pytorch"
_PYTORCH_PLATFORM = "pytorch_libtorch"
_PYTORCH_PLATFORM_ALT = "libtorch"
_PYTORCH_FILENAME = "model.pt"
_PYTORCH_AOTI_PLATFORM = "torch_aoti"
_PYTORCH_AOTI_FILENAME = "model.pt2"

SUPPORTED_BACKENDS = frozenset({ONNXRUNTIME_BACKEND, PYTHON_BACKEND, TENSORRT_BACKEND})
"""Backends triton-mp has workers for. Any other backend fails to load with a clear reason."""

# Backend "types" Triton checks platform/backend pairs against (GetBackendType /
# GetBackendTypeFromPlatform). A backend not in this table (python, custom ones) accepts any
# platform.
_BACKEND_OF_PLATFORM = {
    _TF_GRAPHDEF_PLATFORM: _TF_BACKEND,
    _TF_SAVEDMODEL_PLATFORM: _TF_BACKEND,
    TENSORRT_PLATFORM: TENSORRT_BACKEND,
    ONNXRUNTIME_PLATFORM: ONNXRUNTIME_BACKEND,
    _PYTORCH_PLATFORM: _PYTORCH_BACKEND,
    _PYTORCH_AOTI_PLATFORM: _PYTORCH_BACKEND,
}
_TYPED_BACKENDS = frozenset(_BACKEND_OF_PLATFORM.values())

# Sub-directories of a model directory that are never versions (model_lifecycle.cc).
_NON_VERSION_DIRS = frozenset({"warmup", "initial_state", "configs"})
_VERSION_RE = re.compile(r"[0-9]+")

_WILDCARD_DIM = -1

_INT64_FIELD_TYPES = frozenset(
    {
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
    }
)

# ONNX TensorProto.DataType -> config DataType (onnxruntime_backend
# OnnxDataTypeToModelConfigDataType). Values are ONNX's stable enum numbers.
_ONNX_TO_CONFIG_DTYPE = {
    1: _pb.TYPE_FP32,  # FLOAT
    2: _pb.TYPE_UINT8,
    3: _pb.TYPE_INT8,
    4: _pb.TYPE_UINT16,
    5: _pb.TYPE_INT16,
    6: _pb.TYPE_INT32,
    7: _pb.TYPE_INT64,
    8: _pb.TYPE_STRING,
    9: _pb.TYPE_BOOL,
    10: _pb.TYPE_FP16,
    11: _pb.TYPE_FP64,  # DOUBLE
    12: _pb.TYPE_UINT32,
    13: _pb.TYPE_UINT64,
    16: _pb.TYPE_BF16,
}


# ---------------------------------------------------------------------------
# Public types
# ---------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------
# Data types
# ---------------------------------------------------------------------------


def datatype_to_protocol(dt: int) -> str:
    """Return the KServe protocol string of a config ``DataType``.

    ``TYPE_FP32`` -> ``"FP32"``; ``TYPE_STRING`` -> ``"BYTES"``. ``TYPE_INVALID`` and unknown
    numbers give ``"INVALID"`` (Triton prints ``"<invalid>"``); never raises.
    """
    if dt == _pb.TYPE_STRING:
        return "BYTES"
    if dt == _pb.TYPE_INVALID or dt not in _pb.DataType.values():
        return "INVALID"
    return str(_pb.DataType.Name(dt)).removeprefix("TYPE_")


def protocol_to_datatype(s: str) -> int:
    """Return the config ``DataType`` of a KServe protocol string (``"BYTES"`` -> TYPE_STRING).

    Unknown strings give ``TYPE_INVALID``, as Triton's ProtocolStringToDataType does; never
    raises. Matching is exact (protocol strings are upper case).
    """
    if s == "BYTES":
        return int(_pb.TYPE_STRING)
    if s in ("STRING", "INVALID"):
        return int(_pb.TYPE_INVALID)
    try:
        return int(_pb.DataType.Value("TYPE_" + s))
    except ValueError:
        return int(_pb.TYPE_INVALID)


# ---------------------------------------------------------------------------
# Parsing and JSON
# ---------------------------------------------------------------------------


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
        raise ConfigError(f"failed to read text proto from {path}: {exc}") from exc
    config = _ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        raise ConfigError(f"failed to read text proto from {path}: {exc}") from exc
    return config


def config_to_json(config: Message) -> dict[str, Any]:
    """Return Triton's JSON form of a ``ModelConfig`` as a ``dict``.

    This is protobuf JSON with proto field names and every field without presence printed
    (``"max_batch_size": 0``, ``"input": []``, ``"platform": ""``), with int64/uint64 values
    turned back from JSON strings into numbers (core ModelConfigToJson). Map keys stay
    strings, as JSON requires. Unlike Triton, which fixes a hand-written list of fields (and
    misses e.g. ``sequence_batching.state.initial_state.dims``), every 64-bit field is fixed.
    """
    raw: dict[str, Any] = json_format.MessageToDict(
        config,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )
    _ints_from_strings(config.DESCRIPTOR, raw)
    return raw


def _ints_from_strings(descriptor: Any, obj: dict[str, Any]) -> None:
    """Rewrite, in place, the 64-bit integer strings of a MessageToDict result as ints."""
    for key, value in obj.items():
        field = descriptor.fields_by_name.get(key)
        if field is None:
            continue
        if _is_map(field):
            value_field = field.message_type.fields_by_name["value"]
            for map_key, item in value.items():
                value[map_key] = _fix_value(value_field, item)
        elif field.is_repeated:
            obj[key] = [_fix_value(field, item) for item in value]
        else:
            obj[key] = _fix_value(field, value)


def _fix_value(field: FieldDescriptor, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_MESSAGE and isinstance(value, dict):
        _ints_from_strings(field.message_type, value)
        return value
    if field.type in _INT64_FIELD_TYPES and isinstance(value, str):
        return int(value)
    return value


def _is_map(field: FieldDescriptor) -> bool:
    message_type: Any = field.message_type
    return field.type == FieldDescriptor.TYPE_MESSAGE and bool(message_type.GetOptions().map_entry)


# ---------------------------------------------------------------------------
# Instances
# ---------------------------------------------------------------------------


def instance_names(config: model_config_pb2.ModelConfig) -> list[tuple[str, int, int]]:
    """List the model instances a normalised config asks for, in Triton's order and naming.

    Each entry is ``(instance_name, kind, gpu_id)``: ``instance_name`` is
    ``<group_name>_<i>`` for ``i`` in ``range(count)``; ``kind`` is a
    ``ModelInstanceGroup.Kind`` value; ``gpu_id`` is the device for ``KIND_GPU`` and -1
    otherwise. A ``KIND_GPU`` group makes ``count`` instances *per listed GPU*, and (as in
    Triton's backend_model.cc) the copies on different GPUs share the name, so
    ``(instance_name, gpu_id)`` is the unique key. Passive instances are included (they are
    loaded but never scheduled; see ``group.passive``). Ensembles have no instances.
    """
    out: list[tuple[str, int, int]] = []
    if config.HasField("ensemble_scheduling"):
        return out
    for group in config.instance_group:
        for i in range(group.count):
            name = f"{group.name}_{i}"
            if group.kind == _pb.ModelInstanceGroup.KIND_GPU:
                out.extend((name, int(group.kind), int(gpu)) for gpu in group.gpus)
            else:
                out.append((name, int(group.kind), -1))
    return out


# ---------------------------------------------------------------------------
# Repository and model loading
# ---------------------------------------------------------------------------


def load_repository(
    repository: Path,
    *,
    auto_complete: bool = True,
    default_max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
    gpu_ids: Sequence[int] = (),
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
        gpu_ids: the GPUs instances may use; empty means a CPU-only server.

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
        )
    _check_ensemble_dependencies(models)
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
    6. check the backend is one triton-mp runs (``SUPPORTED_BACKENDS``, or an ensemble);
    7. choose version directories per policy and check each has the model file;
    8. backend auto-complete when ``auto_complete`` is on: for onnxruntime from the ONNX
       graph (inputs, outputs, max_batch_size, dynamic batching); for python by the model's
       ``auto_complete_config``, run in a child process (``workers.python_autocomplete``);
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
        config_override=config_override,
    )
    try:
        versions = loader.run()
    except ConfigError as exc:
        log.error("model '%s' is unavailable: %s", name, exc.message)
        return RepositoryModel(name, directory, loader.config, (), exc.message)
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
    return RepositoryModel(name, directory, loader.config, versions, None)


class _ModelLoader:
    """The steps of ``load_model`` for one directory; ``config`` is the work in progress."""

    def __init__(
        self,
        directory: Path,
        *,
        auto_complete: bool,
        default_max_batch_size: int,
        gpu_ids: tuple[int, ...],
        config_override: model_config_pb2.ModelConfig | None = None,
    ) -> None:
        self.config_override = config_override
        self.directory = directory
        self.name = directory.name
        self.auto_complete = auto_complete
        self.default_max_batch_size = default_max_batch_size
        self.gpu_ids = gpu_ids
        self.config: model_config_pb2.ModelConfig | None = None

    def run(self) -> tuple[ModelVersion, ...]:
        if not self.directory.is_dir():
            raise ConfigError(f"failed to load '{self.name}': model directory not found")
        config = self._read_config()
        self.config = config
        _auto_complete_backend_fields(self.name, self.directory, config)
        _normalize_model_config(config)
        _validate_model_config(config)
        if not self.auto_complete:
            _validate_model_io_config(config)
        if config.name != self.name:
            raise ConfigError(
                f"unexpected directory name '{self.name}' for model '{config.name}', "
                "directory name must equal model name"
            )
        is_ensemble = config.platform == ENSEMBLE_PLATFORM
        if not is_ensemble and config.backend not in SUPPORTED_BACKENDS:
            supported = ", ".join(sorted(SUPPORTED_BACKENDS))
            raise ConfigError(
                f"unable to load model '{self.name}': backend '{config.backend}' is not "
                f"supported by triton-mp (supported backends: {supported}, and ensembles)"
            )
        versions = self._versions_to_load(config)
        if self.auto_complete and config.backend == ONNXRUNTIME_BACKEND:
            # NOTE: Triton auto-completes per version; one config per model here, so the
            # newest loadable version's graph decides.
            _auto_complete_onnx(config, versions[-1].model_file, self.default_max_batch_size)
        elif self.auto_complete and config.backend == PYTHON_BACKEND:
            # NOTE: as for ONNX, the newest loadable version's model.py decides.
            _auto_complete_python(config, versions[-1].model_file)
        _normalize_model_config(config)
        _validate_model_io_config(config)
        _validate_model_config(config)
        _normalize_instance_group(config, self.gpu_ids)
        _validate_instance_group(config, self.gpu_ids)
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
            return _ModelConfig()
        raise ConfigError(
            f"failed to load '{self.name}': {path} not found; a model configuration is "
            "required when auto-complete is disabled"
        )

    def _versions_to_load(self, config: model_config_pb2.ModelConfig) -> tuple[ModelVersion, ...]:
        existing = _existing_versions(self.directory)
        policy = config.version_policy
        chosen: set[int]
        which = policy.WhichOneof("policy_choice")
        if which == "specific":
            chosen = set()
            for v in policy.specific.versions:
                if v in existing:
                    chosen.add(int(v))
                else:
                    log.error(
                        "version %d is specified for model '%s', but the version directory "
                        "is not present",
                        v,
                        self.name,
                    )
        elif which == "all":
            chosen = set(existing)
        else:
            chosen = set(sorted(existing, reverse=True)[: policy.latest.num_versions])

        model_filename = config.default_model_filename
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


def _check_ensemble_dependencies(models: dict[str, RepositoryModel]) -> None:
    """Fail ensembles whose steps are unavailable or that depend on each other in a cycle."""

    def steps_of(model: RepositoryModel) -> list[str]:
        assert model.config is not None
        return [step.model_name for step in model.config.ensemble_scheduling.step]

    def is_ensemble(model: RepositoryModel) -> bool:
        return model.config is not None and model.config.HasField("ensemble_scheduling")

    # Cycles first: a cycle is reported on every ensemble that lies on it.
    for name, model in list(models.items()):
        if model.error is not None or not is_ensemble(model):
            continue
        cycle = _find_cycle(name, models, steps_of, is_ensemble)
        if cycle is not None:
            reason = "circular dependency between ensembles: " + " -> ".join(cycle)
            models[name] = _failed(model, reason)

    # Then availability, to a fixpoint: an ensemble of a failed ensemble fails too.
    changed = True
    while changed:
        changed = False
        for name, model in list(models.items()):
            if model.error is not None or not is_ensemble(model):
                continue
            missing = sorted(
                {
                    step
                    for step in steps_of(model)
                    if step not in models or models[step].error is not None
                }
            )
            if missing:
                reason = f"ensemble {name} contains models that are not available: " + ", ".join(
                    missing
                )
                models[name] = _failed(model, reason)
                changed = True


def _find_cycle(
    start: str,
    models: dict[str, RepositoryModel],
    steps_of: Callable[[RepositoryModel], list[str]],
    is_ensemble: Callable[[RepositoryModel], bool],
) -> list[str] | None:
    """Return ``[start, ..., start]`` if ``start`` reaches itself through ensemble steps."""
    stack: list[tuple[str, Iterator[str]]] = [(start, iter(steps_of(models[start])))]
    path = [start]
    seen = {start}
    while stack:
        _, children = stack[-1]
        child = next(children, None)
        if child is None:
            stack.pop()
            path.pop()
            continue
        if child == start:
            return [*path, start]
        if child in seen or child not in models or not is_ensemble(models[child]):
            continue
        seen.add(child)
        path.append(child)
        stack.append((child, iter(steps_of(models[child]))))
    return None


def _failed(model: RepositoryModel, reason: str) -> RepositoryModel:
    log.error("failed to load model '%s': %s", model.name, reason)
    return RepositoryModel(model.name, model.directory, model.config, (), reason)


# ---------------------------------------------------------------------------
# Server-side auto-complete and normalisation (core model_config_utils.cc)
# ---------------------------------------------------------------------------


def _auto_complete_backend_fields(
    model_name: str, model_path: Path, config: model_config_pb2.ModelConfig
) -> None:
    """Fill name, backend, platform and default_model_filename (AutoCompleteBackendFields).

    Only the first sub-directory (by name) is inspected for model files, as in Triton.

    Raises:
        ConfigError: no backend can be determined ("Invalid model name: ...").
    """
    subdirs = sorted(p.name for p in model_path.iterdir() if p.is_dir())
    has_version = bool(subdirs)
    version_path = model_path / subdirs[0] if has_version else None
    content: dict[str, bool] = {}  # file name -> is a directory
    if version_path is not None:
        content = {p.name: p.is_dir() for p in version_path.iterdir()}

    def has_file(filename: str) -> bool:
        return filename in content and not content[filename]

    if not config.name:
        config.name = model_name

    filename = config.default_model_filename

    # TensorFlow: the platform is required, so infer it first.
    if not config.platform and config.backend in ("", _TF_BACKEND):
        if filename == _TF_SAVEDMODEL_FILENAME:
            config.platform = _TF_SAVEDMODEL_PLATFORM
        elif filename == _TF_GRAPHDEF_FILENAME:
            config.platform = _TF_GRAPHDEF_PLATFORM
        elif not filename and has_version:
            if content.get(_TF_SAVEDMODEL_FILENAME) is True:
                config.platform = _TF_SAVEDMODEL_PLATFORM
            if has_file(_TF_GRAPHDEF_FILENAME):
                config.platform = _TF_GRAPHDEF_PLATFORM
    if config.platform in (_TF_SAVEDMODEL_PLATFORM, _TF_GRAPHDEF_PLATFORM):
        if not config.backend:
            config.backend = _TF_BACKEND
        if not config.default_model_filename:
            config.default_model_filename = (
                _TF_SAVEDMODEL_FILENAME
                if config.platform == _TF_SAVEDMODEL_PLATFORM
                else _TF_GRAPHDEF_FILENAME
            )
        return

    # TensorRT
    if not config.backend and (
        config.platform == TENSORRT_PLATFORM
        or filename == TENSORRT_FILENAME
        or (not config.platform and not filename and has_file(TENSORRT_FILENAME))
    ):
        config.backend = TENSORRT_BACKEND
    if config.backend == TENSORRT_BACKEND:
        if not config.platform:
            config.platform = TENSORRT_PLATFORM
        if not config.default_model_filename:
            config.default_model_filename = TENSORRT_FILENAME
        return

    # ONNX Runtime (model.onnx may be a directory for large models)
    if not config.backend and (
        config.platform == ONNXRUNTIME_PLATFORM
        or filename == ONNXRUNTIME_FILENAME
        or (not config.platform and not filename and ONNXRUNTIME_FILENAME in content)
    ):
        config.backend = ONNXRUNTIME_BACKEND
    if config.backend == ONNXRUNTIME_BACKEND:
        if not config.platform:
            config.platform = ONNXRUNTIME_PLATFORM
        if not config.default_model_filename:
            config.default_model_filename = ONNXRUNTIME_FILENAME
        return

    # OpenVINO
    if not config.backend and (
        filename == _OPENVINO_FILENAME
        or (not config.platform and not filename and _OPENVINO_FILENAME in content)
    ):
        config.backend = _OPENVINO_BACKEND
    if config.backend == _OPENVINO_BACKEND:
        if not config.default_model_filename:
            config.default_model_filename = _OPENVINO_FILENAME
        return

    # PyTorch
    if not config.backend:
        if config.platform in (
            _PYTORCH_PLATFORM,
            _PYTORCH_PLATFORM_ALT,
            _PYTORCH_AOTI_PLATFORM,
        ) or filename in (_PYTORCH_FILENAME, _PYTORCH_AOTI_FILENAME):
            config.backend = _PYTORCH_BACKEND
        elif not filename and not config.platform and has_version:
            if has_file(_PYTORCH_FILENAME):
                config.backend = _PYTORCH_BACKEND
                config.platform = _PYTORCH_PLATFORM
            elif has_file(_PYTORCH_AOTI_FILENAME):
                config.backend = _PYTORCH_BACKEND
                config.platform = _PYTORCH_AOTI_PLATFORM
    if config.backend == _PYTORCH_BACKEND:
        if not config.platform:
            config.platform = _PYTORCH_PLATFORM
            if not config.default_model_filename:
                config.default_model_filename = _PYTORCH_FILENAME
        elif config.platform == _PYTORCH_AOTI_PLATFORM and not config.default_model_filename:
            config.default_model_filename = _PYTORCH_AOTI_FILENAME
        return

    # Python
    if not config.backend and (
        filename == PYTHON_FILENAME
        or (not config.platform and not filename and PYTHON_FILENAME in content)
    ):
        config.backend = PYTHON_BACKEND
    if config.backend == PYTHON_BACKEND:
        if not config.default_model_filename:
            config.default_model_filename = PYTHON_FILENAME
        return

    # Custom backend: only when the config says nothing at all; "<x>.<backend>" directory.
    if not config.backend and not config.platform and not config.default_model_filename:
        _, dot, backend = model_name.partition(".")
        if not dot:
            raise ConfigError(
                f"Invalid model name: Could not determine backend for model '{model_name}' "
                "with no backend in model configuration. Expected model name of the form "
                "'model.<backend_name>'."
            )
        config.backend = backend
        config.default_model_filename = f"model.{backend}"


def _normalize_model_config(config: model_config_pb2.ModelConfig) -> None:
    """Fill Triton's defaults (NormalizeModelConfig). Idempotent."""
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1
    mbs = config.max_batch_size
    if (
        config.HasField("dynamic_batching")
        and not config.dynamic_batching.preferred_batch_size
        and mbs > 0
    ):
        config.dynamic_batching.preferred_batch_size.append(mbs)
    if config.HasField("sequence_batching"):
        seq = config.sequence_batching
        if seq.max_sequence_idle_microseconds == 0:
            seq.max_sequence_idle_microseconds = SEQUENCE_IDLE_DEFAULT_US
        if seq.HasField("oldest") and not seq.oldest.preferred_batch_size and mbs > 0:
            seq.oldest.preferred_batch_size.append(mbs)
    if not config.HasField("ensemble_scheduling"):
        opt = config.optimization
        if not opt.HasField("input_pinned_memory"):
            opt.input_pinned_memory.enable = True
        if not opt.HasField("output_pinned_memory"):
            opt.output_pinned_memory.enable = True


def _normalize_instance_group(
    config: model_config_pb2.ModelConfig, gpu_ids: tuple[int, ...]
) -> None:
    """Default instance groups (NormalizeInstanceGroup) for a server with ``gpu_ids``."""
    if config.HasField("ensemble_scheduling"):
        return
    kinds = _pb.ModelInstanceGroup
    supported = set(gpu_ids)
    if not config.instance_group:
        # NOTE: the backends' "preferred groups" (python: KIND_GPU on GPU builds, else
        # KIND_CPU) resolve to the same kind as KIND_AUTO below, so none are modelled.
        config.instance_group.add(name=config.name)
    for index, group in enumerate(config.instance_group):
        if not group.name:
            group.name = f"{config.name}_{index}"
        if group.kind == kinds.KIND_AUTO:
            if not supported or any(g not in supported for g in group.gpus):
                group.kind = kinds.KIND_CPU
            else:
                group.kind = kinds.KIND_GPU
        if group.count < 1:
            group.count = 1
            if group.kind == kinds.KIND_CPU and config.backend in (
                ONNXRUNTIME_BACKEND,
                _TF_BACKEND,
            ):
                group.count = 2
        if group.kind == kinds.KIND_GPU and not group.gpus:
            group.gpus.extend(sorted(supported))


# ---------------------------------------------------------------------------
# Validation (core model_config_utils.cc)
# ---------------------------------------------------------------------------


def _validate_model_config(config: model_config_pb2.ModelConfig) -> None:
    """Model-level checks (ValidateModelConfig); inputs/outputs are checked separately.

    Raises:
        ConfigError: the first rule broken, with Triton's message.
    """
    name = config.name
    if not name:
        raise ConfigError("model configuration must specify 'name'")
    if not config.backend:
        if config.platform != ENSEMBLE_PLATFORM:
            raise ConfigError(f"unexpected platform type '{config.platform}' for {name}")
    elif config.platform == ENSEMBLE_PLATFORM:
        raise ConfigError(
            f"Ensemble model '{name}' must have platform type '{config.platform}' and empty "
            "backend type"
        )
    if config.backend in _TYPED_BACKENDS and (
        _BACKEND_OF_PLATFORM.get(config.platform) != config.backend
    ):
        raise ConfigError(
            f"unexpected 'platform' and 'backend' pair, got:{config.platform}, {config.backend}"
        )
    if config.max_batch_size < 0:
        raise ConfigError(f"'max_batch_size' must be non-negative value for {name}")
    if not config.HasField("version_policy"):
        raise ConfigError(f"must specify 'version policy' for {name}")

    if config.HasField("dynamic_batching"):
        _validate_dynamic_batching(config)
    if config.HasField("sequence_batching"):
        _validate_sequence_batching(config)

    if config.HasField("ensemble_scheduling"):
        _validate_ensemble_scheduling(config)
    elif config.platform == ENSEMBLE_PLATFORM:
        raise ConfigError(
            f"ensemble scheduling must be set for ensemble {name} whose platform is "
            f"{ENSEMBLE_PLATFORM}"
        )

    if config.model_transaction_policy.decoupled and config.response_cache.enable:
        raise ConfigError(
            f"Response Cache does not currently support model {name} with 'decoupled' "
            "transaction policy. Please disable the response cache."
        )
    if config.HasField("model_metrics"):
        for control in config.model_metrics.metric_control:
            if not control.HasField("metric_identifier"):
                raise ConfigError("metric control must specify 'metric_identifier'")
            if not control.metric_identifier.family:
                raise ConfigError("metric identifier must specify non-empty 'family'")
            if not control.HasField("histogram_options"):
                raise ConfigError("metric control must specify 'histogram_options'")
            if not control.histogram_options.buckets:
                raise ConfigError("histogram options must specify non-empty 'buckets'")


def _validate_dynamic_batching(config: model_config_pb2.ModelConfig) -> None:
    name = config.name
    db = config.dynamic_batching
    for size in db.preferred_batch_size:
        if size <= 0:
            raise ConfigError(f"dynamic batching preferred size must be positive for {name}")
        if size > config.max_batch_size:
            raise ConfigError(
                f"dynamic batching preferred size must be <= max batch size for {name}"
            )
    levels = db.priority_levels
    if levels != 0:
        if db.default_priority_level == 0 or db.default_priority_level > levels:
            raise ConfigError(f"default priority level must be in range [1, {levels}] for {name}")
        for level in db.priority_queue_policy:
            if level == 0 or level > levels:
                raise ConfigError(
                    "priority queue policy must have priority level in range "
                    f"[1, {levels}] for {name}"
                )
    if db.preserve_ordering:
        if levels > 1:
            raise ConfigError(
                f"Only one priority level is allowed when 'preserve_ordering' is true for {name}"
            )
        policies = [db.default_queue_policy, *db.priority_queue_policy.values()]
        for policy in policies:
            if (
                policy.default_timeout_microseconds != 0
                and policy.timeout_action == _pb.ModelQueuePolicy.DELAY
            ):
                raise ConfigError(
                    "Queue policy can not have DELAY as timeout action when "
                    f"'preserve_ordering' is true for {name}"
                )


_Control = _pb.ModelSequenceBatching.Control


def _validate_sequence_batching(config: model_config_pb2.ModelConfig) -> None:
    name = config.name
    seq = config.sequence_batching
    if config.response_cache.enable:
        raise ConfigError(
            f"Response Cache does not currently support model {name} with sequence "
            "batching scheduler. Please disable the response cache."
        )
    for kind in (
        _Control.CONTROL_SEQUENCE_START,
        _Control.CONTROL_SEQUENCE_END,
        _Control.CONTROL_SEQUENCE_READY,
    ):
        _check_sequence_control(seq, name, kind, typed=False)
    corrid_type = _check_sequence_control(seq, name, _Control.CONTROL_SEQUENCE_CORRID, typed=True)
    allowed = (_pb.TYPE_UINT64, _pb.TYPE_INT64, _pb.TYPE_UINT32, _pb.TYPE_INT32, _pb.TYPE_STRING)
    if corrid_type is not None and corrid_type not in allowed:
        raise ConfigError(
            f"unexpected data type for control CONTROL_SEQUENCE_CORRID for {name}. Allowed "
            "data types are TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING"
        )
    if seq.HasField("oldest"):
        for size in seq.oldest.preferred_batch_size:
            if size <= 0:
                raise ConfigError(
                    f"sequence batching preferred batch size must be positive for {name}"
                )
            if size > config.max_batch_size:
                raise ConfigError(
                    f"sequence batching preferred batch size must be <= max batch size for {name}"
                )
    if seq.HasField("direct"):
        utilization = seq.direct.minimum_slot_utilization
        if utilization < 0.0 or utilization > 1.0:
            raise ConfigError(
                f"sequence batching minimum slot utilization must be in range (0.0, 1.0] for {name}"
            )


def _check_sequence_control(
    seq: model_config_pb2.ModelSequenceBatching, model: str, kind: int, *, typed: bool
) -> int | None:
    """Check one control kind (Get{Boolean,Typed}SequenceControlProperties).

    Returns the control's data type when ``typed`` and the control is present, else None.
    """
    kind_name = _Control.Kind.Name(kind)
    seen_tensors: set[str] = set()
    found: int | None = None
    seen = False
    for control_input in seq.control_input:
        if not control_input.name:
            raise ConfigError(f"sequence batching control tensor must have a name for {model}")
        if control_input.name in seen_tensors:
            raise ConfigError(
                f"sequence batching control tensor '{control_input.name}' is specified for "
                f"multiple control kinds for {model}"
            )
        seen_tensors.add(control_input.name)
        for control in control_input.control:
            if control.kind != kind:
                continue
            if seen:
                raise ConfigError(
                    f"sequence batching specifies multiple {kind_name} tensors for {model}"
                )
            seen = True
            given = [
                bool(control.int32_false_true),
                bool(control.fp32_false_true),
                bool(control.bool_false_true),
            ]
            if typed:
                found = int(control.data_type)
                if any(given):
                    raise ConfigError(
                        "sequence batching must not specify either 'int32_false_true', "
                        f"'fp32_false_true' or 'bool_false_true' for {kind_name} for {model}"
                    )
                continue
            if not any(given):
                raise ConfigError(
                    "sequence batching must specify either 'int32_false_true', "
                    f"'fp32_false_true' or 'bool_false_true' for {kind_name} for {model}"
                )
            if sum(given) > 1:
                raise ConfigError(
                    "sequence batching specifies more than one from 'int32_false_true', "
                    f"'fp32_false_true' and 'bool_false_true' for {kind_name} for {model}"
                )
            for field, values in (
                ("int32_false_true", control.int32_false_true),
                ("fp32_false_true", control.fp32_false_true),
                ("bool_false_true", control.bool_false_true),
            ):
                if values and len(values) != 2:
                    raise ConfigError(
                        f"sequence batching control '{field}' must have exactly 2 entries for "
                        f"{kind_name} for {model}"
                    )
    return found


def _validate_ensemble_scheduling(config: model_config_pb2.ModelConfig) -> None:
    """ValidateEnsembleSchedulingConfig: placement rules and the data flow of the steps."""
    name = config.name
    if config.platform != ENSEMBLE_PLATFORM:
        raise ConfigError(
            f"ensemble scheduling cannot be set for model '{name}' whose platform is not "
            f"{ENSEMBLE_PLATFORM}"
        )
    if config.instance_group:
        raise ConfigError(f"instance group should not be specified for ensemble '{name}'")
    if config.HasField("optimization"):
        raise ConfigError(f"optimization should not be specified for ensemble '{name}'")
    if config.model_warmup:
        raise ConfigError(f"model_warmup can not be specified for ensemble '{name}'")
    steps = config.ensemble_scheduling.step
    if not steps:
        raise ConfigError(f"must specify 'step' for ensemble '{name}'")

    # tensor name -> [is written by a step, producers' inputs, consumers]
    written: dict[str, bool] = {}
    prev: dict[str, list[str]] = {}
    nxt: dict[str, list[str]] = {}
    for index, step in enumerate(steps):
        for field in ("model_name", "input_map", "output_map"):
            if not getattr(step, field):
                raise ConfigError(f"must specify '{field}' in step {index} of ensemble '{name}'")
        outputs: list[str] = []
        for tensor in step.output_map.values():
            if written.get(tensor):
                raise ConfigError(
                    f"ensemble tensor '{tensor}' can appear in an output map only once for "
                    f"ensemble '{name}' step {index}"
                )
            written[tensor] = True
            prev.setdefault(tensor, [])
            nxt.setdefault(tensor, [])
            outputs.append(tensor)
        # NOTE: input_map is a proto map, so a model input cannot be mapped twice here.
        for tensor in step.input_map.values():
            written.setdefault(tensor, False)
            prev.setdefault(tensor, [])
            nxt.setdefault(tensor, [])
            for out in outputs:
                prev[out].append(tensor)
                nxt[tensor].append(out)

    ready: set[str] = set()
    queue: list[str] = []
    for model_input in config.input:
        if model_input.name not in written:
            raise ConfigError(
                f"ensemble input '{model_input.name}' for ensemble {name}' is not used"
            )
        ready.add(model_input.name)
        queue.append(model_input.name)
    while queue:
        node = queue.pop(0)
        for candidate in nxt[node]:
            if candidate not in ready and all(p in ready for p in prev[candidate]):
                ready.add(candidate)
                queue.append(candidate)
    outputs_seen: set[str] = set()
    for model_output in config.output:
        tensor = model_output.name
        if tensor not in written:
            raise ConfigError(f"ensemble output '{tensor}' for ensemble {name}' is not used")
        if tensor not in ready:
            message = f"output '{tensor}' for ensemble '{name}' is not written"
            source = _first_unready_source(tensor, prev, ready)
            if source != tensor:
                message += f": at least one of its depending tensors, '{source}', is not connected"
            raise ConfigError(message)
        outputs_seen.add(tensor)
    for tensor in sorted(written):
        if tensor in outputs_seen:
            continue
        if tensor not in ready or not nxt[tensor]:
            raise ConfigError(f"ensemble tensor '{tensor}' is unused in ensemble '{name}'")


def _first_unready_source(tensor: str, prev: dict[str, list[str]], ready: set[str]) -> str:
    last = tensor
    seen: set[str] = set()
    nodes = prev[tensor]
    while nodes:
        following: list[str] = []
        for node in nodes:
            if node not in ready and node not in seen:
                seen.add(node)
                last = node
                following = prev[node]
                break
        nodes = following
    return last


def _validate_model_io_config(config: model_config_pb2.ModelConfig) -> None:
    """Input/output checks (ValidateModelIOConfig); messages end with " for <model>".

    Raises:
        ConfigError: the first rule broken.
    """
    suffix = f" for {config.name}"
    try:
        seen: set[str] = set()
        for model_input in config.input:
            _validate_io_shape(model_input, config.max_batch_size, "model input ")
            if model_input.name in seen:
                raise ConfigError(f"model input '{model_input.name}' is specified more than once")
            seen.add(model_input.name)
            if (
                model_input.format
                in (
                    _pb.ModelInput.FORMAT_NHWC,
                    _pb.ModelInput.FORMAT_NCHW,
                )
                and len(model_input.dims) != 3
            ):
                raise ConfigError("model input NHWC/NCHW require 3 dims")
            _validate_trt_only_io(model_input, config.platform, "input")
        seen = set()
        for model_output in config.output:
            _validate_io_shape(model_output, config.max_batch_size, "model output ")
            if model_output.name in seen:
                raise ConfigError(f"model output '{model_output.name}' is specified more than once")
            seen.add(model_output.name)
            _validate_trt_only_io(model_output, config.platform, "output")
        _validate_batch_io(config)
    except ConfigError as exc:
        raise ConfigError(exc.message + suffix) from None


def _validate_trt_only_io(io: Any, platform: str, io_type: str) -> None:
    if platform != TENSORRT_PLATFORM and io.is_shape_tensor:
        raise ConfigError("shape tensors are only supported for TensorRT platform")
    if io.is_non_linear_format_io:
        if platform != TENSORRT_PLATFORM:
            raise ConfigError("Non-linear IO format is only supported for the TensorRT platform")
        if len(io.dims) != 3:
            raise ConfigError(f"Non-linear IO format {io_type} requires 3 dims")


def _element_count(dims: Iterable[int]) -> int:
    """Triton's GetElementCount: -1 if any dim is a wildcard, 0 for no dims, else product."""
    count = 0
    for dim in dims:
        if dim == _WILDCARD_DIM:
            return _WILDCARD_DIM
        count = dim if count == 0 else count * dim
    return count


def _segment_counts(dims: Iterable[int]) -> list[int]:
    """Element counts of the runs of fixed dims between wildcards."""
    counts: list[int] = []
    current = 1
    for dim in dims:
        if dim == _WILDCARD_DIM:
            counts.append(current)
            current = 1
        else:
            current *= dim
    counts.append(current)
    return counts


def _validate_io_shape(io: Any, max_batch_size: int, prefix: str) -> None:
    """ValidateIOShape for one ModelInput or ModelOutput."""
    if not io.name:
        raise ConfigError(prefix + "must specify 'name'")
    prefix = f"{prefix}'{io.name}' "
    if io.data_type == _pb.TYPE_INVALID:
        raise ConfigError(prefix + "must specify 'data_type'")
    if not io.dims:
        raise ConfigError(prefix + "must specify 'dims'")
    has_reshape = io.HasField("reshape")
    if has_reshape and not io.reshape.shape and max_batch_size == 0:
        raise ConfigError(
            prefix + "cannot have empty reshape for non-batching model as scalar tensors are "
            "not supported"
        )
    for dim in io.dims:
        if dim < 1 and dim != _WILDCARD_DIM:
            raise ConfigError(
                prefix + f"dimension must be integer >= 1, or {_WILDCARD_DIM} to indicate a "
                "variable-size dimension"
            )
    if not has_reshape:
        return
    for dim in io.reshape.shape:
        if dim < 1 and dim != _WILDCARD_DIM:
            raise ConfigError(
                prefix + f"reshape dimensions must be integer >= 1, or {_WILDCARD_DIM} to "
                "indicate a variable-size dimension"
            )
    dims_size = _element_count(io.dims)
    reshape_size = _element_count(io.reshape.shape)
    if dims_size != reshape_size and (reshape_size != 0 or dims_size != 1):
        raise ConfigError(prefix + "has different size for dims and reshape")
    if dims_size == _WILDCARD_DIM:
        dim_counts = _segment_counts(io.dims)
        reshape_counts = _segment_counts(io.reshape.shape)
        if len(dim_counts) != len(reshape_counts):
            raise ConfigError(
                prefix + "has different number of variable-size dimensions for dims and reshape"
            )
        if dim_counts != reshape_counts:
            raise ConfigError(prefix + "has different size for dims and reshape")


def _validate_batch_io(config: model_config_pb2.ModelConfig) -> None:
    """ValidateBatchIO: batch_input / batch_output sources and targets."""
    input_names = {i.name for i in config.input}
    output_names = {o.name for o in config.output}
    for batch_input in config.batch_input:
        kind_name = _pb.BatchInput.Kind.Name(batch_input.kind)
        if len(batch_input.source_input) != 1:
            raise ConfigError(
                f"batch input kind '{kind_name}' expects 1 source input, got "
                f"{len(batch_input.source_input)}"
            )
        if batch_input.data_type not in (_pb.TYPE_INT32, _pb.TYPE_FP32):
            raise ConfigError("batch input data type must be TYPE_INT32 or TYPE_FP32")
        for source in batch_input.source_input:
            if source not in input_names:
                raise ConfigError(f"unknown source input name '{source}'")
    for batch_output in config.batch_output:
        kind_name = _pb.BatchOutput.Kind.Name(batch_output.kind)
        if len(batch_output.source_input) != 1:
            raise ConfigError(
                f"batch output kind '{kind_name}' expects 1 source input, got "
                f"{len(batch_output.source_input)}"
            )
        for source in batch_output.source_input:
            if source not in input_names:
                raise ConfigError(f"unknown source input name '{source}'")
        targets: set[str] = set()
        for target in batch_output.target_name:
            if target not in output_names:
                raise ConfigError(f"unknown target output name '{target}'")
            if target in targets:
                raise ConfigError(f"target output name '{target}' can only be specified once")
            targets.add(target)


def _validate_instance_group(
    config: model_config_pb2.ModelConfig, gpu_ids: tuple[int, ...]
) -> None:
    """ValidateInstanceGroup after normalisation, for a server with ``gpu_ids``."""
    if config.HasField("ensemble_scheduling"):
        return
    name = config.name
    kinds = _pb.ModelInstanceGroup
    if not config.instance_group:
        raise ConfigError(f"must specify one or more 'instance group's for {name}")
    supported = set(gpu_ids)
    for group in config.instance_group:
        where = f"instance group {group.name} of model {name}"
        if group.kind == kinds.KIND_MODEL:
            if group.gpus:
                raise ConfigError(f"{where} has kind KIND_MODEL but specifies one or more GPUs")
        elif group.kind == kinds.KIND_GPU:
            if not group.gpus:
                if not supported:
                    raise ConfigError(f"{where} has kind KIND_GPU but no GPUs are available")
                raise ConfigError(f"{where} has kind KIND_GPU but specifies no GPUs")
            for gpu in group.gpus:
                if gpu not in supported:
                    listed = ", ".join(str(g) for g in sorted(supported))
                    raise ConfigError(
                        f"{where} specifies invalid or unsupported gpu id {gpu}. GPUs with at "
                        "least the minimum required CUDA compute compatibility of "
                        f"{MIN_COMPUTE_CAPABILITY:.6f} are: {listed}"
                    )
        elif group.kind == kinds.KIND_CPU:
            if group.gpus:
                raise ConfigError(f"{where} has kind KIND_CPU but specifies one or more GPUs")
        else:
            raise ConfigError(f"{where} has unexpected kind KIND_AUTO")
        if group.profile:
            if config.platform != TENSORRT_PLATFORM:
                raise ConfigError(
                    f"{where} and platform {config.platform} specifies profile field which is "
                    "only supported for TensorRT models"
                )
            for profile in group.profile:
                _check_profile(profile, where, config.platform)


def _check_profile(profile: str, where: str, platform: str) -> None:
    """A TensorRT optimisation profile must be a non-negative integer (GetProfileIndex)."""
    if not profile:
        raise ConfigError("profile name must not be empty")
    # NOTE: Triton parses with std::stoi, which skips leading blanks and ignores trailing text.
    match = re.match(r"\s*([+-]?[0-9]+)", profile)
    if match is None:
        raise ConfigError(f"unable to parse '{profile}': stoi")
    if int(match.group(1)) < 0:
        raise ConfigError(
            f"{where} and platform {platform} specifies invalid profile {profile}. The field "
            "should contain the string representation of a non-negative integer."
        )


# ---------------------------------------------------------------------------
# Python auto-complete (the model's own TritonPythonModel.auto_complete_config)
# ---------------------------------------------------------------------------


def _auto_complete_python(config: model_config_pb2.ModelConfig, model_file: Path) -> None:
    """Let the model's ``auto_complete_config`` complete ``config``, in a child process.

    The supervisor never runs user code: ``workers.python_autocomplete`` imports model.py in
    a throwaway interpreter, as Triton does. A model without ``auto_complete_config`` leaves
    the config as it is.

    Raises:
        ConfigError: the model's code raised or timed out, or the config it returned does not
            parse or renames the model or changes its backend.
    """
    # NOTE: imported lazily; the module is small, but only python models need it.
    from triton_mp.workers.python_autocomplete import may_auto_complete, run_auto_complete

    if not may_auto_complete(model_file):
        return
    name = config.name
    completed = run_auto_complete(config_to_json(config), model_file, name)
    if completed is None:
        return
    new = _ModelConfig()
    try:
        json_format.ParseDict(completed, new)
    except json_format.ParseError as exc:
        raise ConfigError(
            f"failed to load '{name}': auto_complete_config returned an invalid model "
            f"configuration: {exc}"
        ) from None
    if new.name != config.name or new.backend != config.backend:
        raise ConfigError(
            f"failed to load '{name}': auto_complete_config must not change the model's name "
            f"or backend (got name '{new.name}', backend '{new.backend}')"
        )
    config.CopyFrom(new)


# ---------------------------------------------------------------------------
# ONNX auto-complete (onnxruntime_backend ModelState::AutoCompleteConfig)
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _GraphTensor:
    """One graph input or output as the ORT backend sees it: dims use -1 for unknown."""

    name: str
    data_type: int
    dims: tuple[int, ...]


def _read_onnx_signature(
    path: Path, model_name: str
) -> tuple[list[_GraphTensor], list[_GraphTensor]]:
    """Read the graph inputs (minus initializers) and outputs of an ONNX file.

    Raises:
        ConfigError: the file cannot be read or a tensor has a type the config cannot express.
    """
    import onnx  # NOTE: imported lazily; only ONNX auto-complete needs it.

    if path.is_dir():  # a directory model.onnx/ holds model.onnx plus external data
        path = path / ONNXRUNTIME_FILENAME
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:
        raise ConfigError(
            f"unable to load model '{model_name}': failed to read ONNX model '{path}' for "
            f"auto-complete: {flatten_exception(exc)}"
        ) from exc
    if not model.HasField("graph"):
        raise ConfigError(
            f"unable to load model '{model_name}': ONNX model '{path}' holds no graph"
        )
    graph = model.graph
    initializers = {init.name for init in graph.initializer}

    def convert(value_info: Any, io_kind: str) -> _GraphTensor:
        where = f"{io_kind} '{value_info.name}' of model '{model_name}'"
        if value_info.type.WhichOneof("value") != "tensor_type":
            raise ConfigError(f"autofill failed for model '{model_name}': {where} is not a tensor")
        tensor_type = value_info.type.tensor_type
        data_type = _ONNX_TO_CONFIG_DTYPE.get(tensor_type.elem_type)
        if data_type is None:
            type_name = onnx.TensorProto.DataType.Name(tensor_type.elem_type)
            raise ConfigError(
                f"autofill failed for model '{model_name}': unsupported ONNX data type "
                f"{type_name} for {where}"
            )
        dims = tuple(
            d.dim_value if d.HasField("dim_value") else _WILDCARD_DIM for d in tensor_type.shape.dim
        )
        return _GraphTensor(value_info.name, int(data_type), dims)

    inputs = [convert(v, "input") for v in graph.input if v.name not in initializers]
    outputs = [convert(v, "output") for v in graph.output]
    return inputs, outputs


def _auto_complete_onnx(
    config: model_config_pb2.ModelConfig, model_file: Path, default_max_batch_size: int
) -> None:
    """Complete inputs, outputs, max_batch_size and dynamic batching from the ONNX graph.

    Raises:
        ConfigError: the graph cannot be read, the config names a tensor the graph lacks, or
            max_batch_size > 0 for a model whose tensors have no dynamic first dimension.
    """
    name = config.name
    graph_inputs, graph_outputs = _read_onnx_signature(model_file, name)
    graph_in = {t.name: t for t in graph_inputs}
    graph_out = {t.name: t for t in graph_outputs}

    for model_input in config.input:
        if model_input.name and model_input.name not in graph_in:
            allowed = ", ".join(sorted(graph_in))
            raise ConfigError(
                f"unable to load model '{name}': unexpected inference input "
                f"'{model_input.name}', allowed inputs are: {allowed}"
            )
    for model_output in config.output:
        if model_output.name and model_output.name not in graph_out:
            allowed = ", ".join(sorted(graph_out))
            raise ConfigError(
                f"unable to load model '{name}': unexpected inference output "
                f"'{model_output.name}', allowed outputs are: {allowed}"
            )

    can_batch = all(t.dims and t.dims[0] == _WILDCARD_DIM for t in graph_inputs + graph_outputs)
    full_rank = any(
        _config_rank(io) == len(graph[io.name].dims)
        for ios, graph in ((config.input, graph_in), (config.output, graph_out))
        for io in ios
        if io.name in graph and _config_rank(io) is not None
    )
    if can_batch:
        if config.max_batch_size == 0 and not full_rank:
            config.max_batch_size = max(default_max_batch_size, 0)
            log.warning(
                "autofilled max_batch_size to %d for model '%s' since batching is supported "
                "but no max_batch_size is specified in model configuration. Must specify "
                "max_batch_size to utilize autofill with a larger max batch size",
                config.max_batch_size,
                name,
            )
        if config.max_batch_size > 1 and config.WhichOneof("scheduling_choice") is None:
            config.dynamic_batching.SetInParent()
    elif config.max_batch_size != 0:
        raise ConfigError(
            f"autofill failed for model '{name}': model does not support batching while "
            "non-zero max_batch_size is specified"
        )

    batching = config.max_batch_size > 0
    # Graph inputs the scheduler feeds (sequence controls, implicit state, batch inputs)
    # are not client inputs, so they are never added to config.input.
    internal = {c.name for c in config.sequence_batching.control_input}
    internal.update(s.input_name for s in config.sequence_batching.state)
    for batch_input in config.batch_input:
        internal.update(batch_input.target_name)
    state_outputs = {s.output_name for s in config.sequence_batching.state}

    _complete_ios(config.input, graph_inputs, internal, batching)
    _complete_ios(config.output, graph_outputs, state_outputs, batching)


def _config_rank(io: Any) -> int | None:
    """The rank the backend sees for a config IO (reshape wins over dims); None if unknown."""
    if io.HasField("reshape"):
        return len(io.reshape.shape)
    if io.dims:
        return len(io.dims)
    return None


def _complete_ios(ios: Any, graph: list[_GraphTensor], skip: set[str], batching: bool) -> None:
    """Fill missing data_type/dims of listed IOs and append the graph's unlisted ones."""
    listed = {io.name: io for io in ios}
    for tensor in graph:
        io = listed.get(tensor.name)
        if io is None:
            if tensor.name in skip:
                continue
            io = ios.add(name=tensor.name)
        if io.data_type == _pb.TYPE_INVALID:
            io.data_type = tensor.data_type
        if not io.dims and not io.HasField("reshape"):
            dims = tensor.dims[1:] if batching else tensor.dims
            if dims:
                io.dims.extend(dims)
            else:
                # A scalar (per batch item) is written as dims [1] + empty reshape; the empty
                # reshape is only valid for a batching model.
                io.dims.append(1)
                if batching:
                    io.reshape.SetInParent()
