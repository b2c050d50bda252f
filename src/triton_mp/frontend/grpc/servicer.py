"""KServe v2 / Triton ``inference.GRPCInferenceService`` over grpc.aio: a thin adapter.

Imported by the frontend process (``frontend.main``); the only module that maps ``ErrorCode``
to gRPC status codes (server ``grpc_utils.cc``). Each RPC hands its request to the
transport-free core (``frontend.api.FrontendApi``, which HTTP/REST calls too), converting
protos with ``grpc.messages`` and ``frontend.kserve``, and turns the answer or the
``TritonMPError`` into gRPC; no handler batches, validates or runs anything itself.
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any, NoReturn

import grpc
from google.protobuf.message import DecodeError

from triton_mp._proto import grpc_service_pb2 as pb
from triton_mp._proto import grpc_service_pb2_grpc as pb_grpc
from triton_mp._proto import health_pb2, health_pb2_grpc
from triton_mp.common.errors import ErrorCode, InvalidRequest, TritonMPError
from triton_mp.frontend import kserve
from triton_mp.frontend.admin.repository import check_repository_name
from triton_mp.frontend.api import FrontendApi
from triton_mp.frontend.dispatch.ticket import InferResult, Ticket
from triton_mp.frontend.grpc.messages import (
    ResponseHeads,
    infer_response_bytes,
    request_from_proto,
)
from triton_mp.frontend.grpc.stream import StreamAborted, StreamSession, wants_grpc_error
from triton_mp.frontend.grpc.wire import (
    MALFORMED,
    PARSE_FAILURE,
    Split,
    WireInferRequest,
    split_infer_request,
    split_native,
    tolerant,
)
from triton_mp.frontend.header_forward import HeaderForward
from triton_mp.frontend.inference import Inference
from triton_mp.frontend.tracing.settings import new_setting_from_grpc
from triton_mp.frontend.tracing.tracer import Trace, Tracer
from triton_mp.frontend.validation.log_settings import update_from_grpc

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
    handlers = {name: _parse_checked(h) for name, h in capture.handlers.items()}
    # NOTE: ModelInfer answers MALFORMED itself: one coroutine less per call.
    handlers["ModelInfer"] = grpc.unary_unary_rpc_method_handler(
        servicer.ModelInfer,
        request_deserializer=tolerant(servicer.parse_infer),
        response_serializer=None,
    )
    service = "inference.GRPCInferenceService"
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
    server.add_registered_method_handlers(service, handlers)


def _parse_checked(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """``handler`` with a tolerant deserializer (``wire.tolerant``): a unary request that
    does not parse is answered INTERNAL "Unable to parse request" as grpc C++ answers it; a
    stream gets ``MALFORMED`` as a request (the stream ends there, as Triton's does)."""
    parse = tolerant(handler.request_deserializer)
    if handler.stream_stream is not None:
        return grpc.stream_stream_rpc_method_handler(
            handler.stream_stream, parse, handler.response_serializer
        )
    inner = handler.unary_unary

    async def checked(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if request is MALFORMED:
            await context.abort(grpc.StatusCode.INTERNAL, PARSE_FAILURE)
        return await inner(request, context)

    return grpc.unary_unary_rpc_method_handler(checked, parse, handler.response_serializer)


def load_parameters(request: pb.RepositoryModelLoadRequest) -> dict[str, str | bytes]:
    """RepositoryModelLoad's parameters as server ``grpc_server.cc`` takes them: ``config``
    a ``string_param``, ``file:<path>`` a ``bytes_param``, nothing else.

    Raises:
        InvalidRequest: "invalid value type for load parameter '<p>', expected
            string_param." / "... expected bytes_param."; "unrecognized load parameter
            '<p>'."
    """
    out: dict[str, str | bytes] = {}
    for key, p in request.parameters.items():
        which = p.WhichOneof("parameter_choice")
        if key == "config" or key.startswith("file:"):
            want = "string_param" if key == "config" else "bytes_param"
            if which != want:
                raise InvalidRequest(
                    f"invalid value type for load parameter '{key}', expected {want}."
                )
            out[key] = getattr(p, want)
        else:
            raise InvalidRequest(f"unrecognized load parameter '{key}'.")
    return out


MAX_STATUS_MESSAGE_BYTES = 4096
"""Longest error message sent in a gRPC status, in UTF-8 bytes. The message travels in the
``grpc-message`` trailer, percent-encoded (up to 3x), and clients refuse trailers over their
metadata limit (grpc's default: 16 KiB), so a longer one (e.g. quoting a huge request id)
would reach the client as RESOURCE_EXHAUSTED "Stream removed" instead of its own code."""


def status_message(message: str) -> str:
    """``message`` cut to ``MAX_STATUS_MESSAGE_BYTES`` (at character boundaries) by leaving
    out its middle, with the number of bytes left out; shorter messages are returned as
    they are. The end is kept because Triton's messages say why last: a request id of a
    megabyte quoted first ("[request id: ...] ...") would otherwise hide the reason."""
    data = message.encode()
    if len(data) <= MAX_STATUS_MESSAGE_BYTES:
        return message
    keep = MAX_STATUS_MESSAGE_BYTES - 64  # NOTE: room for the marker
    tail_bytes = keep // 4
    head = data[: keep - tail_bytes].decode(errors="ignore")
    tail = data[len(data) - tail_bytes :].decode(errors="ignore")
    left_out = len(data) - len(head.encode()) - len(tail.encode())
    return f"{head}... [{left_out} bytes cut] ...{tail}"


def grpc_status(code: ErrorCode, message: str) -> tuple[grpc.StatusCode, str]:
    """The gRPC status and details a call fails with for ``code`` and ``message`` (cut to
    fit a status)."""
    return GRPC_STATUS.get(code, grpc.StatusCode.UNKNOWN), status_message(message)


async def abort(context: grpc.aio.ServicerContext, code: ErrorCode, message: str) -> NoReturn:
    """End the call with ``code``'s gRPC status and ``message`` (cut to fit a status)."""
    await context.abort(*grpc_status(code, message))
    raise AssertionError("unreachable")  # context.abort raises


def traceparent(context: grpc.aio.ServicerContext) -> str:
    """The W3C ``traceparent`` metadata of a call ("" when absent)."""
    for key, value in context.invocation_metadata() or ():
        if key == "traceparent":
            return str(value)
    return ""


def _sent(tracer: Tracer, trace: Trace) -> None:
    """The call ended (its response written): GRPC_SEND_END, then the trace is done."""
    trace.stamp("GRPC_SEND_END")
    tracer.finish(trace)


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """The RPCs of ``inference.GRPCInferenceService`` that triton-mp serves.

    Args:
        api: the frontend's transport-free operations.
        forward: ``--grpc-header-forward-pattern``: the call metadata ModelInfer and
            ModelStreamInfer requests carry as parameters (none by default).
    """

    def __init__(self, api: FrontendApi, forward: HeaderForward | None = None) -> None:
        self._api = api
        self._forward = forward if forward is not None else HeaderForward()
        self._heads = ResponseHeads()
        """Serialized ModelInferResponse heads by what they hold (``infer_response_bytes``)."""

    def _headers(self, context: grpc.aio.ServicerContext) -> tuple[tuple[str, str], ...]:
        """The call's metadata the forward pattern selects (Triton reads the call's
        ``client_metadata``: a stream's apply to each of its requests)."""
        if not self._forward.active:
            return ()
        return self._forward.select(context.invocation_metadata() or ())

    # ------------------------------------------------------------------ health
    async def ServerLive(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """KServe ServerLive: true while the process serves."""
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """KServe ServerReady: every model ready (Triton's --strict-readiness) and not draining."""
        return pb.ServerReadyResponse(ready=await self._api.server.ready_checked())

    async def ModelReady(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """KServe ModelReady: the version (or, with none given, any version) is ready."""
        try:
            return pb.ModelReadyResponse(
                ready=await self._api.server.model_ready_checked(request.name, request.version)
            )
        except TritonMPError as e:
            await abort(context, e.code, e.message)

    # ---------------------------------------------------------------- metadata
    async def ServerMetadata(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """KServe ServerMetadata: name (--id), version, extensions."""
        return kserve.server_metadata(self._api.server.metadata())

    async def ModelMetadata(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """KServe ModelMetadata (shape = [-1] + dims when the model batches)."""
        try:
            return kserve.model_metadata(
                self._api.server.model_metadata(request.name, request.version)
            )
        except TritonMPError as e:
            await abort(context, e.code, e.message)

    async def ModelConfig(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """Triton ModelConfig: the effective (auto-completed, normalised) configuration."""
        try:
            return pb.ModelConfigResponse(
                config=self._api.server.model_config(request.name, request.version)
            )
        except TritonMPError as e:
            await abort(context, e.code, e.message)

    async def RepositoryIndex(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """Triton RepositoryIndex: every model and version with its state and reason."""
        try:
            check_repository_name(request.repository_name)
        except TritonMPError as e:
            await abort(context, e.code, e.message)
        return kserve.repository_index(self._api.repository.index(request.ready))

    async def RepositoryModelLoad(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """Triton RepositoryModelLoad (explicit mode): ``config`` and ``file:`` parameters."""
        try:
            check_repository_name(request.repository_name)
            params = load_parameters(request)
            await self._api.repository.load(request.model_name, params)
        except TritonMPError as e:
            await abort(context, e.code, e.message)
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """Triton RepositoryModelUnload (explicit mode), with ``unload_dependents``."""
        dependents = request.parameters.get("unload_dependents")
        try:
            check_repository_name(request.repository_name)
            if dependents is not None and dependents.WhichOneof("parameter_choice") != (
                "bool_param"
            ):
                raise InvalidRequest(
                    "invalid value type for 'unload_dependents' parameter, expected bool_param."
                )
            await self._api.repository.unload(
                request.model_name, bool(dependents is not None and dependents.bool_param)
            )
        except TritonMPError as e:
            await abort(context, e.code, e.message)
        return pb.RepositoryModelUnloadResponse()

    # --------------------------------------------------------------- inference
    def parse_infer(self, data: bytes) -> WireInferRequest:
        """ModelInfer's request deserializer (``wire.split_infer_request``): the protobuf
        parse is skipped for a request the frontend knows (``Inference.submit_known``)."""
        return split_infer_request(data, self._api.inference.known_keys)

    def parse_split(self, data: bytes, split: Split | None) -> WireInferRequest:
        """``parse_infer`` from the native server's split of ``data`` (``wire.split_native``).

        Raises:
            google.protobuf.message.DecodeError: ``data`` is no ModelInferRequest.
        """
        return split_native(data, split, self._api.inference.known_keys)

    def submit_known(self, request: WireInferRequest, in_task: bool = True) -> Ticket | None:
        """``Inference.submit_known`` for a request whose wire key the frontend knows, when
        nothing per call changes its path (no tracing, no forwarded headers): the ticket,
        or None for the full path (``ModelInfer``). ``in_task`` False: the caller answers
        from the ticket's callback, outside any task (``frontend.native.handoff``), which
        a model that preserves ordering declines (``Inference.submit_known``).

        Raises:
            TritonMPError: as ``Inference.submit_known`` (the call fails with its status).
        """
        key = request.key
        if key is None or not self.known_allowed():
            return None
        return self._api.inference.submit_known(key, request.client_id, request.raw, in_task)

    @property
    def inference(self) -> Inference:
        """The frontend's submit path (``frontend.native.known_calls`` submits to it)."""
        return self._api.inference

    @property
    def heads(self) -> ResponseHeads:
        """The serialized response heads ModelInfer's answers reuse."""
        return self._heads

    def known_allowed(self) -> bool:
        """Whether a known request may skip the handler now: nothing traces it and no
        header is forwarded (``submit_known``'s per-call checks)."""
        return not self._api.tracer.active and not self._forward.active

    def wakes_held(self) -> AbstractContextManager[None]:
        """``Inference.wakes_held``: requests submitted inside wake the scheduler once."""
        return self._api.inference.wakes_held()

    def response_bytes(self, result: InferResult) -> bytes:
        """The serialized ModelInferResponse of ``result`` (released)."""
        return infer_response_bytes(result, self._heads)

    async def ModelInfer(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """KServe ModelInfer: validate, copy inputs to shared memory, await the worker.

        ``request`` is a ``WireInferRequest`` (the handler ``add_to_server`` registers), whose
        tensor bytes are views into the received message, ``MALFORMED``, or a plain
        ModelInferRequest. A request the frontend knows by its wire key goes straight to
        ``Inference.submit_known``; the others, and those it declines, take the full path.
        The answer is the serialized ModelInferResponse (``wire.infer_response_bytes``).
        """
        if request is MALFORMED:
            await context.abort(grpc.StatusCode.INTERNAL, PARSE_FAILURE)
        tracer = self._api.tracer
        if isinstance(request, WireInferRequest):
            key = request.key
            try:
                ticket = self.submit_known(request)
                if ticket is not None:
                    return infer_response_bytes(await ticket.result(), self._heads)
            except TritonMPError as e:
                await abort(context, e.code, e.message)
            try:
                message, raw = request.request, request.raw or None
            except DecodeError:
                await context.abort(grpc.StatusCode.INTERNAL, PARSE_FAILURE)
        else:
            message, raw, key = request, None, None
        trace: Trace | None = None
        read_ns = time.monotonic_ns() if tracer.active else 0
        try:
            core_request = request_from_proto(message, raw)
            if headers := self._headers(context):
                core_request = replace(core_request, headers=headers)
            if read_ns:
                trace = tracer.sample(
                    core_request.model_name, core_request.id, parent_context=traceparent(context)
                )
                if trace is not None:
                    trace.stamp("GRPC_WAITREAD_START", read_ns)
                    trace.stamp("GRPC_WAITREAD_END")
            # NOTE: the model and its transaction policy first, then the request's own
            # rules (ModelInferHandler::Execute refuses a decoupled model before it reads
            # the request).
            inference = self._api.inference
            target = inference.admit(
                core_request.model_name,
                core_request.model_version,
                decoupled_message=DECOUPLED_MESSAGE,
            )
            ticket = inference.submit(
                core_request,
                decoupled_message=DECOUPLED_MESSAGE,
                target=target,
                trace=trace,
                known_key=key,
            )
            result = await ticket.result()
        except TritonMPError as e:
            if trace is not None:
                tracer.finish(trace)
            await abort(context, e.code, e.message)
        if trace is None:
            return infer_response_bytes(result, self._heads)
        trace.stamp("GRPC_SEND_START")
        data = infer_response_bytes(result, self._heads)
        context.add_done_callback(lambda _ctx: _sent(tracer, trace))
        return data

    async def ModelStreamInfer(self, request_iterator, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """Triton's bidirectional stream (``frontend.grpc.stream``): per request, one
        response (or ``error_message``), or for a decoupled model zero or more responses
        then the end of the request; with ``triton_grpc_error: true`` metadata a model's
        error ends the call with its status."""
        session = StreamSession(
            self._api.inference,
            request_iterator,
            self._api.tracer,
            traceparent(context),
            headers=self._headers(context),
            grpc_error=wants_grpc_error(context.invocation_metadata() or ()),
        )
        try:
            async for response in session.responses():
                yield response
        except StreamAborted as e:
            await abort(context, e.code, e.message)

    # ------------------------------------------------------- shared memory
    async def SystemSharedMemoryRegister(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """Triton SystemSharedMemoryRegister: name a window of a client's POSIX shm object."""
        try:
            await self._api.shm.register(
                request.name, request.key, request.offset, request.byte_size
            )
        except TritonMPError as e:
            await abort(context, e.code, e.message)
        return pb.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryStatus(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """Triton SystemSharedMemoryStatus: every region, or the one named."""
        try:
            regions = self._api.shm.status(request.name)
        except TritonMPError as e:
            await abort(context, e.code, e.message)
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
            await self._api.shm.unregister(request.name)
        except TritonMPError as e:
            await abort(context, e.code, e.message)
        return pb.SystemSharedMemoryUnregisterResponse()

    async def CudaSharedMemoryRegister(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """Triton CudaSharedMemoryRegister: a client's CUDA IPC handle on ``device_id``."""
        try:
            await self._api.shm.cuda_register(
                request.name, request.raw_handle, request.device_id, request.byte_size
            )
        except TritonMPError as e:
            await abort(context, e.code, e.message)
        return pb.CudaSharedMemoryRegisterResponse()

    async def CudaSharedMemoryStatus(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """Triton CudaSharedMemoryStatus: every CUDA region, or the one named."""
        try:
            regions = self._api.shm.cuda_status(request.name)
        except TritonMPError as e:
            await abort(context, e.code, e.message)
        resp = pb.CudaSharedMemoryStatusResponse()
        for r in regions:
            resp.regions[r.name].CopyFrom(
                pb.CudaSharedMemoryStatusResponse.RegionStatus(
                    name=r.name, device_id=r.device_id, byte_size=r.byte_size
                )
            )
        return resp

    async def CudaSharedMemoryUnregister(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """Triton CudaSharedMemoryUnregister: one region, or all when the name is empty."""
        try:
            await self._api.shm.cuda_unregister(request.name)
        except TritonMPError as e:
            await abort(context, e.code, e.message)
        return pb.CudaSharedMemoryUnregisterResponse()

    # ------------------------------------------------------------------- trace
    async def TraceSetting(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """Triton TraceSetting: read, or update then read, the global or a model's settings
        (an empty value list clears a model's own value; ``trace_file`` is refused)."""
        tracer = self._api.tracer
        name = request.model_name
        try:
            ready = not name or tracer.model_ready(lambda: self._api.server.model_ready(name, ""))
            new = None
            if request.settings:
                new = new_setting_from_grpc({k: list(v.value) for k, v in request.settings.items()})
            view = tracer.setting_request(name, new, ready)
        except TritonMPError as e:
            await abort(context, e.code, e.message)
        resp = pb.TraceSettingResponse()
        for key, value in view.items():
            resp.settings[key].value.extend([value] if isinstance(value, str) else value)
        return resp

    # --------------------------------------------------------------------- log
    async def LogSettings(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """Triton LogSettings: the settings, after the request's update (each setting
        applied as it is read; ``log_file`` refused)."""
        logs = self._api.logs
        now = logs.settings()
        try:
            if request.settings:
                now = logs.update(*update_from_grpc(now, request.settings))
        except TritonMPError as e:
            await abort(context, e.code, e.message)
        resp = pb.LogSettingsResponse()
        resp.settings["log_file"].string_param = now.file
        resp.settings["log_info"].bool_param = now.info
        resp.settings["log_warning"].bool_param = now.warning
        resp.settings["log_error"].bool_param = now.error
        resp.settings["log_verbose_level"].uint32_param = now.verbose
        resp.settings["log_format"].string_param = now.format
        return resp

    # -------------------------------------------------------------- statistics
    async def ModelStatistics(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """Triton ModelStatistics, from the scheduler's books (empty name = all models)."""
        try:
            return kserve.statistics(
                await self._api.stats.statistics(request.name, request.version)
            )
        except TritonMPError as e:
            await abort(context, e.code, e.message)


class HealthServicer(health_pb2_grpc.HealthServicer):  # type: ignore[misc]
    """``grpc.health.v1.Health/Check``: SERVING iff the server is ready (as Triton)."""

    def __init__(self, api: FrontendApi) -> None:
        self._api = api

    async def Check(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        """SERVING when every model is ready and the server is not draining."""
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if self._api.server.ready()
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        return health_pb2.HealthCheckResponse(status=status)
