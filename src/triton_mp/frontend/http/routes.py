"""KServe v2 HTTP/REST (+ Triton's extensions) over aiohttp: a thin adapter over the core.

Imported by the frontend only; the only module that imports aiohttp or maps ``ErrorCode`` to
HTTP status codes (Triton's ``HttpCodeFromError``: INTERNAL 500, NOT_FOUND 404,
UNAVAILABLE 503, UNSUPPORTED 501, everything else 400). Every frontend process serves it on
the same asyncio loop as its grpc.aio server, on ``--http-port`` shared through
``SO_REUSEPORT``. Routes, bodies and messages follow Triton's ``http_server.cc`` and
``docs/protocol`` (shared/reference/triton.md §2):

- health, server and model metadata, model readiness, configuration (``config_to_json``:
  Triton's JSON form of ModelConfig), statistics, repository index / load / unload, system
  shared memory status / register / unregister; CUDA shared memory, trace and log settings
  answer UNSUPPORTED as the gRPC RPCs do. Unmatched paths: 404 ``{"error":"Not Found"}``;
  a known path with another verb: 405 ``{"error":"Method Not Allowed"}`` (after the
  ``--http-restricted-api`` check, as Triton's dispatch does).
- ``Content-Type`` as 2.51 sends it: every body is JSON, but libevhtp labels an answer
  ``text/plain`` unless the handler named a type. Triton's JSON handlers (metadata, config,
  statistics, repository, shared memory, trace, logging) name ``application/json`` before
  anything can fail; health, model readiness, unmatched paths, restricted-API refusals and
  an inference refused before its body is parsed (405, unknown model or version, decoupled,
  unsupported compression, header length) do not (``_PLAIN_PATHS``, ``_ERROR_TYPE``);
  nor does the error an inference's response carries (the backend's: ``ResponseError``,
  ``RefusedByBackend``), which Triton's ``FinalizeResponse`` returns before naming one.
- ``POST .../infer``: ``frontend.http.infer_codec`` turns the body into the transport-free
  request the core validates and the answer back into JSON or binary data;
  ``Inference.submit`` does the rest. ``Content-Encoding`` and ``Accept-Encoding``
  gzip/deflate are honoured.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import replace
from typing import Any

import msgspec
from aiohttp import web
from google.protobuf import json_format
from google.protobuf.message import Message

from triton_mp.common.errors import ErrorCode, InvalidRequest, TritonMPError, flatten_exception
from triton_mp.common.json_form import config_to_json
from triton_mp.frontend import kserve
from triton_mp.frontend.admin.repository import check_repository_name
from triton_mp.frontend.api import FrontendApi
from triton_mp.frontend.dispatch.ticket import ResponseError
from triton_mp.frontend.header_forward import HeaderForward
from triton_mp.frontend.http.body import TooManyChunks, inflate, read_body
from triton_mp.frontend.http.control_bodies import (
    as_object,
    cuda_register_body,
    load_parameters,
    unload_body_dependents,
)
from triton_mp.frontend.http.infer_codec import (
    HEADER_LENGTH,
    JSON_TYPE,
    MAX_INPUT_BYTES,
    header_size,
    parse_infer_body,
    render_infer_response,
)
from triton_mp.frontend.http.json_tensors import (
    decode_json,
    json_string,
    json_uint,
)
from triton_mp.frontend.http.limits import MAX_HEADER_FIELDS, SERVER_LOG
from triton_mp.frontend.http.stop import stop_runner
from triton_mp.frontend.restricted import Restrictions, http_refusal
from triton_mp.frontend.shm.cuda import CUDA_IPC_HANDLE_BYTES
from triton_mp.frontend.tracing.settings import new_setting_from_json
from triton_mp.frontend.tracing.tracer import Trace, Tracer
from triton_mp.frontend.validation.inputs import RefusedByBackend
from triton_mp.frontend.validation.log_settings import settings_json, update_from_json

log = logging.getLogger(__name__)


HTTP_STATUS = {
    ErrorCode.INTERNAL: 500,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.UNSUPPORTED: 501,
}
"""Triton error code -> HTTP status; every other code is 400 (``HttpCodeFromError``)."""

PLAIN_TYPE = "text/plain"
"""libevhtp's ``Content-Type`` for an answer whose handler named none."""

_ERROR_TYPE = web.RequestKey("error_type", str)
"""The request's key for the ``Content-Type`` its error answer takes (JSON_TYPE when unset):
PLAIN_TYPE while a handler that names no type (health, readiness, inference before its
body is parsed) runs."""

_PLAIN_PATHS = ("/health/live", "/health/ready", "/ready", "/infer")
"""Ends of the routes whose handlers name no ``Content-Type`` (their 405s are text/plain)."""

DECOUPLED_MESSAGE = "HTTP end point doesn't support models with decoupled transaction policy"
"""Triton's UNSUPPORTED answer to an inference on a decoupled model."""

SHUTDOWN_TIMEOUT_S = 1.0
"""How long ``stop`` lets handlers still running finish once it closes the connections. The
frontend stops HTTP only after its in-flight inferences were answered or
``--exit-timeout-secs`` ran out, and answers still being written had the rest of the budget
(``frontend.http.stop``), so what is left is requests the drain gave up on."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _traceparent(request: web.Request) -> str:
    """The W3C ``traceparent`` header ("" when absent)."""
    return request.headers.get("traceparent", "")


async def _send_traced(
    request: web.Request, response: web.Response, trace: Trace, tracer: Tracer
) -> web.Response:
    """Write a traced request's response here, between HTTP_SEND_START and HTTP_SEND_END,
    then finish its trace."""
    trace.stamp("HTTP_SEND_START")
    try:
        await response.prepare(request)
        await response.write_eof()
    finally:
        trace.stamp("HTTP_SEND_END")
        tracer.finish(trace)
    return response


def raw_model_name(template: str, raw_path: str) -> str:
    """The ``{model}`` segment of ``raw_path`` (the request target as sent, query and all)
    as the client wrote it, percent-escapes kept ("" when ``template``, the route's
    canonical path, has none): Triton's routes match the undecoded URL, so ``..%2Fm`` and
    ``%6D`` name models of those literal names; aiohttp's ``match_info`` decodes them."""
    parts = template.split("/")
    if "{model}" not in parts:
        return ""
    return raw_path.split("?", 1)[0].split("#", 1)[0].split("/")[parts.index("{model}")]


def _model(request: web.Request) -> str:
    route = request.match_info.route.resource
    return raw_model_name(route.canonical if route is not None else "", request.raw_path)


def _raw_headers(request: web.Request) -> Iterator[tuple[str, str]]:
    """The request's headers with their names as sent (``request.headers`` gives known
    names such as ``priority`` in aiohttp's spelling, ``Priority``; Triton's libevhtp keeps
    the client's), values as UTF-8 text."""
    for name, value in request.raw_headers:
        yield name.decode("utf-8", "replace"), value.decode("utf-8", "replace")


def _error_response(status: int, message: str, content_type: str = JSON_TYPE) -> web.Response:
    return web.Response(
        status=status, body=msgspec.json.encode({"error": message}), content_type=content_type
    )


def _plain(request: web.Request, status: int = 200) -> web.Response:
    """An empty answer of a handler that names no type; its errors are text/plain too."""
    request[_ERROR_TYPE] = PLAIN_TYPE
    return web.Response(status=status, content_type=PLAIN_TYPE)


def _json_response(value: object) -> web.Response:
    return web.Response(body=msgspec.json.encode(value), content_type=JSON_TYPE)


def proto_to_json(message: Message, *, print_defaults: bool = True) -> dict[str, Any]:
    """A proto as Triton's JSON: proto field names, 64-bit integers as numbers.

    Args:
        print_defaults: include fields left at their defaults (ModelConfig, statistics,
            metadata do); False omits them (the repository index does).
    """
    if print_defaults:
        # NOTE: config_to_json works on any message, not only ModelConfig.
        return config_to_json(message)
    out: dict[str, Any] = json_format.MessageToDict(message, preserving_proto_field_name=True)
    return out


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turn TritonMPError, aiohttp's routing errors and unexpected failures (INTERNAL, 500)
    into Triton's JSON error bodies."""
    try:
        return await handler(request)
    except TooManyChunks as e:
        # NOTE: as Triton: answer, stop reading and close the connection.
        response = _error_response(400, e.message, request.get(_ERROR_TYPE, JSON_TYPE))
        response.force_close()
        return response
    except TritonMPError as e:
        status = HTTP_STATUS.get(e.code, 400)
        return _error_response(status, e.message, request.get(_ERROR_TYPE, JSON_TYPE))
    except web.HTTPNotFound:
        return _error_response(404, "Not Found", PLAIN_TYPE)
    except web.HTTPMethodNotAllowed:
        # NOTE: every known path has its own 405 route (HttpFrontend._routes); this is
        # aiohttp's answer for anything else.
        return _error_response(405, "Method Not Allowed", PLAIN_TYPE)
    except web.HTTPException as e:
        return _error_response(e.status, e.text or e.reason)
    except ConnectionError:
        raise  # NOTE: the client went away; there is nobody to answer.
    except Exception as e:  # noqa: BLE001 - one failed request must not cost the server
        log.exception("HTTP %s %s failed", request.method, request.path)
        return _error_response(500, flatten_exception(e))


def _not_allowed(content_type: str) -> Handler:
    """The handler of a known path asked with a verb it does not serve: 405, text/plain on
    the paths whose Triton handler names no type, else JSON."""

    async def not_allowed(request: web.Request) -> web.StreamResponse:
        return _error_response(405, "Method Not Allowed", content_type)

    return not_allowed


# ------------------------------------------------------------------------------ server


class HttpFrontend:
    """The HTTP/REST endpoint of one frontend process.

    Args:
        api: the frontend's transport-free operations (shared with gRPC).
        restrictions: ``--http-restricted-api``: category -> (header, value).
        max_input_bytes: ``--http-max-input-size``: the largest body, compressed or inflated.
        forward: ``--http-header-forward-pattern``: the request headers an ``infer``
            request carries as parameters (none by default).
    """

    def __init__(
        self,
        api: FrontendApi,
        restrictions: Restrictions | None = None,
        *,
        max_input_bytes: int = MAX_INPUT_BYTES,
        forward: HeaderForward | None = None,
    ) -> None:
        self._api = api
        self._forward = forward if forward is not None else HeaderForward()
        self._restrictions: Restrictions = restrictions or {}
        self._runner: web.AppRunner | None = None
        self._max_input_bytes = max_input_bytes
        self.app = web.Application(middlewares=[_errors], client_max_size=max_input_bytes)
        self._routes()

    def _guard(self, category: str, handler: Handler) -> Handler:
        """``handler``, or, when ``--http-restricted-api`` restricts ``category``, a handler
        that first answers 403 to requests without the expected header (Triton's
        ``RespondIfRestricted``)."""
        rule = self._restrictions.get(category)
        if rule is None:
            return handler
        key, value = rule
        message = http_refusal(key)

        async def guarded(request: web.Request) -> web.StreamResponse:
            if request.headers.get(key) != value:
                # NOTE: Triton's RespondIfRestricted names no Content-Type.
                return _error_response(403, message, PLAIN_TYPE)
            return await handler(request)

        return guarded

    def _routes(self) -> None:
        categories: dict[Handler, str] = {
            self._server_metadata: "metadata",
            self._model_metadata: "metadata",
            self._live: "health",
            self._ready: "health",
            self._model_ready: "health",
            self._model_config: "model-config",
            self._stats: "statistics",
            self._trace: "trace",
            self._logging: "logging",
            self._infer: "inference",
            self._generate: "inference",
            self._repository_index: "model-repository",
            self._repository_load: "model-repository",
            self._repository_unload: "model-repository",
            self._system_shm: "shared-memory",
            self._cuda_shm: "shared-memory",
        }

        paths: dict[str, str] = {}

        def add(method: str, path: str, handler: Handler) -> None:
            self.app.router.add_route(method, path, self._guard(categories[handler], handler))
            paths[path] = categories[handler]

        add("GET", "/v2", self._server_metadata)
        add("GET", "/v2/health/live", self._live)
        add("GET", "/v2/health/ready", self._ready)
        add("GET", "/v2/models/stats", self._stats)
        add("GET", "/v2/trace/setting", self._trace)
        add("POST", "/v2/trace/setting", self._trace)
        add("GET", "/v2/logging", self._logging)
        add("POST", "/v2/logging", self._logging)
        for base in ("/v2/models/{model}", "/v2/models/{model}/versions/{version:[0-9]+}"):
            add("GET", base, self._model_metadata)
            add("GET", base + "/ready", self._model_ready)
            add("GET", base + "/config", self._model_config)
            add("GET", base + "/stats", self._stats)
            add("POST", base + "/infer", self._infer)
            add("POST", base + "/generate", self._generate)
            add("POST", base + "/generate_stream", self._generate)
        add("GET", "/v2/models/{model}/trace/setting", self._trace)
        add("POST", "/v2/models/{model}/trace/setting", self._trace)
        for repo in ("/v2/repository", "/v2/repository/{repository}"):
            add("POST", repo + "/index", self._repository_index)
            add("POST", repo + "/models/{model}/load", self._repository_load)
            add("POST", repo + "/models/{model}/unload", self._repository_unload)
        for kind, handler in (
            ("systemsharedmemory", self._system_shm),
            ("cudasharedmemory", self._cuda_shm),
        ):
            for base in (f"/v2/{kind}", f"/v2/{kind}/region/{{region}}"):
                add("GET", base + "/status", handler)
                add("POST", base + "/register", handler)
                add("POST", base + "/unregister", handler)
        # NOTE: Triton checks the restriction, then the handler the verb: a 405 route per
        # path, after its own (aiohttp tries a path's routes in the order they were added).
        for path, category in paths.items():
            kind = PLAIN_TYPE if path.endswith(_PLAIN_PATHS) else JSON_TYPE
            self.app.router.add_route("*", path, self._guard(category, _not_allowed(kind)))

    async def start(self, address: str, port: int) -> None:
        """Listen on ``address:port`` with SO_REUSEPORT (shared by every frontend).

        Raises:
            OSError: the address cannot be bound.
        """
        # NOTE: handler_cancellation: a client that disconnects cancels its handler, so a
        # queued inference is dropped (CancelRequest) exactly as a cancelled gRPC call is.
        runner = web.AppRunner(
            self.app,
            access_log=None,
            handler_cancellation=True,
            auto_decompress=False,  # NOTE: inference bodies are inflated as Triton does
            shutdown_timeout=SHUTDOWN_TIMEOUT_S,
            max_headers=MAX_HEADER_FIELDS,
            logger=SERVER_LOG,
        )
        await runner.setup()
        try:
            # NOTE: backlog as Triton's HTTP server (evhtp_bind_socket's 1024).
            await web.TCPSite(runner, address, port, reuse_port=True, backlog=1024).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner

    async def stop(self, grace_s: float = 0.0) -> bool:
        """Stop listening, give answers still being written up to ``grace_s`` seconds, close
        connections (inferences were drained before). True: an answer was cut (``stop``)."""
        runner, self._runner = self._runner, None
        return runner is not None and await stop_runner(runner, grace_s)

    # ------------------------------------------------------------------ health
    async def _live(self, request: web.Request) -> web.Response:
        return _plain(request)

    async def _ready(self, request: web.Request) -> web.Response:
        request[_ERROR_TYPE] = PLAIN_TYPE
        return _plain(request, 200 if await self._api.server.ready_checked() else 400)

    async def _model_ready(self, request: web.Request) -> web.Response:
        request[_ERROR_TYPE] = PLAIN_TYPE
        m = request.match_info
        if not await self._api.server.model_ready_checked(_model(request), m.get("version", "")):
            return _error_response(400, "Model version not ready", PLAIN_TYPE)
        return _plain(request)

    # ---------------------------------------------------------------- metadata
    async def _server_metadata(self, request: web.Request) -> web.Response:
        return _json_response(proto_to_json(kserve.server_metadata(self._api.server.metadata())))

    async def _model_metadata(self, request: web.Request) -> web.Response:
        m = request.match_info
        return _json_response(
            proto_to_json(
                kserve.model_metadata(
                    self._api.server.model_metadata(_model(request), m.get("version", ""))
                )
            )
        )

    async def _model_config(self, request: web.Request) -> web.Response:
        m = request.match_info
        return _json_response(
            config_to_json(self._api.server.model_config(_model(request), m.get("version", "")))
        )

    async def _stats(self, request: web.Request) -> web.Response:
        m = request.match_info
        stats = await self._api.stats.statistics(_model(request), m.get("version", ""))
        return _json_response(proto_to_json(kserve.statistics(stats)))

    # -------------------------------------------------------------- repository
    async def _body_json(
        self, request: web.Request, *, parse_empty: bool = False
    ) -> dict[str, Any]:
        """The request's JSON as the object Triton reads members from: {} for an empty body
        (unless ``parse_empty``: Triton's shared-memory register, trace and log settings
        parse even an empty body, "The document is empty. at 0") and for JSON that is not
        an object (TritonJson's ``Find`` finds nothing in it)."""
        body = await read_body(request, self._max_input_bytes)
        if not body and not parse_empty:
            return {}
        return as_object(decode_json(body))

    async def _repository_index(self, request: web.Request) -> web.Response:
        body = await self._body_json(request)
        ready = body.get("ready", False)
        if not isinstance(ready, bool):
            # NOTE: upstream main's words (2.51: TritonJson's, 500)
            raise InvalidRequest("Invalid value for 'ready': expected a boolean")
        index = self._api.repository.index(ready)
        return _json_response(
            [proto_to_json(kserve.index_entry(e), print_defaults=False) for e in index]
        )

    async def _repository_load(self, request: web.Request) -> web.Response:
        """RepositoryModelLoad: ``config`` and base64 ``file:`` parameters (Triton's
        HandleRepositoryControl, ``control_bodies.load_parameters``)."""
        check_repository_name(request.match_info.get("repository", ""))
        params = load_parameters(await self._body_json(request))
        await self._api.repository.load(_model(request), params)
        return web.Response(status=200, content_type=JSON_TYPE)

    async def _repository_unload(self, request: web.Request) -> web.Response:
        check_repository_name(request.match_info.get("repository", ""))
        dependents = unload_body_dependents(await read_body(request, self._max_input_bytes))
        await self._api.repository.unload(_model(request), dependents)
        return web.Response(status=200, content_type=JSON_TYPE)

    # ----------------------------------------------------------- shared memory
    async def _system_shm(self, request: web.Request) -> web.Response:
        region = request.match_info.get("region", "")
        action = request.path.rsplit("/", 1)[1]
        if action == "status":
            return _json_response(
                [
                    {"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size}
                    for r in self._api.shm.status(region)
                ]
            )
        if action == "register":
            if not region:
                raise InvalidRequest(
                    "'region name' is necessary to register system shared memory region"
                )
            body = await self._body_json(request, parse_empty=True)
            if "key" not in body:
                raise InvalidRequest("Shared memory register request has no 'key' field")
            # NOTE: Triton's HandleSystemSharedMemory: TritonJson's words, no prefix.
            key = json_string(body, "key", "")
            offset = json_uint(body, "offset", "") if "offset" in body else 0
            if "byte_size" not in body:
                raise InvalidRequest("Shared memory register request has no 'byte_size' field")
            await self._api.shm.register(region, key, offset, json_uint(body, "byte_size", ""))
        else:
            await self._api.shm.unregister(region)
        return web.Response(status=200, content_type=JSON_TYPE)

    async def _cuda_shm(self, request: web.Request) -> web.Response:
        """``/v2/cudasharedmemory[/region/<r>]/status|register|unregister`` (Triton's
        HandleCudaSharedMemory: the handle as ``raw_handle: {"b64": ...}``)."""
        region = request.match_info.get("region", "")
        action = request.path.rsplit("/", 1)[1]
        if action == "status":
            return _json_response(
                [
                    {"name": r.name, "device_id": r.device_id, "byte_size": r.byte_size}
                    for r in self._api.shm.cuda_status(region)
                ]
            )
        if action == "register":
            self._api.shm.require_enabled()
            if not region:
                raise InvalidRequest(
                    "'region name' is necessary to register cuda shared memory region"
                )
            body = await self._body_json(request, parse_empty=True)
            handle, byte_size, device_id = cuda_register_body(body, CUDA_IPC_HANDLE_BYTES)
            await self._api.shm.cuda_register(region, handle, device_id, byte_size)
        else:
            await self._api.shm.cuda_unregister(region)
        return web.Response(status=200, content_type=JSON_TYPE)

    # ------------------------------------------------------------------- trace
    async def _trace(self, request: web.Request) -> web.Response:
        """Triton's ``GET|POST v2[/models/<m>]/trace/setting``: string values, ``trace_level``
        a list, ``null`` clears a model's own value; ``trace_file`` is refused (501)."""
        tracer = self._api.tracer
        name = _model(request)
        ready = not name or tracer.model_ready(lambda: self._api.server.model_ready(name, ""))
        if name and not ready:
            tracer.setting_request(name, None, False)  # raises Triton's unknown-model error
        new = None
        if request.method == "POST":
            new = new_setting_from_json(await self._body_json(request, parse_empty=True))
        return _json_response(tracer.setting_request(name, new, ready))

    async def _logging(self, request: web.Request) -> web.Response:
        """Triton's ``GET|POST v2/logging``: the settings, after a POST's update (each
        setting applied as it is read; ``log_file`` refused, 501)."""
        logs = self._api.logs
        now = logs.settings()
        if request.method == "POST":
            body = await self._body_json(request, parse_empty=True)
            now = logs.update(*update_from_json(now, body))
        return _json_response(settings_json(now))

    # ------------------------------------------------------- not served yet

    async def _generate(self, request: web.Request) -> web.Response:
        raise TritonMPError(
            "the generate extension is not supported by triton-mp", ErrorCode.UNSUPPORTED
        )

    # --------------------------------------------------------------- inference
    async def _infer(self, request: web.Request) -> web.Response:
        """KServe v2 ``POST .../infer`` with Triton's binary tensor data extension."""
        inference = self._api.inference
        version = request.match_info.get("version", "")
        # NOTE: Triton's HandleInfer names application/json only once it parses the body.
        request[_ERROR_TYPE] = PLAIN_TYPE
        # NOTE: refused before the body is read, as Triton does; submit does not repeat it.
        target = inference.admit(_model(request), version, decoupled_message=DECOUPLED_MESSAGE)
        encoding = request.headers.get("Content-Encoding", "")
        if encoding not in ("", "identity", "gzip", "deflate"):
            response = _error_response(501, "Unsupported compression type", PLAIN_TYPE)
            response.headers["Accept-Encoding"] = "gzip, deflate"
            return response
        tracer = self._api.tracer
        recv_ns = time.monotonic_ns() if tracer.active else 0
        body = await read_body(request, self._max_input_bytes)
        if encoding in ("gzip", "deflate"):
            body = inflate(body, self._max_input_bytes)
        header_len = header_size(len(body), request.headers.get(HEADER_LENGTH))
        request[_ERROR_TYPE] = JSON_TYPE
        req, plan = parse_infer_body(target.model, version, body, header_len)
        if self._forward.active and (forwarded := self._forward.select(_raw_headers(request))):
            req = replace(req, headers=forwarded)
        trace = None
        if recv_ns:
            trace = tracer.sample(req.model_name, req.id, parent_context=_traceparent(request))
            if trace is not None:
                trace.stamp("HTTP_RECV_START", recv_ns)
                trace.stamp("HTTP_RECV_END")
        try:
            ticket = inference.submit(
                req, decoupled_message=DECOUPLED_MESSAGE, target=target, trace=trace
            )
            result = await ticket.result()
        except TritonMPError as e:
            if isinstance(e, (RefusedByBackend, ResponseError)):
                # NOTE: 2.51 gets a backend's error or refusal in the response, whose error
                # FinalizeResponse returns before HandleInfer names application/json.
                request[_ERROR_TYPE] = PLAIN_TYPE
            if trace is not None:
                tracer.finish(trace)
            raise
        try:
            data, headers = render_infer_response(
                result, plan, request.headers.get("Accept-Encoding")
            )
        finally:
            result.release()
        if trace is None:
            return web.Response(body=data, headers=headers)
        return await _send_traced(request, web.Response(body=data, headers=headers), trace, tracer)
