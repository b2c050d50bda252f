"""What every frontend transport does, whatever the wire: the one place gRPC and HTTP call.

Imported by the frontend only; imports neither ``grpc`` nor ``aiohttp``. ``FrontendCore``
resolves models, validates requests (``frontend.validation``), writes inputs into the
frontend's arena, sends the descriptor to the scheduler, awaits the worker's answer, cancels
requests whose client went away, and answers health, metadata, configuration, repository,
statistics and system shared memory queries. Answers are ``inference.*`` protos (the KServe v2
data model both transports share) or plain values; failures raise ``TritonMPError`` with
Triton's code and message. ``frontend.servicer`` (gRPC) and ``frontend.http`` (HTTP/REST)
only translate their wire format to these calls and map ``ErrorCode`` to their status codes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NoReturn

from triton_mp import __version__
from triton_mp._proto import grpc_service_pb2 as pb
from triton_mp._proto import model_config_pb2 as mc
from triton_mp.common.errors import ErrorCode, InvalidRequest, TritonMPError
from triton_mp.frontend.control import SupervisorLink
from triton_mp.frontend.inference import Inference
from triton_mp.frontend.models import Model, ModelTable
from triton_mp.frontend.pending import PendingTable
from triton_mp.frontend.shm import Region, SystemShmRegistry
from triton_mp.ipc import ArenaAllocator, SegmentCache, encode
from triton_mp.ipc.messages import (
    ModelLoadCall,
    ModelUnloadCall,
    ShmRegion,
    ShmRegistered,
    ShmUnregistered,
    StatsQuery,
    StatsReply,
)
from triton_mp.ipc.reports import ModelStats, StatDuration

log = logging.getLogger(__name__)

EXTENSIONS = (
    "model_repository",
    "model_configuration",
    "system_shared_memory",
    "binary_tensor_data",
    "statistics",
)
"""Extensions ServerMetadata reports: only those triton-mp implements (Triton's names, in
Triton's order). ``binary_tensor_data`` is the HTTP binary tensor extension."""

CONTROL_DISABLED_MESSAGE = "explicit model load / unload is not allowed if polling is enabled"
"""Triton's UNAVAILABLE answer to load/unload outside ``--model-control-mode=explicit``."""

FILE_PREFIX = "file:"
"""RepositoryModelLoad parameters carrying model files: ``file:<version>/<name>``."""

CUDA_SHM_MESSAGE = "CUDA shared memory is not supported by this server"
"""UNSUPPORTED answer of every CUDA shared memory call: triton-mp has no GPU build yet."""


def _parameter_type(value: object) -> str:
    """TRITONSERVER_ParameterTypeString of a parameter value."""
    if isinstance(value, bool):
        return "BOOL"
    if isinstance(value, int):
        return "INT"
    if isinstance(value, bytes | bytearray):
        return "BYTES"
    return "STRING"


def _duration(d: StatDuration) -> pb.StatisticDuration:
    return pb.StatisticDuration(count=d.count, ns=d.ns)


def stats_to_proto(st: ModelStats) -> pb.ModelStatistics:
    """Convert the scheduler's ModelStats to ``inference.ModelStatistics``."""
    return pb.ModelStatistics(
        name=st.name,
        version=str(st.version),
        last_inference=st.last_inference_ms,
        inference_count=st.inference_count,
        execution_count=st.execution_count,
        inference_stats=pb.InferStatistics(
            success=_duration(st.success),
            fail=_duration(st.fail),
            queue=_duration(st.queue),
            compute_input=_duration(st.compute_input),
            compute_infer=_duration(st.compute_infer),
            compute_output=_duration(st.compute_output),
            cache_hit=pb.StatisticDuration(),
            cache_miss=pb.StatisticDuration(),
        ),
        batch_stats=[
            pb.InferBatchStatistics(
                batch_size=b.batch_size,
                compute_input=_duration(b.compute_input),
                compute_infer=_duration(b.compute_infer),
                compute_output=_duration(b.compute_output),
            )
            for _, b in sorted(st.batch_stats.items())
        ],
    )


class FrontendCore:
    """The KServe v2 / Triton operations of one frontend process, transport-neutral.

    Args:
        frontend_id: this frontend's index (every request descriptor's ``reply_to``).
        server_name: ``--id``, reported by ServerMetadata.
        models: the model table.
        arena: this frontend's input arena allocator.
        cache: attached arenas (ours and the workers').
        pending: the table of requests waiting for answers.
        send_scheduler: pushes encoded bytes to the scheduler.
        shm: the registered client shared-memory regions.
        send_peers: pushes encoded bytes to every other frontend (registrations of client
            shared memory, so that any frontend can serve a request naming a region).
        model_control_mode: ``none``, ``poll`` or ``explicit``.
        link: the control pipe to the supervisor (repository load/unload).
        repository: the model repository directory (RepositoryIndex lists its models).

    Attributes:
        inference: the submit path (``Inference.submit``) and the drain.
    """

    def __init__(
        self,
        *,
        frontend_id: int,
        server_name: str,
        models: ModelTable,
        arena: ArenaAllocator,
        cache: SegmentCache,
        pending: PendingTable,
        send_scheduler: Callable[[bytes], None],
        shm: SystemShmRegistry | None = None,
        model_control_mode: str = "none",
        link: SupervisorLink | None = None,
        repository: str = "",
        send_peers: Callable[[bytes], None] = lambda data: None,
    ) -> None:
        self.shm = shm if shm is not None else SystemShmRegistry(frontend_id)
        self.models = models
        self._fid = frontend_id
        self._server_name = server_name
        self._pending = pending
        self._send = send_scheduler
        self._send_peers = send_peers
        self._mode = model_control_mode
        self._link = link
        self._repository = Path(repository) if repository else None
        self.inference = Inference(
            frontend_id=frontend_id,
            models=models,
            shm=self.shm,
            arena=arena,
            cache=cache,
            pending=pending,
            send_scheduler=send_scheduler,
        )

    # ------------------------------------------------------------------ health
    def server_ready(self) -> bool:
        """KServe ServerReady: every model ready (Triton's --strict-readiness), not draining."""
        return self.models.all_ready() and not self.inference.draining

    def model_ready(self, name: str, version: str) -> bool:
        """KServe ModelReady: the version (with none given, the latest) is ready and has a
        live instance; an unknown model or version is simply not ready.

        Raises:
            InvalidRequest: ``version`` is not a non-negative integer.
        """
        try:
            model, v = self.models.resolve(name, version)
        except InvalidRequest:
            raise
        except TritonMPError:
            return False
        return self.models.has_live_instance(model.name, v) and not self.inference.draining

    # ---------------------------------------------------------------- metadata
    def server_metadata(self) -> pb.ServerMetadataResponse:
        """KServe ServerMetadata: name (``--id``), version, extensions."""
        return pb.ServerMetadataResponse(
            name=self._server_name, version=__version__, extensions=list(EXTENSIONS)
        )

    def resolve(self, name: str, version: str) -> tuple[Model, int]:
        """The model and concrete version a request names ("" = latest ready).

        Raises:
            TritonMPError: NOT_FOUND, UNAVAILABLE or INVALID_ARG with Triton's message
                (``ModelTable.resolve``).
        """
        return self.models.resolve(name, version)

    def model_metadata(self, name: str, version: str) -> pb.ModelMetadataResponse:
        """KServe ModelMetadata (shape = [-1] + dims when the model batches).

        Raises:
            TritonMPError: as ``resolve``.
        """
        model, v = self.models.resolve(name, version)
        batch = [-1] if model.max_batch_size > 0 else []
        versions = [str(v)] if version else [str(x) for x in model.ready_versions]
        return pb.ModelMetadataResponse(
            name=model.name,
            versions=versions,
            platform=model.platform,
            inputs=[
                pb.ModelMetadataResponse.TensorMetadata(
                    name=t.name, datatype=t.datatype, shape=batch + list(t.dims)
                )
                for t in model.inputs.values()
            ],
            outputs=[
                pb.ModelMetadataResponse.TensorMetadata(
                    name=t.name, datatype=t.datatype, shape=batch + list(t.dims)
                )
                for t in model.outputs.values()
            ],
        )

    def model_config(self, name: str, version: str) -> mc.ModelConfig:
        """Triton ModelConfig: the effective (auto-completed, normalised) configuration.

        Raises:
            TritonMPError: as ``resolve``.
        """
        model, _ = self.models.resolve(name, version)
        return model.config

    # -------------------------------------------------------------- repository
    def repository_index(self, ready_only: bool) -> pb.RepositoryIndexResponse:
        """Triton RepositoryIndex: every model and version with its state and reason.

        Loaded versions are READY (UNLOADING while an unload or reload stops them), failed
        ones UNAVAILABLE with their reason; a model being loaded is LOADING, an unloaded one
        UNAVAILABLE ("unloaded"), and a model of the repository never loaded appears with
        its name only.

        Args:
            ready_only: list READY versions only (the request's ``ready`` flag).
        """
        Index = pb.RepositoryIndexResponse.ModelIndex  # noqa: N806 - a proto class
        out: list[tuple[str, int, pb.RepositoryIndexResponse.ModelIndex]] = []
        seen: set[str] = set()
        for m in self.models:
            seen.add(m.name)
            ready_state = "UNLOADING" if m.transition == "UNLOADING" else "READY"
            for v in m.ready_versions:
                if ready_only and ready_state != "READY":
                    continue
                out.append((m.name, v, Index(name=m.name, version=str(v), state=ready_state)))
            if ready_only:
                continue
            for v in m.failed_versions:
                out.append(
                    (
                        m.name,
                        v,
                        Index(
                            name=m.name,
                            version=str(v),
                            state="UNAVAILABLE",
                            reason=m.version_reason(v),
                        ),
                    )
                )
            if not m.ready_versions and not m.failed_versions:
                state = m.transition or "UNAVAILABLE"
                out.append((m.name, -1, Index(name=m.name, state=state, reason=m.reason)))
        if not ready_only:
            for name, reason in self.models.unloaded().items():
                seen.add(name)
                out.append((name, -1, Index(name=name, state="UNAVAILABLE", reason=reason)))
            for name in self._repository_names() - seen:
                out.append((name, -1, Index(name=name)))
        out.sort(key=lambda t: (t[0], t[1]))
        return pb.RepositoryIndexResponse(models=[t[2] for t in out])

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

    @staticmethod
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

    def _check_control(self) -> SupervisorLink:
        if self._mode != "explicit" or self._link is None:
            raise TritonMPError(CONTROL_DISABLED_MESSAGE, ErrorCode.UNAVAILABLE)
        return self._link

    async def repository_load(self, name: str, parameters: Mapping[str, object]) -> None:
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
        if files and config is None:
            raise InvalidRequest(
                f"failed to load '{name}': the 'config' parameter is required when model "
                "files are provided"
            )
        await link.call(
            lambda cid: ModelLoadCall(call_id=cid, model=name, config_json=config, files=files)
        )

    async def repository_unload(self, name: str, unload_dependents: bool) -> None:
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

    # ------------------------------------------------------- shared memory
    def shm_register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Triton SystemSharedMemoryRegister: name a window of a client's POSIX shm object
        and tell the other frontends (on this frontend's rings to them).

        Raises:
            TritonMPError: as ``SystemShmRegistry.register``.
        """
        r = self.shm.register(name, key, offset, byte_size)
        self._send_peers(
            encode(
                ShmRegistered(
                    frontend_id=self._fid,
                    regions=(ShmRegion(r.name, r.key, r.offset, r.byte_size, r.region_id),),
                )
            )
        )

    def shm_status(self, name: str) -> list[Region]:
        """Triton SystemSharedMemoryStatus: every region, or the one named.

        Raises:
            TritonMPError: as ``SystemShmRegistry.status``.
        """
        return self.shm.status(name)

    def shm_unregister(self, name: str) -> None:
        """Triton SystemSharedMemoryUnregister: one region, or all when ``name`` is empty.

        Raises:
            TritonMPError: UNSUPPORTED when client shared memory is disabled.
        """
        names = self.shm.unregister(name)
        if names:
            self._send_peers(encode(ShmUnregistered(frontend_id=self._fid, names=tuple(names))))

    @staticmethod
    def cuda_shm() -> NoReturn:
        """Every CUDA shared memory call (status, register, unregister).

        Raises:
            TritonMPError: always UNSUPPORTED: no GPU build.
        """
        raise TritonMPError(CUDA_SHM_MESSAGE, ErrorCode.UNSUPPORTED)

    # -------------------------------------------------------------- statistics
    async def statistics(self, name: str, version: str) -> pb.ModelStatisticsResponse:
        """Triton ModelStatistics, from the scheduler's books (empty name = all models).

        Raises:
            TritonMPError: INVALID_ARG for a bad version string, a model that is not
                available ("requested model '<m>' is not available"), or a version without
                a model name.
            asyncio.CancelledError: the caller went away (the query is forgotten).
        """
        v = -1
        if name:
            try:
                _, resolved = self.models.resolve(name, version)
            except InvalidRequest:
                raise
            except TritonMPError:
                raise InvalidRequest(f"requested model '{name}' is not available") from None
            v = resolved if version else -1
        elif version:
            raise InvalidRequest("model version given without a model name")
        qid, fut = self._pending.new_query()
        self._send(encode(StatsQuery(query_id=qid, frontend_id=self._fid, model=name, version=v)))
        try:
            reply = await fut
        except asyncio.CancelledError:
            self._pending.forget_query(qid)
            raise
        assert isinstance(reply, StatsReply)
        return pb.ModelStatisticsResponse(model_stats=[stats_to_proto(s) for s in reply.stats])
