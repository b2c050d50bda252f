"""KServe v2 health and metadata: ServerLive/Ready, ModelReady, Server/ModelMetadata, ModelConfig.

Imported by the frontend only; no transport. Answers are plain values (``ServerMetadata``,
``ModelMetadata``) or the model's effective ``ModelConfig``; ``frontend.kserve`` writes them
as ``inference.*`` protos for gRPC (and HTTP's JSON). Readiness is Triton's: not draining
and, with ``--strict-readiness`` (default true), every model ready.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from triton_mp import __version__
from triton_mp._proto import model_config_pb2 as mc
from triton_mp.common.errors import InvalidRequest, TritonMPError
from triton_mp.frontend.inference import Inference
from triton_mp.frontend.model_table import IOSpec, ModelTable
from triton_mp.frontend.readiness import ReadinessChecks

EXTENSIONS = (
    "classification",
    "sequence",
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
    "model_configuration",
    "system_shared_memory",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "trace",
    "logging",
)
"""Extensions ServerMetadata reports (server ``server.cc``'s list, in Triton 2.51's order):
every one triton-mp implements. ``cuda_shared_memory``, which 2.51 lists, is left out:
regions register, but a request that names one is refused (``frontend.shm.cuda``)."""


@dataclass(frozen=True, slots=True)
class ServerMetadata:
    """KServe ServerMetadataResponse: ``name`` (``--id``), ``version``, ``extensions``."""

    name: str
    version: str
    extensions: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class TensorMetadata:
    """One input or output in ModelMetadataResponse: name, datatype, shape (-1 variable)."""

    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ModelMetadata:
    """KServe ModelMetadataResponse."""

    name: str
    versions: tuple[str, ...]
    platform: str
    inputs: tuple[TensorMetadata, ...]
    outputs: tuple[TensorMetadata, ...]


class ServerApi:
    """Health and metadata of one frontend's server.

    Args:
        server_name: ``--id``, reported by ServerMetadata.
        models: the model table.
        inference: the submit path (whether the server drains).
        strict_readiness: ``--strict-readiness``: ServerReady needs every model ready.
    """

    def __init__(
        self,
        *,
        server_name: str,
        models: ModelTable,
        inference: Inference,
        strict_readiness: bool = True,
        readiness: ReadinessChecks | None = None,
    ) -> None:
        self._server_name = server_name
        self._models = models
        self._inference = inference
        self._strict = strict_readiness
        self._readiness = readiness

    def ready(self) -> bool:
        """KServe ServerReady: not draining and, with ``--strict-readiness`` (the default),
        every model ready (a model unloaded on request is no longer one)."""
        if self._inference.draining:
            return False
        return self._models.all_ready() if self._strict else True

    def model_ready(self, name: str, version: str) -> bool:
        """KServe ModelReady: the version (with none given, the latest) is ready and has a
        live instance; an unknown model or version is simply not ready.

        Raises:
            InvalidRequest: ``version`` is not a non-negative integer.
        """
        try:
            model, v = self._models.resolve(name, version)
        except InvalidRequest:
            raise
        except TritonMPError:
            return False
        return self._models.has_live_instance(model.name, v) and not self._inference.draining

    async def ready_checked(self) -> bool:
        """ServerReady as the endpoints answer it: ``ready()`` and, under strict readiness,
        every ready version of every python model ready by its own ``is_ready()`` (core
        ``InferenceServer::IsReady`` asks each READY model's instances)."""
        if not self.ready():
            return False
        if not self._strict or self._readiness is None:
            return True
        asks = [
            self._readiness.ask(m.name, v)
            for m in self._models
            if m.readiness_hook
            for v in m.ready_versions
        ]
        return all(await asyncio.gather(*asks)) if asks else True

    async def model_ready_checked(self, name: str, version: str) -> bool:
        """ModelReady as the endpoints answer it: ``model_ready`` and, for a python model,
        every live instance's ``is_ready()`` (core ``ModelIsReady`` -> ``Model::IsReady``),
        asked on every check.

        Raises:
            InvalidRequest: ``version`` is not a non-negative integer.
        """
        if not self.model_ready(name, version):
            return False
        model, v = self._models.resolve(name, version)
        if self._readiness is None or not model.readiness_hook:
            return True
        return await self._readiness.ask(model.name, v)

    def metadata(self) -> ServerMetadata:
        """KServe ServerMetadata: name (``--id``), version, extensions."""
        return ServerMetadata(self._server_name, __version__, EXTENSIONS)

    def model_metadata(self, name: str, version: str) -> ModelMetadata:
        """KServe ModelMetadata (shape = [-1] + dims when the model batches).

        Raises:
            TritonMPError: NOT_FOUND, UNAVAILABLE or INVALID_ARG with Triton's message
                (``ModelTable.resolve``).
        """
        model, v = self._models.resolve(name, version)
        batch = (-1,) if model.max_batch_size > 0 else ()

        def tensors(specs: dict[str, IOSpec]) -> tuple[TensorMetadata, ...]:
            return tuple(TensorMetadata(t.name, t.datatype, batch + t.dims) for t in specs.values())

        return ModelMetadata(
            name=model.name,
            versions=(str(v),) if version else tuple(str(x) for x in model.ready_versions),
            platform=model.platform,
            inputs=tensors(model.inputs),
            outputs=tensors(model.outputs),
        )

    def model_config(self, name: str, version: str) -> mc.ModelConfig:
        """Triton ModelConfig: the effective (auto-completed, normalised) configuration.

        Raises:
            TritonMPError: as ``model_metadata``.
        """
        model, _ = self._models.resolve(name, version)
        return model.config
