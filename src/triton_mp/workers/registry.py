"""Backend name -> backend class, imported lazily so a worker loads only its own backend.

Imported by ``workers.main``.
"""

from __future__ import annotations

from triton_mp.common.errors import ConfigError, ErrorCode
from triton_mp.ipc.specs import InstanceSpec, ModelVersionSpec
from triton_mp.workers.backend import Backend

SUPPORTED_BACKENDS = frozenset({"onnxruntime", "python"})
"""Backends a worker can load (config ``backend`` values)."""


def load_backend(model: ModelVersionSpec, instance: InstanceSpec) -> Backend:
    """Construct the backend named by the model's effective config.

    Raises:
        ConfigError (UNSUPPORTED): a backend triton-mp does not provide.
    """
    if model.backend == "onnxruntime":
        from triton_mp.workers.onnxruntime import OnnxRuntimeBackend

        return OnnxRuntimeBackend(model, instance)
    if model.backend == "python":
        from triton_mp.workers.python import PythonBackend

        return PythonBackend(model, instance)
    raise ConfigError(
        f"backend '{model.backend}' of model '{model.model}' is not supported by triton-mp",
        ErrorCode.UNSUPPORTED,
    )
