"""The frontend's gRPC server set-up: its channel options, its port (TLS or not), the native
server for the public port where ``--grpc-frontend native`` can have it, and starting and
stopping both.

Imported by ``frontend.main`` (the process shell) only.
"""

from __future__ import annotations

import asyncio
import logging

import grpc

from triton_mp._proto import admin_pb2_grpc, health_pb2_grpc
from triton_mp.frontend.api import FrontendApi
from triton_mp.frontend.grpc.admin_service import AdminServicer
from triton_mp.frontend.grpc.connection_cut import CUT_AFTER_S, cut_connections
from triton_mp.frontend.grpc.interceptor import RestrictedProtocolInterceptor
from triton_mp.frontend.grpc.running_calls import idle, running_calls
from triton_mp.frontend.grpc.servicer import HealthServicer, InferenceServicer, add_to_server
from triton_mp.frontend.header_forward import HeaderForward
from triton_mp.frontend.native import UNAVAILABLE, available
from triton_mp.frontend.native.known_teach import Wiring
from triton_mp.frontend.native.public_port import NativePort, choose
from triton_mp.ipc.protocol.specs import FrontendSpec

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 2**31 - 1
"""gRPC send/receive limit, as Triton's (INT32_MAX)."""
MAX_METADATA_BYTES = 16384
"""The request metadata (headers) a call may carry, as 2.51's hard limit: its grpc serves
8-16 KiB with a rising chance of refusal (a soft limit of 8 KiB ramping to this one); the
system's grpc 1.51 has a single limit (8 KiB by default), set here to the hard one."""
COMPRESSION_LEVELS = {"none": 0, "low": 1, "medium": 2, "high": 3}
"""``--grpc-infer-response-compression-level`` -> grpc core's ``grpc_compression_level``."""
GRPC_AIO_LOGGER = "grpc._cython.cygrpc"
"""The logger grpc.aio's server reports its handlers' exceptions on (``_handle_exceptions``)."""
CALL_ENDED = "ExecuteBatchError raised in core by servicer method"
"""How grpc.aio logs a reply whose call grpc core had already ended (its deadline expired or
the client cancelled, before grpc.aio marked the call closed: grpc/grpc#32551), at ERROR with a
traceback. Nothing was lost: the client got its DEADLINE_EXCEEDED or CANCELLED from the core,
and Triton logs nothing in that case."""


class CallEndedFilter(logging.Filter):
    """Turns grpc.aio's report of a reply to a call that had already ended (``CALL_ENDED``)
    into one DEBUG line without the traceback, shown only at ``--log-verbose`` >= 1, as
    Triton's frontend is silent there; every other record passes unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not (record.levelno >= logging.ERROR and str(record.msg).startswith(CALL_ENDED)):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        record.exc_info, record.exc_text = None, None
        record.msg = f"a reply to a call that had already ended: {record.getMessage()}"
        record.args = None
        return logging.getLogger().isEnabledFor(logging.DEBUG)


def grpc_options(spec: FrontendSpec) -> list[tuple[str, int]]:
    """The grpc core channel arguments of the server: message and metadata limits, port sharing,
    the keepalive flags, the response compression level."""
    options = [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_metadata_size", MAX_METADATA_BYTES),
        ("grpc.so_reuseport", 1),
        *sorted(spec.grpc_channel_args.items()),
    ]
    level = COMPRESSION_LEVELS[spec.grpc_compression_level]
    if level:
        options.append(("grpc.default_compression_level", level))
    return options


def bind_grpc(server: grpc.aio.Server, spec: FrontendSpec) -> int:
    """Bind the gRPC port, over TLS when ``spec.grpc_tls`` says so. Returns the port (0: the
    bind failed).

    Raises:
        OSError: a certificate or key file cannot be read.
    """
    address = f"{spec.grpc_address}:{spec.grpc_port}"
    tls = spec.grpc_tls
    if tls is None:
        return int(server.add_insecure_port(address))
    with open(tls.server_key, "rb") as k, open(tls.server_cert, "rb") as c:
        pair = (k.read(), c.read())
    root = None
    if tls.root_cert:
        with open(tls.root_cert, "rb") as r:
            root = r.read()
    credentials = grpc.ssl_server_credentials(
        [pair], root_certificates=root, require_client_auth=tls.mutual
    )
    return int(server.add_secure_port(address, credentials))


def bind_grpc_if_allowed(server: grpc.aio.Server, spec: FrontendSpec, address: str) -> str:
    """Bind the gRPC port unless ``--allow-grpc=false``; the start-up error's text or ""."""
    if not spec.allow_grpc:
        return ""
    try:
        bound = bind_grpc(server, spec)
    except OSError as e:
        return f"gRPC TLS: {e}"
    return "" if bound else f"failed to bind gRPC address {address}"


def native_port(
    spec: FrontendSpec, servicer: InferenceServicer, wiring: Wiring | None = None
) -> NativePort | None:
    """The native server for the public port when ``--grpc-frontend native`` can have it
    (logs the one line that says why not otherwise); None: the Python server owns it."""
    if not spec.allow_grpc:
        return None
    use, why_not = choose(
        spec.grpc_frontend,
        tls=spec.grpc_tls is not None,
        built=available(),
        why_not_built=UNAVAILABLE,
    )
    if why_not:
        log.warning("%s", why_not)
    if not use:
        return None
    # NOTE: grpc.aio's interceptor checks the restricted-protocol headers: with it, ModelInfer
    # and ModelStreamInfer are relayed to the Python server like every other call.
    handoff = None if spec.grpc_restricted else servicer
    address = f"{spec.grpc_address}:{spec.grpc_port}"
    return NativePort(address, grpc_options(spec), handoff, None if handoff is None else wiring)


async def start_grpc(server: grpc.aio.Server, spec: FrontendSpec, port: NativePort | None) -> str:
    """Bind and start the gRPC server(s); the start-up error's text or ""."""
    address = f"{spec.grpc_address}:{spec.grpc_port}"
    if port is None:
        failed = bind_grpc_if_allowed(server, spec, address)
        if not failed:
            # NOTE: started even with no port (--allow-grpc=false): the drain stops it.
            await server.start()
        return failed
    if not port.bind_private(server):
        port.close()
        return f"failed to bind gRPC address {port.backend}"
    await server.start()
    if not port.start():
        port.close()
        await server.stop(None)
        return f"failed to bind gRPC address {address}"
    return ""


def grpc_server(spec: FrontendSpec, api: FrontendApi) -> tuple[grpc.aio.Server, InferenceServicer]:
    """The grpc.aio server with every service: inference, health, admin (not bound yet),
    and its inference servicer."""
    aio_log = logging.getLogger(GRPC_AIO_LOGGER)
    if not any(isinstance(f, CallEndedFilter) for f in aio_log.filters):
        aio_log.addFilter(CallEndedFilter())
    server = grpc.aio.server(
        interceptors=[RestrictedProtocolInterceptor(spec.grpc_restricted)]
        if spec.grpc_restricted
        else None,
        options=grpc_options(spec),
    )
    forward = HeaderForward(spec.grpc_header_forward_pattern)
    servicer = InferenceServicer(api, forward)
    add_to_server(servicer, server)
    health_pb2_grpc.add_HealthServicer_to_server(HealthServicer(api), server)
    admin_pb2_grpc.add_AdminServicer_to_server(AdminServicer(api.stats), server)
    return server, servicer


async def stop_grpc(server: grpc.aio.Server, grace_s: float, port: int | None = None) -> bool:
    """``server.stop(grace_s)``, and whether it cut calls: True when calls were still running
    ``grace_s`` seconds in, which it then cancels (their clients get UNAVAILABLE), as the
    native server's stop reports for the public port (``frontend.native.public_port``). Once
    no call runs, the connections left are closed, not waited for (``running_calls``).
    ``port``: the public TCP port this server serves (None: a private one); if the stop still
    waits ``CUT_AFTER_S`` past the grace, its connections are shut down (``connection_cut``),
    which counts as a cut."""
    loop = asyncio.get_running_loop()
    cut_at = loop.time() + grace_s + CUT_AFTER_S
    stopping = asyncio.ensure_future(server.stop(grace_s))
    quiet = asyncio.ensure_future(idle())
    # NOTE: this timer starts before stop's own (the task has not run yet), so it decides:
    # neither stopped nor idle by then means calls were running at the end of the grace
    done, _ = await asyncio.wait(
        {stopping, quiet}, timeout=grace_s, return_when=asyncio.FIRST_COMPLETED
    )
    quiet.cancel()
    cut = not done and running_calls() > 0
    if not stopping.done():
        # NOTE: cancels what is left now (a second stop may only shorten)
        cancelling = asyncio.ensure_future(server.stop(None))
        if port is not None:
            waited, _ = await asyncio.wait({stopping}, timeout=max(0.0, cut_at - loop.time()))
            if not waited and cut_connections(port) > 0:
                cut = True
        await cancelling
    await stopping
    return cut


async def stop_grpc_now(server: grpc.aio.Server, native: NativePort | None) -> None:
    """Stop the gRPC server(s) without a grace period (a failed start)."""
    if native is not None:
        await native.stop(0)
    await server.stop(None)
