"""KServe v2 / Triton ``inference.GRPCInferenceService`` over grpc.aio: a thin adapter.

Imported by the frontend only; the only module that maps ``ErrorCode`` to gRPC status codes
(server ``grpc_utils.cc``). Each RPC hands its request to ``frontend.core.FrontendCore``
(which HTTP/REST calls too) and turns the answer or the ``TritonMPError`` into gRPC; no
handler batches, validates or runs anything itself.
"""

from __future__ import annotations

import asyncio
from typing import NoReturn

import grpc

from triton_mp._proto import grpc_service_pb2 as pb
from triton_mp._proto import grpc_service_pb2_grpc as pb_grpc
from triton_mp._proto import health_pb2, health_pb2_grpc
from triton_mp.errors import ErrorCode, TritonMPError
from triton_mp.frontend.core import (
    EXTENSIONS,
    FrontendCore,
    InferResult,
    Submitted,
    stats_to_proto,
)

__all__ = ["EXTENSIONS", "GRPC_STATUS", "HealthServicer", "InferenceServicer", "stats_to_proto"]

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

DECOUPLED_MESSAGE = "ModelInfer RPC doesn't support models with decoupled transaction policy"
STREAM_DECOUPLED_MESSAGE = "decoupled models are not supported by triton-mp yet"


def _infer_response(result: InferResult) -> pb.ModelInferResponse:
    """The wire form of an answer; releases the answer's output block."""
    try:
        resp = pb.ModelInferResponse(
            model_name=result.model, model_version=str(result.version), id=result.request_id
        )
        raw = resp.raw_output_contents
        for ref in result.outputs:
            out = resp.outputs.add()
            out.name = ref.name
            out.datatype = ref.datatype
            out.shape.extend(ref.shape)
            # NOTE: an output in the client's shared memory gets an empty entry (Triton).
            raw.append(result.data(ref))
    finally:
        result.release()
    return resp


def _stream_error(message: str, submitted: Submitted) -> pb.ModelStreamInferResponse:
    """A stream response carrying one request's error (the stream goes on)."""
    return pb.ModelStreamInferResponse(
        error_message=message,
        infer_response=pb.ModelInferResponse(
            model_name=submitted.model,
            model_version=str(submitted.version),
            id=submitted.client_id,
        ),
    )


"""Triton's UNIMPLEMENTED answer to ModelInfer on a decoupled model."""


async def _abort(context: grpc.aio.ServicerContext, code: ErrorCode, message: str) -> NoReturn:
    await context.abort(GRPC_STATUS.get(code, grpc.StatusCode.UNKNOWN), message)
    raise AssertionError("unreachable")  # context.abort raises


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """The RPCs of ``inference.GRPCInferenceService`` that triton-mp serves.

    Args:
        core: the frontend's transport-neutral operations.
    """

    def __init__(self, core: FrontendCore) -> None:
        self._core = core

    # ------------------------------------------------------------------ health
    async def ServerLive(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """KServe ServerLive: true while the process serves."""
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """KServe ServerReady: every model ready (Triton's --strict-readiness) and not draining."""
        return pb.ServerReadyResponse(ready=self._core.server_ready())

    async def ModelReady(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """KServe ModelReady: the version (or, with none given, any version) is ready."""
        try:
            return pb.ModelReadyResponse(
                ready=self._core.model_ready(request.name, request.version)
            )
        except TritonMPError as e:
            await _abort(context, e.code, e.message)

    # ---------------------------------------------------------------- metadata
    async def ServerMetadata(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """KServe ServerMetadata: name (--id), version, extensions."""
        return self._core.server_metadata()

    async def ModelMetadata(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """KServe ModelMetadata (shape = [-1] + dims when the model batches)."""
        try:
            return self._core.model_metadata(request.name, request.version)
        except TritonMPError as e:
            await _abort(context, e.code, e.message)

    async def ModelConfig(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """Triton ModelConfig: the effective (auto-completed, normalised) configuration."""
        try:
            return pb.ModelConfigResponse(
                config=self._core.model_config(request.name, request.version)
            )
        except TritonMPError as e:
            await _abort(context, e.code, e.message)

    async def RepositoryIndex(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """Triton RepositoryIndex: every model and version with its state and reason."""
        return self._core.repository_index(request.ready)

    async def RepositoryModelLoad(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """Load/unload needs --model-control-mode=explicit (Triton's message otherwise)."""
        try:
            self._core.repository_control()
        except TritonMPError as e:
            await _abort(context, e.code, e.message)

    RepositoryModelUnload = RepositoryModelLoad

    # --------------------------------------------------------------- inference
    async def ModelInfer(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """KServe ModelInfer: validate, copy inputs to shared memory, await the worker."""
        try:
            result = await self._core.infer(request, decoupled_message=DECOUPLED_MESSAGE)
        except TritonMPError as e:
            await _abort(context, e.code, e.message)
        return _infer_response(result)

    async def ModelStreamInfer(self, request_iterator, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """Triton's bidirectional stream: one response (or ``error_message``) per request.

        Requests are submitted in the order they arrive, so the requests of a sequence reach
        the sequence batcher in order; responses leave as they complete. An invalid request
        gets an ``error_message`` and the stream goes on, as in Triton. Decoupled models are
        refused (their backend is not served).
        """
        out: asyncio.Queue[pb.ModelStreamInferResponse | None] = asyncio.Queue()
        waiting: set[asyncio.Task[None]] = set()

        async def answer(submitted: Submitted) -> None:
            try:
                result = await self._core.finish(submitted)
            except TritonMPError as e:
                out.put_nowait(_stream_error(e.message, submitted))
                return
            out.put_nowait(pb.ModelStreamInferResponse(infer_response=_infer_response(result)))

        async def read() -> None:
            async for request in request_iterator:
                try:
                    submitted = self._core.submit(
                        request, decoupled_message=STREAM_DECOUPLED_MESSAGE
                    )
                except TritonMPError as e:
                    out.put_nowait(
                        pb.ModelStreamInferResponse(
                            error_message=e.message,
                            infer_response=pb.ModelInferResponse(
                                model_name=request.model_name,
                                model_version=request.model_version,
                                id=request.id,
                            ),
                        )
                    )
                    continue
                task = asyncio.create_task(answer(submitted))
                waiting.add(task)
                task.add_done_callback(waiting.discard)
            while waiting:
                await asyncio.gather(*list(waiting))
            out.put_nowait(None)

        reader = asyncio.create_task(read())
        try:
            while (item := await out.get()) is not None:
                yield item
            await reader
        finally:
            reader.cancel()
            for task in list(waiting):
                task.cancel()

    # ------------------------------------------------------- shared memory
    async def SystemSharedMemoryRegister(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """Triton SystemSharedMemoryRegister: name a window of a client's POSIX shm object."""
        try:
            self._core.shm_register(request.name, request.key, request.offset, request.byte_size)
        except TritonMPError as e:
            await _abort(context, e.code, e.message)
        return pb.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryStatus(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """Triton SystemSharedMemoryStatus: every region, or the one named."""
        try:
            regions = self._core.shm_status(request.name)
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
            self._core.shm_unregister(request.name)
        except TritonMPError as e:
            await _abort(context, e.code, e.message)
        return pb.SystemSharedMemoryUnregisterResponse()

    async def CudaSharedMemoryRegister(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """CUDA shared memory needs a GPU build; this server has none (UNIMPLEMENTED)."""
        try:
            self._core.cuda_shm()
        except TritonMPError as e:
            await _abort(context, e.code, e.message)

    CudaSharedMemoryStatus = CudaSharedMemoryRegister
    CudaSharedMemoryUnregister = CudaSharedMemoryRegister

    # ------------------------------------------------------- not served yet
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
        try:
            return await self._core.statistics(request.name, request.version)
        except TritonMPError as e:
            await _abort(context, e.code, e.message)


class HealthServicer(health_pb2_grpc.HealthServicer):  # type: ignore[misc]
    """``grpc.health.v1.Health/Check``: SERVING iff the server is ready (as Triton)."""

    def __init__(self, core: FrontendCore) -> None:
        self._core = core

    async def Check(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """SERVING when every model is ready and the server is not draining."""
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if self._core.server_ready()
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        return health_pb2.HealthCheckResponse(status=status)
