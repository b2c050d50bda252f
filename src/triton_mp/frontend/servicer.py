"""KServe v2 / Triton ``inference.GRPCInferenceService`` over grpc.aio: a thin adapter.

Imported by the frontend only; the only module that maps ``ErrorCode`` to gRPC status codes
(server ``grpc_utils.cc``). Each RPC hands its request to ``frontend.core.FrontendCore``
(which HTTP/REST calls too) and turns the answer or the ``TritonMPError`` into gRPC; no
handler batches, validates or runs anything itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import NoReturn

import grpc

from triton_mp._proto import grpc_service_pb2 as pb
from triton_mp._proto import grpc_service_pb2_grpc as pb_grpc
from triton_mp._proto import health_pb2, health_pb2_grpc
from triton_mp.common.errors import ErrorCode, TritonMPError
from triton_mp.frontend.core import (
    EXTENSIONS,
    FrontendCore,
    InferResult,
    StreamSubmitted,
    Submitted,
    stats_to_proto,
)
from triton_mp.frontend.grpc.messages import request_from_proto
from triton_mp.frontend.wire import WireInferRequest, infer_response_bytes, split_infer_request
from triton_mp.ipc.messages import InferResponse, RequestFailed

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
"""Triton's UNIMPLEMENTED answer to ModelInfer on a decoupled model."""
FINAL_PARAMETER = "triton_final_response"
"""Stream response parameter: true on the last response of a request (Triton sets it on
every stream response)."""
EMPTY_FINAL_PARAMETER = "triton_enable_empty_final_response"
"""Request parameter: send a decoupled request's flags-only final response as an empty
response (else it is not sent)."""


def _stream_response(result: InferResult, final: bool) -> pb.ModelStreamInferResponse:
    """A stream response with outputs; releases the answer's output block."""
    resp = _infer_response(result)
    resp.parameters[FINAL_PARAMETER].bool_param = final
    return pb.ModelStreamInferResponse(infer_response=resp)


def _response_head(result: InferResult) -> pb.ModelInferResponse:
    """An answer's ModelInferResponse without ``raw_output_contents``."""
    resp = pb.ModelInferResponse(
        model_name=result.model, model_version=str(result.version), id=result.request_id
    )
    for ref in result.outputs:
        out = resp.outputs.add()
        out.name = ref.name
        out.datatype = ref.datatype
        out.shape.extend(ref.shape)
    return resp


def _infer_response(result: InferResult) -> pb.ModelInferResponse:
    """The wire form of an answer; releases the answer's output block."""
    try:
        resp = _response_head(result)
        # NOTE: an output in the client's shared memory gets an empty entry (Triton).
        resp.raw_output_contents.extend(result.data(ref) for ref in result.outputs)
    finally:
        result.release()
    return resp


def _infer_response_bytes(result: InferResult) -> bytes:
    """``_infer_response`` serialized, each output copied once, straight from the arena."""
    try:
        # NOTE: views stay valid until release(), after the join copied them.
        return infer_response_bytes(
            _response_head(result), [result.view(ref) for ref in result.outputs]
        )
    finally:
        result.release()


def add_to_server(servicer: InferenceServicer, server: grpc.aio.Server) -> None:
    """Register ``servicer`` as ``inference.GRPCInferenceService`` on ``server``.

    The generated handlers, except ModelInfer, whose request deserializer keeps tensor bytes
    as views (``wire.split_infer_request``) and whose handler returns serialized bytes.
    """

    class _Capture:
        handlers: dict[str, grpc.RpcMethodHandler] = {}

        def add_generic_rpc_handlers(self, _handlers: object) -> None:
            pass

        def add_registered_method_handlers(
            self, _name: str, handlers: dict[str, grpc.RpcMethodHandler]
        ) -> None:
            self.handlers = dict(handlers)

    capture = _Capture()
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, capture)
    handlers = capture.handlers
    handlers["ModelInfer"] = grpc.unary_unary_rpc_method_handler(
        servicer.ModelInfer, request_deserializer=split_infer_request, response_serializer=None
    )
    service = "inference.GRPCInferenceService"
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
    server.add_registered_method_handlers(service, handlers)


def _stream_error(
    message: str, submitted: Submitted | StreamSubmitted, final: bool = True
) -> pb.ModelStreamInferResponse:
    """A stream response carrying one request's error (the stream goes on)."""
    resp = pb.ModelInferResponse(
        model_name=submitted.model,
        model_version=str(submitted.version),
        id=submitted.client_id,
    )
    resp.parameters[FINAL_PARAMETER].bool_param = final
    return pb.ModelStreamInferResponse(error_message=message, infer_response=resp)


def _wants_empty_final(request: pb.ModelInferRequest) -> bool:
    p = request.parameters.get(EMPTY_FINAL_PARAMETER)
    return p is not None and p.WhichOneof("parameter_choice") == "bool_param" and p.bool_param


MAX_STATUS_MESSAGE_BYTES = 4096
"""Longest error message sent in a gRPC status, in UTF-8 bytes. The message travels in the
``grpc-message`` trailer, percent-encoded (up to 3x), and clients refuse trailers over their
metadata limit (grpc's default: 16 KiB), so a longer one (e.g. quoting a huge request id)
would reach the client as RESOURCE_EXHAUSTED "Stream removed" instead of its own code."""


def status_message(message: str) -> str:
    """``message`` cut to ``MAX_STATUS_MESSAGE_BYTES`` (at a character boundary), with the
    number of bytes left out; shorter messages are returned as they are."""
    data = message.encode()
    if len(data) <= MAX_STATUS_MESSAGE_BYTES:
        return message
    head = data[:MAX_STATUS_MESSAGE_BYTES].decode(errors="ignore")
    return f"{head}... [{len(data) - len(head.encode())} more bytes cut]"


async def _abort(context: grpc.aio.ServicerContext, code: ErrorCode, message: str) -> NoReturn:
    await context.abort(GRPC_STATUS.get(code, grpc.StatusCode.UNKNOWN), status_message(message))
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
        """Triton RepositoryModelLoad (explicit mode): ``config`` and ``file:`` parameters."""
        params = {
            key: getattr(p, p.WhichOneof("parameter_choice") or "string_param")
            for key, p in request.parameters.items()
        }
        try:
            self._core.check_repository_name(request.repository_name)
            await self._core.repository_load(request.model_name, params)
        except TritonMPError as e:
            await _abort(context, e.code, e.message)
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """Triton RepositoryModelUnload (explicit mode), with ``unload_dependents``."""
        dependents = request.parameters.get("unload_dependents")
        try:
            self._core.check_repository_name(request.repository_name)
            await self._core.repository_unload(
                request.model_name, bool(dependents is not None and dependents.bool_param)
            )
        except TritonMPError as e:
            await _abort(context, e.code, e.message)
        return pb.RepositoryModelUnloadResponse()

    # --------------------------------------------------------------- inference
    async def ModelInfer(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """KServe ModelInfer: validate, copy inputs to shared memory, await the worker.

        ``request`` is a ``WireInferRequest`` (the handler ``add_to_server`` registers), whose
        tensor bytes are views into the received message, or a plain ModelInferRequest. The
        answer is the serialized ModelInferResponse (``wire.infer_response_bytes``).
        """
        if isinstance(request, WireInferRequest):
            message, raw = request.request, request.raw or None
        else:
            message, raw = request, None
        try:
            result = await self._core.infer(
                request_from_proto(message, raw), decoupled_message=DECOUPLED_MESSAGE
            )
        except TritonMPError as e:
            await _abort(context, e.code, e.message)
        return _infer_response_bytes(result)

    async def ModelStreamInfer(self, request_iterator, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """Triton's bidirectional stream: per request, one response (or ``error_message``),
        or for a decoupled model zero or more responses then the end of the request.

        Requests are submitted in the order they arrive, so the requests of a sequence reach
        the sequence batcher in order; responses leave as they complete. An invalid request
        gets an ``error_message`` and the stream goes on, as in Triton. Every response
        carries ``triton_final_response``; a decoupled request's flags-only end is sent as an
        empty response only when the request set ``triton_enable_empty_final_response``.
        When the client closes its side, the stream ends after every request's last
        response; when it cancels, running decoupled requests are cancelled
        (``is_cancelled()``) and their remaining responses are dropped.
        """
        out: asyncio.Queue[pb.ModelStreamInferResponse | None] = asyncio.Queue()
        waiting: set[asyncio.Task[None]] = set()
        open_decoupled: dict[int, StreamSubmitted] = {}
        all_ended = asyncio.Event()
        all_ended.set()
        closed = False

        async def answer(submitted: Submitted) -> None:
            try:
                result = await self._core.finish(submitted)
            except TritonMPError as e:
                out.put_nowait(_stream_error(e.message, submitted))
                return
            out.put_nowait(_stream_response(result, True))

        def decoupled_handler(
            empty_final: bool,
        ) -> tuple[list[StreamSubmitted], Callable[[InferResponse | RequestFailed], None]]:
            holder: list[StreamSubmitted] = []

            def on_message(msg: InferResponse | RequestFailed) -> None:
                submitted = holder[0]
                final = isinstance(msg, RequestFailed) or msg.final
                if final:
                    open_decoupled.pop(submitted.request_id, None)
                    if not open_decoupled:
                        all_ended.set()
                if closed:
                    if isinstance(msg, InferResponse):
                        self._core.release_block(msg.block)
                    return
                if isinstance(msg, RequestFailed):
                    out.put_nowait(_stream_error(msg.error.message, submitted))
                elif msg.error is not None:
                    self._core.release_block(msg.block)
                    out.put_nowait(_stream_error(msg.error.message, submitted, final))
                elif msg.empty:
                    self._core.release_block(msg.block)
                    if empty_final:
                        resp = pb.ModelInferResponse(
                            model_name=submitted.model,
                            model_version=str(msg.version),
                            id=submitted.client_id,
                        )
                        resp.parameters[FINAL_PARAMETER].bool_param = True
                        out.put_nowait(pb.ModelStreamInferResponse(infer_response=resp))
                else:
                    result = self._core.result_of(submitted, msg)
                    out.put_nowait(_stream_response(result, final))

            return holder, on_message

        async def read() -> None:
            async for request in request_iterator:
                try:
                    if self._core.is_decoupled(request.model_name, request.model_version):
                        holder, on_message = decoupled_handler(_wants_empty_final(request))
                        sub = self._core.submit_decoupled(request_from_proto(request), on_message)
                        holder.append(sub)
                        open_decoupled[sub.request_id] = sub
                        all_ended.clear()
                        continue
                    submitted = self._core.submit(
                        request_from_proto(request), decoupled_message=DECOUPLED_MESSAGE
                    )
                except TritonMPError as e:
                    resp = pb.ModelInferResponse(
                        model_name=request.model_name,
                        model_version=request.model_version,
                        id=request.id,
                    )
                    resp.parameters[FINAL_PARAMETER].bool_param = True
                    out.put_nowait(
                        pb.ModelStreamInferResponse(error_message=e.message, infer_response=resp)
                    )
                    continue
                task = asyncio.create_task(answer(submitted))
                waiting.add(task)
                task.add_done_callback(waiting.discard)
            while waiting:
                await asyncio.gather(*list(waiting))
            await all_ended.wait()
            out.put_nowait(None)

        reader = asyncio.create_task(read())
        try:
            while (item := await out.get()) is not None:
                yield item
            await reader
        finally:
            closed = True
            reader.cancel()
            for task in list(waiting):
                task.cancel()
            for sub in list(open_decoupled.values()):
                self._core.cancel(sub)

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
