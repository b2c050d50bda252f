"""KServe v2 / Triton ``inference.GRPCInferenceService`` over grpc.aio.

Imported by the frontend only; the only module that maps ``ErrorCode`` to gRPC status codes
(server ``grpc_utils.cc``). Handlers translate protos to descriptors and back; they never
batch or run models.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import NoReturn

import grpc

from triton_mp import __version__
from triton_mp._proto import grpc_service_pb2 as pb
from triton_mp._proto import grpc_service_pb2_grpc as pb_grpc
from triton_mp._proto import health_pb2, health_pb2_grpc
from triton_mp.errors import ErrorCode, InvalidRequest, TritonMPError
from triton_mp.frontend.models import Model, ModelTable
from triton_mp.frontend.pending import PendingTable
from triton_mp.frontend.shm import SystemShmRegistry
from triton_mp.frontend.tensors import validate_request, write_inputs
from triton_mp.ipc import ArenaAllocator, SegmentCache, encode
from triton_mp.ipc.messages import (
    CancelRequest,
    InferRequest,
    InferResponse,
    ModelStats,
    ShmRegion,
    ShmRegistered,
    ShmUnregistered,
    StatDuration,
    StatsQuery,
    StatsReply,
)

log = logging.getLogger(__name__)

GRPC_STATUS = {
    ErrorCode.UNKNOWN: grpc.StatusCode.UNKNOWN,
    ErrorCode.INTERNAL: grpc.StatusCode.INTERNAL,
    ErrorCode.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorCode.INVALID_ARG: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.UNSUPPORTED: grpc.StatusCode.UNIMPLEMENTED,
    ErrorCode.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    ErrorCode.CANCELLED: grpc.StatusCode.CANCELLED,
    ErrorCode.DEADLINE_EXCEEDED: grpc.StatusCode.DEADLINE_EXCEEDED,
    ErrorCode.RESOURCE_EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
}
"""Triton error code -> gRPC status (server/src/grpc/grpc_utils.cc)."""

EXTENSIONS = ("model_repository", "model_configuration", "system_shared_memory", "statistics")
"""Extensions ServerMetadata reports: only those triton-mp implements (Triton's names)."""


async def _abort(context: grpc.aio.ServicerContext, code: ErrorCode, message: str) -> NoReturn:
    await context.abort(GRPC_STATUS.get(code, grpc.StatusCode.UNKNOWN), message)
    raise AssertionError("unreachable")  # context.abort raises


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


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """The RPCs of ``inference.GRPCInferenceService`` that triton-mp serves.

    Args:
        frontend_id: this frontend's index (part of every request descriptor).
        server_name: ``--id``, reported by ServerMetadata.
        models: the model table.
        arena: this frontend's input arena allocator.
        cache: attached arenas (ours and the workers').
        pending: the table of requests waiting for answers.
        send_scheduler: pushes encoded bytes to the scheduler.
        shm: the registered client shared-memory regions.
        model_control_mode: ``none``, ``poll`` or ``explicit``.
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
    ) -> None:
        self._shm = shm if shm is not None else SystemShmRegistry(frontend_id)
        self._fid = frontend_id
        self._server_name = server_name
        self._models = models
        self._arena = arena
        self._cache = cache
        self._pending = pending
        self._send = send_scheduler
        self._mode = model_control_mode
        self.draining = False

    # ------------------------------------------------------------------ health
    async def ServerLive(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """KServe ServerLive: true while the process serves."""
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """KServe ServerReady: every model ready (Triton's --strict-readiness) and not draining."""
        return pb.ServerReadyResponse(ready=self._models.all_ready() and not self.draining)

    async def ModelReady(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """KServe ModelReady: the version (or, with none given, any version) is ready."""
        try:
            model, version = self._models.resolve(request.name, request.version)
        except InvalidRequest as e:
            await _abort(context, e.code, e.message)
        except TritonMPError:
            return pb.ModelReadyResponse(ready=False)
        live = self._models.has_live_instance(model.name, version)
        return pb.ModelReadyResponse(ready=live and not self.draining)

    # ---------------------------------------------------------------- metadata
    async def ServerMetadata(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """KServe ServerMetadata: name (--id), version, extensions."""
        return pb.ServerMetadataResponse(
            name=self._server_name, version=__version__, extensions=list(EXTENSIONS)
        )

    async def _model_or_abort(self, context, name: str, version: str) -> tuple[Model, int]:  # type: ignore[no-untyped-def]
        try:
            return self._models.resolve(name, version)
        except TritonMPError as e:
            await _abort(context, e.code, e.message)

    async def ModelMetadata(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """KServe ModelMetadata (shape = [-1] + dims when the model batches)."""
        model, version = await self._model_or_abort(context, request.name, request.version)
        batch = [-1] if model.max_batch_size > 0 else []
        versions = [str(version)] if request.version else [str(v) for v in model.ready_versions]
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

    async def ModelConfig(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """Triton ModelConfig: the effective (auto-completed, normalised) configuration."""
        model, _ = await self._model_or_abort(context, request.name, request.version)
        return pb.ModelConfigResponse(config=model.config)

    async def RepositoryIndex(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """Triton RepositoryIndex: every model and version with its state and reason."""
        out = []
        for m in self._models:
            for v in m.ready_versions:
                out.append(
                    pb.RepositoryIndexResponse.ModelIndex(
                        name=m.name, version=str(v), state="READY"
                    )
                )
            if request.ready:
                continue
            for v in m.failed_versions:
                out.append(
                    pb.RepositoryIndexResponse.ModelIndex(
                        name=m.name, version=str(v), state="UNAVAILABLE", reason=m.reason
                    )
                )
            if not m.ready_versions and not m.failed_versions:
                out.append(
                    pb.RepositoryIndexResponse.ModelIndex(
                        name=m.name, state="UNAVAILABLE", reason=m.reason
                    )
                )
        return pb.RepositoryIndexResponse(models=out)

    async def RepositoryModelLoad(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """Load/unload needs --model-control-mode=explicit (Triton's message otherwise)."""
        await _abort(
            context,
            ErrorCode.UNAVAILABLE,
            "explicit model load / unload is not allowed if polling is enabled"
            if self._mode != "explicit"
            else "explicit model load / unload is not implemented by triton-mp yet",
        )

    RepositoryModelUnload = RepositoryModelLoad

    # --------------------------------------------------------------- inference
    async def ModelInfer(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """KServe ModelInfer: validate, copy inputs to shared memory, await the worker."""
        if self.draining:
            await _abort(
                context,
                ErrorCode.UNAVAILABLE,
                "Server is stopping, scheduler for model has stopped accepting new inference "
                "requests",
            )
        try:
            model, version = self._models.resolve(request.model_name, request.model_version)
            valid = validate_request(request, model, version, self._shm)
            if model.config.model_transaction_policy.decoupled:
                raise InvalidRequest(
                    "ModelInfer RPC doesn't support models with decoupled transaction policy",
                    ErrorCode.UNSUPPORTED,
                )
            block, refs = write_inputs(self._arena, valid)
        except TritonMPError as e:
            await _abort(context, e.code, e.message)
        preserve = model.config.dynamic_batching.preserve_ordering
        rid, fut = self._pending.new_request(block, (model.name, version) if preserve else None)
        desc = InferRequest(
            request_id=rid,
            frontend_id=self._fid,
            model=model.name,
            version=version,
            batch_size=valid.batch_size,
            inputs=refs,
            outputs=valid.outputs,
            block=block,
            arrival_ns=time.monotonic_ns(),
            priority=valid.priority,
            timeout_us=valid.timeout_us,
            client_id=request.id,
            output_regions=valid.output_regions,
            parameters_json=valid.parameters_json,
        )
        try:
            self._send(encode(desc))
        except TritonMPError as e:
            self._pending.forget_request(rid)
            await _abort(context, e.code, e.message)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "request %d accepted for '%s' version %d (batch size %d)",
                rid,
                model.name,
                version,
                valid.batch_size,
            )
        try:
            answer = await fut
        except asyncio.CancelledError:
            # NOTE: the client cancelled or its deadline passed: a request still queued is
            # dropped by the scheduler instead of running for nobody.
            self._send(
                encode(
                    CancelRequest(
                        request_id=rid, frontend_id=self._fid, model=model.name, version=version
                    )
                )
            )
            raise
        if not isinstance(answer, InferResponse) or answer.error is not None:
            err = answer.error
            assert err is not None
            await _abort(context, err.code, err.message)
        resp = pb.ModelInferResponse(
            model_name=model.name, model_version=str(answer.version), id=request.id
        )
        raw = resp.raw_output_contents
        for ref in answer.outputs:
            out = resp.outputs.add()
            out.name = ref.name
            out.datatype = ref.datatype
            out.shape.extend(ref.shape)
            if ref.region_id:
                # NOTE: already in the client's shared memory; Triton sends an empty entry.
                raw.append(b"")
                continue
            buf = self._cache.get(ref.segment).buf
            raw.append(buf[ref.offset : ref.offset + ref.nbytes])
        self._pending.free(answer.block)
        return resp

    # ------------------------------------------------------- shared memory
    async def SystemSharedMemoryRegister(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """Triton SystemSharedMemoryRegister: name a window of a client's POSIX shm object."""
        try:
            r = self._shm.register(request.name, request.key, request.offset, request.byte_size)
        except TritonMPError as e:
            await _abort(context, e.code, e.message)
        self._send(
            encode(
                ShmRegistered(
                    frontend_id=self._fid,
                    regions=(ShmRegion(r.name, r.key, r.offset, r.byte_size, r.region_id),),
                )
            )
        )
        return pb.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryStatus(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """Triton SystemSharedMemoryStatus: every region, or the one named."""
        try:
            regions = self._shm.status(request.name)
        except TritonMPError as e:
            await _abort(context, e.code, e.message)
        resp = pb.SystemSharedMemoryStatusResponse()
        for r in regions:
            resp.regions[r.name].CopyFrom(
                pb.SystemSharedMemoryStatusResponse.RegionStatus(
                    name=r.name, key=r.key, offset=r.offset, byte_size=r.byte_size
                )
            )
        return resp

    async def SystemSharedMemoryUnregister(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """Triton SystemSharedMemoryUnregister: one region, or all when the name is empty."""
        try:
            names = self._shm.unregister(request.name)
        except TritonMPError as e:
            await _abort(context, e.code, e.message)
        if names:
            self._send(encode(ShmUnregistered(frontend_id=self._fid, names=tuple(names))))
        return pb.SystemSharedMemoryUnregisterResponse()

    async def CudaSharedMemoryRegister(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """CUDA shared memory needs a GPU build; this server has none (UNIMPLEMENTED)."""
        await _abort(
            context, ErrorCode.UNSUPPORTED, "CUDA shared memory is not supported by this server"
        )

    CudaSharedMemoryStatus = CudaSharedMemoryRegister
    CudaSharedMemoryUnregister = CudaSharedMemoryRegister

    # ------------------------------------------------------- not served yet
    async def ModelStreamInfer(self, request_iterator, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """Streaming inference (sequences, decoupled models) is not served yet."""
        await _abort(
            context, ErrorCode.UNSUPPORTED, "ModelStreamInfer is not supported by triton-mp yet"
        )

    async def TraceSetting(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """Tracing is not served (the 'trace' extension is not reported)."""
        await _abort(
            context, ErrorCode.UNSUPPORTED, "trace settings are not supported by triton-mp"
        )

    async def LogSettings(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """Log settings over the protocol are not served (the 'logging' extension)."""
        await _abort(context, ErrorCode.UNSUPPORTED, "log settings are not supported by triton-mp")

    # -------------------------------------------------------------- statistics
    async def ModelStatistics(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """Triton ModelStatistics, from the scheduler's books (empty name = all models)."""
        version = -1
        if request.name:
            try:
                model, v = self._models.resolve(request.name, request.version)
            except InvalidRequest as e:
                await _abort(context, e.code, e.message)
            except TritonMPError:
                await _abort(
                    context,
                    ErrorCode.INVALID_ARG,
                    f"requested model '{request.name}' is not available",
                )
            version = v if request.version else -1
        elif request.version:
            await _abort(context, ErrorCode.INVALID_ARG, "model version given without a model name")
        qid, fut = self._pending.new_query()
        self._send(
            encode(
                StatsQuery(query_id=qid, frontend_id=self._fid, model=request.name, version=version)
            )
        )
        try:
            reply = await fut
        except asyncio.CancelledError:
            self._pending.forget_query(qid)
            raise
        assert isinstance(reply, StatsReply)
        return pb.ModelStatisticsResponse(model_stats=[stats_to_proto(s) for s in reply.stats])


class HealthServicer(health_pb2_grpc.HealthServicer):  # type: ignore[misc]
    """``grpc.health.v1.Health/Check``: SERVING iff the server is ready (as Triton)."""

    def __init__(self, inference: InferenceServicer, models: ModelTable) -> None:
        self._inference = inference
        self._models = models

    async def Check(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """SERVING when every model is ready and the server is not draining."""
        ready = self._models.all_ready() and not self._inference.draining
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if ready
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        return health_pb2.HealthCheckResponse(status=status)
