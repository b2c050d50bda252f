"""Server-side auto-complete: name, backend, platform and default_model_filename.

Reproduces core ``AutoCompleteBackendFields`` (model_config_utils.cc): the backend and
platform are inferred from the config's own fields, then from the files of the first
version directory, trying Triton's backends in Triton's order (TensorFlow, TensorRT, ONNX
Runtime, OpenVINO, PyTorch, Python, then a custom ``<name>.<backend>`` directory). It runs
always, auto-complete on or off, as in Triton. The backend-side auto-complete (ONNX graph,
python ``auto_complete_config``) is the backend registry's hook, run by ``loader``.

Backends triton-mp runs take their names from ``backends.registry.BACKENDS``; Triton's other
backends are named here only to be recognised from their files, so that such a model fails
with the unsupported-backend reason rather than "Could not determine backend".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from triton_mp._proto import model_config_pb2
from triton_mp.backends.registry import BACKENDS, BackendInfo
from triton_mp.common.errors import ConfigError

__all__ = ["TF_BACKEND", "TRITON_PLATFORMS", "auto_complete_backend_fields"]

_TENSORRT = BACKENDS["tensorrt"]
_ONNXRUNTIME = BACKENDS["onnxruntime"]
_PYTHON = BACKENDS["python"]

# Triton's backends triton-mp has no row for (core constants.h), and PyTorch's second
# platform (AOTInductor), which the pytorch row does not run.
TF_BACKEND = "tensorflow"
_TF_GRAPHDEF_PLATFORM = "tensorflow_graphdef"
_TF_GRAPHDEF_FILENAME = "model.graphdef"
_TF_SAVEDMODEL_PLATFORM = "tensorflow_savedmodel"
_TF_SAVEDMODEL_FILENAME = "model.savedmodel"
_OPENVINO = BackendInfo("openvino", (), "model.xml")
_PYTORCH = BACKENDS["pytorch"]
_PYTORCH_BACKEND = _PYTORCH.name
_PYTORCH_PLATFORM = _PYTORCH.platforms[0]
_PYTORCH_PLATFORM_ALT = "libtorch"
_PYTORCH_FILENAME = _PYTORCH.default_model_filename
_PYTORCH_AOTI_PLATFORM = "torch_aoti"
_PYTORCH_AOTI_FILENAME = "model.pt2"

TRITON_PLATFORMS: dict[str, str] = {
    _TF_GRAPHDEF_PLATFORM: TF_BACKEND,
    _TF_SAVEDMODEL_PLATFORM: TF_BACKEND,
    _PYTORCH_PLATFORM: _PYTORCH_BACKEND,
    _PYTORCH_AOTI_PLATFORM: _PYTORCH_BACKEND,
}
"""Platform -> backend of Triton's backends triton-mp has no row for (GetBackendTypeFromPlatform;
``libtorch`` is not in it)."""


@dataclass(frozen=True)
class _VersionFiles:
    """The entries of a model's first version directory (by name): name -> is a directory."""

    has_version: bool
    content: dict[str, bool]

    @classmethod
    def of(cls, model_path: Path) -> _VersionFiles:
        subdirs = sorted(p.name for p in model_path.iterdir() if p.is_dir())
        if not subdirs:
            return cls(False, {})
        version_path = model_path / subdirs[0]
        return cls(True, {p.name: p.is_dir() for p in version_path.iterdir()})

    def has_file(self, filename: str) -> bool:
        """A regular file (not a directory) of that name."""
        return filename in self.content and not self.content[filename]

    def has_entry(self, filename: str) -> bool:
        """A file or a directory of that name."""
        return filename in self.content


def auto_complete_backend_fields(
    model_name: str, model_path: Path, config: model_config_pb2.ModelConfig
) -> None:
    """Fill name, backend, platform and default_model_filename (AutoCompleteBackendFields).

    Only the first sub-directory (by name) is inspected for model files, as in Triton.

    Raises:
        ConfigError: no backend can be determined ("Invalid model name: ...").
    """
    files = _VersionFiles.of(model_path)
    if not config.name:
        config.name = model_name
    if _tensorflow(config, files):
        return
    # NOTE: a TensorRT plan must be a file; model.onnx may be a directory for large models.
    if _by_file(config, files, _TENSORRT, regular_file=True):
        return
    if _by_file(config, files, _ONNXRUNTIME) or _by_file(config, files, _OPENVINO):
        return
    if _pytorch(config, files) or _by_file(config, files, _PYTHON):
        return
    _custom(model_name, config)


def _tensorflow(config: model_config_pb2.ModelConfig, files: _VersionFiles) -> bool:
    """TensorFlow: the platform is required, so it is inferred first. True if claimed."""
    filename = config.default_model_filename
    if not config.platform and config.backend in ("", TF_BACKEND):
        if filename == _TF_SAVEDMODEL_FILENAME:
            config.platform = _TF_SAVEDMODEL_PLATFORM
        elif filename == _TF_GRAPHDEF_FILENAME:
            config.platform = _TF_GRAPHDEF_PLATFORM
        elif not filename and files.has_version:
            if files.content.get(_TF_SAVEDMODEL_FILENAME) is True:
                config.platform = _TF_SAVEDMODEL_PLATFORM
            if files.has_file(_TF_GRAPHDEF_FILENAME):
                config.platform = _TF_GRAPHDEF_PLATFORM
    if config.platform not in (_TF_SAVEDMODEL_PLATFORM, _TF_GRAPHDEF_PLATFORM):
        return False
    if not config.backend:
        config.backend = TF_BACKEND
    if not config.default_model_filename:
        config.default_model_filename = (
            _TF_SAVEDMODEL_FILENAME
            if config.platform == _TF_SAVEDMODEL_PLATFORM
            else _TF_GRAPHDEF_FILENAME
        )
    return True


def _by_file(
    config: model_config_pb2.ModelConfig,
    files: _VersionFiles,
    info: BackendInfo,
    *,
    regular_file: bool = False,
) -> bool:
    """A backend known by its platforms and file name. True if it claims the config.

    With no backend given, it is this one when the platform is one of its platforms, the
    default_model_filename is its file, or neither is given and the version directory holds
    its file (a regular file when ``regular_file``, else a file or a directory). Then the
    platform (its first, if it has any) and file name are filled when missing.
    """
    filename = config.default_model_filename
    if not config.backend:
        if regular_file:
            present = files.has_file(info.default_model_filename)
        else:
            present = files.has_entry(info.default_model_filename)
        if (
            config.platform in info.platforms
            or filename == info.default_model_filename
            or (not config.platform and not filename and present)
        ):
            config.backend = info.name
    if config.backend != info.name:
        return False
    if info.platforms and not config.platform:
        config.platform = info.platforms[0]
    if not config.default_model_filename:
        config.default_model_filename = info.default_model_filename
    return True


def _pytorch(config: model_config_pb2.ModelConfig, files: _VersionFiles) -> bool:
    """PyTorch (libtorch and AOTInductor). True if it claims the config."""
    filename = config.default_model_filename
    if not config.backend:
        if config.platform in (
            _PYTORCH_PLATFORM,
            _PYTORCH_PLATFORM_ALT,
            _PYTORCH_AOTI_PLATFORM,
        ) or filename in (_PYTORCH_FILENAME, _PYTORCH_AOTI_FILENAME):
            config.backend = _PYTORCH_BACKEND
        elif not filename and not config.platform and files.has_version:
            if files.has_file(_PYTORCH_FILENAME):
                config.backend = _PYTORCH_BACKEND
                config.platform = _PYTORCH_PLATFORM
            elif files.has_file(_PYTORCH_AOTI_FILENAME):
                config.backend = _PYTORCH_BACKEND
                config.platform = _PYTORCH_AOTI_PLATFORM
    if config.backend != _PYTORCH_BACKEND:
        return False
    if not config.platform:
        config.platform = _PYTORCH_PLATFORM
        if not config.default_model_filename:
            config.default_model_filename = _PYTORCH_FILENAME
    elif config.platform == _PYTORCH_AOTI_PLATFORM and not config.default_model_filename:
        config.default_model_filename = _PYTORCH_AOTI_FILENAME
    return True


def _custom(model_name: str, config: model_config_pb2.ModelConfig) -> None:
    """A custom backend, only when the config says nothing at all: "<x>.<backend>" directory.

    Raises:
        ConfigError: the directory name holds no ``.<backend>``.
    """
    if config.backend or config.platform or config.default_model_filename:
        return
    _, dot, backend = model_name.partition(".")
    if not dot:
        raise ConfigError(
            f"Invalid model name: Could not determine backend for model '{model_name}' "
            "with no backend in model configuration. Expected model name of the form "
            "'model.<backend_name>'."
        )
    config.backend = backend
    config.default_model_filename = f"model.{backend}"
