"""The frontend process: gRPC and HTTP/REST in, descriptors to the scheduler, answers back.

``run_frontend`` is the process entry. Several frontends may share the gRPC and the HTTP
port (``SO_REUSEPORT``); each has its own input arena, its own inbox and its own ring to the
scheduler. Both transports call one ``FrontendCore`` (``frontend.core``).

One asyncio loop runs the grpc.aio and aiohttp servers, every handler, and the inbox:
answers from workers and the scheduler wake it through a FIFO it watches (``ipc.notify``),
and it drains the rings in the same thread that resolves the handlers' futures.
SIGTERM (from the supervisor) starts a drain: new requests are refused, accepted ones are
answered for up to ``exit_timeout_s``, then the process exits.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from multiprocessing.connection import Connection

import grpc

from triton_mp._proto import admin_pb2_grpc, health_pb2_grpc
from triton_mp.common.errors import TritonMPError
from triton_mp.common.log import configure_logging
from triton_mp.frontend.control import SupervisorLink
from triton_mp.frontend.core import FrontendCore
from triton_mp.frontend.grpc.admin_service import AdminServicer
from triton_mp.frontend.grpc.interceptor import RestrictedProtocolInterceptor
from triton_mp.frontend.http import HttpFrontend
from triton_mp.frontend.metrics import MetricsEndpoint
from triton_mp.frontend.models import ModelTable
from triton_mp.frontend.pending import PendingTable
from triton_mp.frontend.servicer import HealthServicer, InferenceServicer, add_to_server
from triton_mp.frontend.shm import Region, SystemShmRegistry
from triton_mp.ipc import ArenaAllocator, Inbox, SegmentCache, Sender
from triton_mp.ipc.codec import Decoder
from triton_mp.ipc.handshake import report_ready, report_start_failed
from triton_mp.ipc.messages import (
    InferResponse,
    ModelAvailability,
    ModelTableUpdate,
    QueueReply,
    RequestFailed,
    ShmRegistered,
    ShmUnregistered,
    StatsReply,
    ToFrontend,
)
from triton_mp.ipc.specs import FrontendSpec

log = logging.getLogger(__name__)

DRAIN_LINGER_S = 1.0
"""After the last in-flight request of a drain is answered, how long the frontend keeps its
connections before it closes them (within ``--exit-timeout-secs``)."""
MAX_MESSAGE_BYTES = 2**31 - 1
"""gRPC send/receive limit, as Triton's (INT32_MAX)."""


def _on_wakeup(
    inbox: Inbox[ToFrontend], pending: PendingTable, shm: SystemShmRegistry, models: ModelTable
) -> None:
    """The inbox FIFO is readable: clear it, then drain every ring (loop thread)."""
    inbox.waiter.clear()
    answers: list[InferResponse | RequestFailed | StatsReply | QueueReply] = []
    for msg in inbox.drain():
        if isinstance(msg, ShmRegistered):
            for r in msg.regions:
                shm.add(Region(r.name, r.key, r.offset, r.byte_size, r.region_id))
        elif isinstance(msg, ShmUnregistered):
            shm.drop(list(msg.names))
        elif isinstance(msg, ModelAvailability):
            models.set_available(msg.model, msg.version, msg.ready)
        else:
            answers.append(msg)
    if answers:
        pending.deliver(answers)


async def serve(spec: FrontendSpec, ready: Connection) -> int:
    """Run the gRPC server until SIGTERM, then drain. Returns the exit status."""
    loop = asyncio.get_running_loop()
    name = str(spec.frontend_id)
    inbox: Inbox[ToFrontend] = Inbox(spec.inbox.wakeup, spec.inbox.rings, ToFrontend)
    to_scheduler = Sender(spec.to_scheduler.ring, spec.to_scheduler.wakeup)
    to_peers = [Sender(c.ring, c.wakeup) for _, c in sorted(spec.to_peers.items())]

    def send_peers(data: bytes) -> None:
        for peer in to_peers:
            peer.send_bytes(data)

    cache = SegmentCache()
    arena = ArenaAllocator(spec.arena_prefix, spec.arena_bytes, spec.arena_budget_bytes, cache)
    pending = PendingTable(cache)
    models = ModelTable(spec.models)
    shm = SystemShmRegistry(
        spec.frontend_id, enabled=spec.allow_client_shm, allowed_prefix=spec.client_shm_prefix
    )

    def on_update(update: ModelTableUpdate) -> None:
        """Apply a supervisor's model change between two requests (loop thread)."""
        for ring in update.add_rings:
            inbox.add_ring(ring)
        models.update(update.models)
        for ring in update.remove_rings:
            # NOTE: answers a stopped worker left are delivered, not dropped.
            left = inbox.remove_ring(ring)
            if left:
                pending.deliver([m for m in left if isinstance(m, InferResponse | RequestFailed)])
        for prefix in update.drop_segments:
            cache.drop(prefix)
        for e in update.models:
            state = "unloaded" if e.unloaded else e.transition or f"versions {e.ready_versions}"
            log.info("model table: '%s' %s", e.name, state, extra={"model": e.name})
        if update.add_rings:
            # NOTE: answers may already wait in a new ring; nothing else would wake us.
            inbox.waiter.wake()

    link = SupervisorLink(ready, on_update)

    core = FrontendCore(
        frontend_id=spec.frontend_id,
        server_name=spec.server_name,
        models=models,
        arena=arena,
        cache=cache,
        pending=pending,
        send_scheduler=to_scheduler.send_bytes,
        send_peers=send_peers,
        shm=shm,
        model_control_mode=spec.model_control_mode,
        link=link,
        repository=spec.repository,
    )
    servicer = InferenceServicer(core)
    server = grpc.aio.server(
        interceptors=[RestrictedProtocolInterceptor(spec.grpc_restricted)]
        if spec.grpc_restricted
        else None,
        options=[
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 1),
        ],
    )
    add_to_server(servicer, server)
    health_pb2_grpc.add_HealthServicer_to_server(HealthServicer(core), server)
    admin_pb2_grpc.add_AdminServicer_to_server(
        AdminServicer(
            frontend_id=spec.frontend_id,
            models=models,
            pending=pending,
            send_scheduler=to_scheduler.send_bytes,
        ),
        server,
    )
    address = f"{spec.grpc_address}:{spec.grpc_port}"
    port = server.add_insecure_port(address)
    if port == 0:
        report_start_failed(ready, "frontend", name, f"failed to bind gRPC address {address}")
        return 1
    await server.start()
    http = None
    if spec.allow_http:
        http = HttpFrontend(core, spec.http_restricted)
        try:
            await http.start(spec.http_address, spec.http_port)
        except OSError as e:
            report_start_failed(
                ready,
                "frontend",
                name,
                f"failed to bind HTTP address {spec.http_address}:{spec.http_port} ({e.strerror})",
            )
            await server.stop(None)
            return 1

    loop.add_reader(inbox.waiter.fileno(), _on_wakeup, inbox, pending, shm, models)
    metrics = None
    if spec.metrics is not None:
        metrics = MetricsEndpoint(
            spec.metrics,
            frontend_id=spec.frontend_id,
            pending=pending,
            send_scheduler=to_scheduler.send_bytes,
            supervisor_pid=os.getppid(),
        )
        try:
            await metrics.start()
        except TritonMPError as e:
            report_start_failed(ready, "frontend", name, e.message)
            await server.stop(None)
            return 1
    stopping = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stopping.set)
    report_ready(ready, "frontend", name)
    link.start(loop)
    log.info("gRPC frontend listening on %s", address)
    for category, (key, _) in sorted(spec.grpc_restricted.items()):
        log.info("gRPC '%s' protocol restricted to header triton-grpc-protocol-%s", category, key)
    if http is not None:
        log.info("HTTP frontend listening on %s:%d", spec.http_address, spec.http_port)
        for category, (key, _) in sorted(spec.http_restricted.items()):
            log.info("HTTP '%s' API restricted to header %s", category, key)
    await stopping.wait()

    # NOTE: as Triton does, keep listening while draining: health answers not-ready and new
    # inferences get UNAVAILABLE "Server is stopping..." until in-flight ones are answered.
    core.inference.start_draining()
    log.info("draining: %d requests in flight, up to %.1f s", len(pending), spec.exit_timeout_s)
    deadline = loop.time() + spec.exit_timeout_s
    answered_some = bool(len(pending))
    await core.inference.wait_drained(spec.exit_timeout_s)
    if answered_some:
        # NOTE: an answered request's response may still be on its way (grpc has written
        # the last bytes to the socket, the client has not read them): closing the
        # connection now can reset it and lose the response's tail. Give clients a moment.
        await asyncio.sleep(max(0.0, min(DRAIN_LINGER_S, deadline - loop.time())))
    if http is not None:
        await http.stop()
    await server.stop(grace=max(0.5, deadline - loop.time()))
    if metrics is not None:
        await metrics.stop()
    loop.remove_reader(inbox.waiter.fileno())
    link.stop(loop)
    arena.close_and_unlink()
    log.info("frontend stopped")
    return 0


def run_frontend(spec_bytes: bytes, ready: Connection) -> int:
    """Process entry of a frontend.

    Args:
        spec_bytes: a msgpack-encoded ``FrontendSpec``.
        ready: the pipe to the supervisor: ``ipc.handshake`` once the ports are bound, then
            the control pipe.

    Returns:
        The exit status (0 after a clean drain).
    """
    spec: FrontendSpec = Decoder(FrontendSpec).decode(spec_bytes)
    configure_logging("frontend", str(spec.frontend_id), spec.log.verbose, spec.log.format)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return asyncio.run(serve(spec, ready))
