"""The one table of backends triton-mp knows (``BACKENDS``), read by every role that asks.

- the model-config loader refuses a model whose ``backend`` has no row (the supported
  backends) and runs the row's auto-complete hook (Triton's backend-side
  ``TRITONBACKEND_ModelAutoCompleteConfig`` step);
- the planner refuses a row without a worker loader (a config triton-mp checks but cannot run
  yet: TensorRT);
- the worker builds its instance through ``load_backend``.

Loaders and hooks are named as ``"module:attribute"`` and imported on first use, so importing
this module loads no backend library (onnxruntime, onnx, numpy stay out of the supervisor
until a model needs them). Triton's names: core ``constants.h``.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from triton_mp.common.errors import ConfigError, ErrorCode
from triton_mp.ipc.protocol.specs import BackendCapabilities

if TYPE_CHECKING:
    from triton_mp._proto.model_config_pb2 import ModelConfig
    from triton_mp.backends.base import Backend
    from triton_mp.ipc.protocol.specs import InstanceSpec, ModelVersionSpec

__all__ = ["BACKENDS", "AutoComplete", "AutoCompleteOptions", "BackendInfo", "load_backend"]


@dataclass(frozen=True)
class AutoCompleteOptions:
    """Server settings a backend's auto-complete may use.

    Attributes:
        default_max_batch_size: max_batch_size given to a batchable model whose config leaves
            it 0 (``--backend-config=<backend>,default-max-batch-size``; Triton's default 4).
    """

    default_max_batch_size: int


class AutoComplete(Protocol):
    """A backend's auto-complete: completes ``config`` in place from the model's artifact.

    Called by the loader only when auto-complete is on, after the server-side fields are
    filled and the versions chosen, with the newest loadable version's model file.

    Raises:
        ConfigError: the artifact cannot be read or contradicts the config.
    """

    def __call__(
        self, config: ModelConfig, model_file: Path, options: AutoCompleteOptions
    ) -> None: ...


class BackendFactory(Protocol):
    """A backend class: one instance per model instance a worker serves."""

    def __call__(self, model: ModelVersionSpec, instance: InstanceSpec) -> Backend: ...


@dataclass(frozen=True)
class BackendInfo:
    """One backend triton-mp knows.

    Attributes:
        name: the config ``backend`` value (``"onnxruntime"``).
        platforms: the config ``platform`` values of this backend, Triton's names; the first
            is the one auto-complete writes. Empty: the backend takes any platform (python).
        default_model_filename: the artifact in a version directory
            (config ``default_model_filename`` when the config gives none).
        loader: ``"module:Class"`` of the worker's ``Backend``; empty when triton-mp checks
            this backend's configs but has no worker for it yet.
        auto_complete: ``"module:function"`` of its ``AutoComplete`` hook; empty for none.
        requires: the import name of the optional package its worker needs (``torch``,
            ``tensorrt``); empty: none beyond triton-mp's own dependencies.
        extra: the ``pip install triton-mp[<extra>]`` that brings ``requires``.
        capabilities: what it can do beyond executing batches (BLS, custom metrics,
            ``is_cancelled()`` during execute, an ``is_ready()`` hook); the roles read these
            from the model's spec, never the backend's name.
        unacted_parameters: config ``parameters`` keys Triton's backend of this name acts on
            and triton-mp's does not, each logged at load with ``unacted_reason``.
    """

    name: str
    platforms: tuple[str, ...]
    default_model_filename: str
    loader: str = ""
    auto_complete: str = ""
    requires: str = ""
    extra: str = ""
    capabilities: BackendCapabilities = BackendCapabilities()
    unacted_parameters: frozenset[str] = frozenset()
    unacted_reason: str = ""

    def missing(self) -> str:
        """Why this backend cannot run here ("" when it can): its optional package is not
        installed. Found without importing it, so the supervisor loads no torch."""
        if not self.requires or importlib.util.find_spec(self.requires) is not None:
            return ""
        how = f" (pip install 'triton-mp[{self.extra}]')" if self.extra else ""
        return f"the {self.name} backend needs the '{self.requires}' package{how}"

    @property
    def runs(self) -> bool:
        """Whether a worker can serve this backend's models."""
        return bool(self.loader)

    def backend_class(self) -> BackendFactory:
        """Import and return the worker's backend class (``loader`` must be set)."""
        factory: BackendFactory = _resolve(self.loader)
        return factory

    def auto_complete_hook(self) -> AutoComplete | None:
        """Import and return the auto-complete hook; None when the backend has none."""
        if not self.auto_complete:
            return None
        hook: AutoComplete = _resolve(self.auto_complete)
        return hook


BACKENDS: Mapping[str, BackendInfo] = {
    info.name: info
    for info in (
        BackendInfo(
            "onnxruntime",
            ("onnxruntime_onnx",),
            "model.onnx",
            loader="triton_mp.backends.onnxruntime.backend:OnnxRuntimeBackend",
            auto_complete="triton_mp.backends.onnxruntime.autocomplete:auto_complete",
        ),
        BackendInfo(
            "python",
            (),
            "model.py",
            loader="triton_mp.backends.python.backend:PythonBackend",
            auto_complete="triton_mp.backends.python.autocomplete:auto_complete",
            capabilities=BackendCapabilities(
                bls=True, custom_metrics=True, cancellation_watch=True, readiness_hook=True
            ),
            # NOTE: every other key reaches the model's args['model_config'].
            unacted_parameters=frozenset({"EXECUTION_ENV_PATH"}),
            unacted_reason="custom python execution environments are not supported; the "
            "server's own interpreter runs the model",
        ),
        BackendInfo(
            "pytorch",
            ("pytorch_libtorch",),
            "model.pt",
            loader="triton_mp.backends.pytorch.backend:TorchBackend",
            auto_complete="triton_mp.backends.pytorch.autocomplete:auto_complete",
            requires="torch",
            extra="torch",
        ),
        # NOTE: configs are checked (Triton's TensorRT rules) but no worker runs them yet.
        BackendInfo("tensorrt", ("tensorrt_plan",), "model.plan"),
    )
}
"""Backend name -> its row: the backends triton-mp supports. Any other fails to load."""


def load_backend(model: ModelVersionSpec, instance: InstanceSpec) -> Backend:
    """Construct the backend named by the model's effective config, for one instance.

    Raises:
        ConfigError (UNSUPPORTED): a backend triton-mp has no worker for.
    """
    info = BACKENDS.get(model.backend)
    if info is None or not info.runs:
        raise ConfigError(
            f"backend '{model.backend}' of model '{model.model}' is not supported by triton-mp",
            ErrorCode.UNSUPPORTED,
        )
    return info.backend_class()(model, instance)


def _resolve(path: str) -> Any:
    """The attribute ``"module:attribute"`` names, importing the module."""
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)
