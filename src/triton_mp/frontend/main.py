"""The frontend process: gRPC and HTTP/REST in, descriptors to the scheduler, answers back.

``run_frontend`` is the process entry. Several frontends may share the gRPC and the HTTP
port (``SO_REUSEPORT``); each has its own input arena, its own inbox and its own ring to the
scheduler. Both transports call one transport-free core (``frontend.api.FrontendApi``),
which ``build_api`` assembles here.

One asyncio loop runs the grpc.aio and aiohttp servers, every handler, and the inbox:
answers from workers and the scheduler wake it through a FIFO it watches (``ipc.memory.notify``),
and it drains the rings in the same thread that hands answers to the tickets
(``frontend.dispatch.inbox``). SIGTERM (from the supervisor) starts a drain: new requests are
refused, and the process waits until the accepted ones are answered (at most
``exit_timeout_s``), then exits.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import signal
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

import grpc

from triton_mp._proto import model_config_pb2 as mc
from triton_mp.common.errors import StartupError, TritonMPError
from triton_mp.common.process.log import configure_logging
from triton_mp.common.process.platform import tune_gc
from triton_mp.frontend.admin.control import SupervisorLink
from triton_mp.frontend.admin.logs import LogControl
from triton_mp.frontend.admin.repository import RepositoryApi
from triton_mp.frontend.admin.server import ServerApi
from triton_mp.frontend.admin.stats import StatsApi
from triton_mp.frontend.api import FrontendApi
from triton_mp.frontend.cache.response import ResponseCacheStep, cache_enabled
from triton_mp.frontend.dispatch.direct import DirectRoutes
from triton_mp.frontend.dispatch.inbox import InboxHandler
from triton_mp.frontend.dispatch.known_records import use_patch
from triton_mp.frontend.dispatch.pending import PendingTable
from triton_mp.frontend.dispatch.polling_loop import PollingSelector
from triton_mp.frontend.dispatch.wakes import HeldWakes, SharedAllowance
from triton_mp.frontend.grpc.server_setup import (
    grpc_server,
    native_port,
    start_grpc,
    stop_grpc,
    stop_grpc_now,
)
from triton_mp.frontend.header_forward import HeaderForward
from triton_mp.frontend.http.routes import HttpFrontend
from triton_mp.frontend.inference import Inference
from triton_mp.frontend.metrics.endpoint import MetricsEndpoint
from triton_mp.frontend.metrics.latency import FirstResponseHistograms
from triton_mp.frontend.model_table import ModelTable
from triton_mp.frontend.native import (
    input_arena_type,
    record_patch,
    shared_ring_attach,
)
from triton_mp.frontend.native.known_teach import Wiring
from triton_mp.frontend.native.public_port import NativePort
from triton_mp.frontend.readiness import ReadinessChecks
from triton_mp.frontend.shm.api import ClientShmApi
from triton_mp.frontend.shm.cuda import CudaShmRegistry
from triton_mp.frontend.shm.peers import ShmPeers
from triton_mp.frontend.shm.system import DISABLED_MESSAGE, SystemShmRegistry
from triton_mp.frontend.tracing.tracer import Tracer
from triton_mp.ipc import ArenaAllocator, Inbox, SegmentCache, Sender
from triton_mp.ipc.handshake import CALLS_CUT_EXIT, report_ready, report_start_failed
from triton_mp.ipc.memory.notify import Waker
from triton_mp.ipc.memory.response_cache import CacheStats, SharedResponseCache
from triton_mp.ipc.memory.ring import Ring
from triton_mp.ipc.memory.topology import process_arena_prefix
from triton_mp.ipc.protocol.messages import ToFrontend
from triton_mp.ipc.recordio.codec import Decoder

if TYPE_CHECKING:
    from triton_mp.frontend.cache.redis_store import RedisStore
from triton_mp.ipc.protocol.specs import FrontendSpec

log = logging.getLogger(__name__)

DRAIN_LINGER_S = 1.0
"""After the last in-flight request of a drain is answered, how long the frontend keeps its
connections before it closes them (within ``--exit-timeout-secs``)."""


def _client_shm(spec: FrontendSpec, peers: dict[int, Sender]) -> ShmPeers:
    """This frontend's system shared-memory regions, with its CUDA regions beside them, and
    its end of the changes every frontend applies (``frontend.shm.peers``)."""
    shm = SystemShmRegistry(
        spec.frontend_id,
        enabled=spec.allow_client_shm,
        allowed_prefix=spec.client_shm_prefix,
        first_id=spec.first_request_id,
    )
    shm.cuda = CudaShmRegistry(
        spec.gpu_ids,
        enabled=spec.allow_client_shm,
        taken=shm.has,
        disabled_message=DISABLED_MESSAGE,
        frontend_id=spec.frontend_id,
    )
    return ShmPeers(spec.frontend_id, shm, {j: p.send_bytes for j, p in peers.items()})


def build_api(
    spec: FrontendSpec,
    *,
    models: ModelTable,
    shm: ShmPeers,
    arena: ArenaAllocator,
    cache: SegmentCache,
    pending: PendingTable,
    send_scheduler: Callable[[bytes], None],
    send_peers: Callable[[bytes], None],
    link: SupervisorLink,
    response_cache: ResponseCacheStep | None = None,
    inbox: InboxHandler | None = None,
    direct: DirectRoutes | None = None,
    wakes: HeldWakes | None = None,
) -> FrontendApi:
    """The transport-free core of one frontend, over its parts.

    Args:
        shm: the client shared-memory regions, with the other frontends' end of their
            changes (``frontend.shm.peers``).
        send_scheduler: pushes encoded bytes to the scheduler.
        send_peers: pushes encoded bytes to every other frontend (trace and log settings).
        response_cache: the response cache step; None without a cache.
        inbox: the inbox handler; the other frontends' trace settings updates it receives
            go to this frontend's tracer.
        direct: the routes requests are handed to idle instances by (``frontend.dispatch.direct``).
        wakes: the requests' sends to the scheduler, whose wakes a batch of requests can
            hold (``frontend.dispatch.wakes``); None: ``send_scheduler``, a wake each.
    """
    fid = spec.frontend_id
    tracer = build_tracer(spec, send_peers)
    readiness = ReadinessChecks(fid, send_scheduler)
    stats = StatsApi(frontend_id=fid, models=models, pending=pending, send_scheduler=send_scheduler)
    stats.frontend_restarts.update(spec.frontend_restarts)
    if inbox is not None:
        inbox.on_trace_setting = tracer.apply_peer
        inbox.readiness = readiness
        inbox.frontend_restarts = stats.frontend_restarts
    native_patch = record_patch()
    if native_patch is not None:
        use_patch(native_patch)  # NOTE: known requests' records patched in C++
    inference = Inference(
        frontend_id=fid,
        models=models,
        shm=shm.registry,
        arena=arena,
        cache=cache,
        pending=pending,
        send_scheduler=send_scheduler,
        response_cache=response_cache,
        direct=direct,
        wakes=wakes,
        # NOTE: --metrics-config histogram_latencies=true, on this process's board
        latency=FirstResponseHistograms(process_arena_prefix(spec.arena_prefix, os.getpid()))
        if spec.latency_histograms
        else None,
    )
    return FrontendApi(
        server=ServerApi(
            server_name=spec.server_name,
            models=models,
            inference=inference,
            strict_readiness=spec.strict_readiness,
            readiness=readiness,
        ),
        inference=inference,
        repository=RepositoryApi(
            models=models,
            model_control_mode=spec.model_control_mode,
            link=link,
            repository=spec.repository,
        ),
        stats=stats,
        shm=ClientShmApi(shm),
        tracer=tracer,
        logs=LogControl(fid, send_scheduler, send_peers if spec.to_peers else None, link.notify),
    )


def build_tracer(spec: FrontendSpec, send_peers: Callable[[bytes], None] | None = None) -> Tracer:
    """This frontend's tracer; in opentelemetry mode with its OTLP/HTTP exporter (the SDK is
    imported only then)."""
    exporter = None
    if spec.trace.mode == "opentelemetry" and spec.trace.enabled:
        from triton_mp.frontend.tracing.otel import OtelExporter

        exporter = OtelExporter(spec.trace)
    return Tracer(
        spec.trace,
        frontend_id=spec.frontend_id,
        frontends=len(spec.to_peers) + 1,
        exporter=exporter,
        send_peers=send_peers if spec.to_peers else None,
    )


async def _start_http(spec: FrontendSpec, api: FrontendApi) -> HttpFrontend | str | None:
    """The HTTP endpoint, serving; None when disabled; the startup error's text."""
    if not spec.allow_http:
        return None
    http = HttpFrontend(
        api,
        spec.http_restricted,
        max_input_bytes=spec.http_max_input_bytes,
        forward=HeaderForward(spec.http_header_forward_pattern),
    )
    try:
        await http.start(spec.http_address, spec.http_port)
    except OSError as e:
        return f"failed to bind HTTP address {spec.http_address}:{spec.http_port} ({e.strerror})"
    return http


class _CacheView:
    """The response cache as the metrics endpoint reads it (``metrics.CacheView``)."""

    def __init__(self, models: ModelTable, store: SharedResponseCache | RedisStore) -> None:
        self._models = models
        # NOTE: only the local cache keeps statistics here (Redis's are its own).
        self._local = store if isinstance(store, SharedResponseCache) else None

    def models(self) -> frozenset[str]:
        return frozenset(m.name for m in self._models if cache_enabled(m.config))

    def stats(self) -> CacheStats | None:
        return self._local.stats() if self._local is not None else None


def _open_cache(spec: FrontendSpec) -> SharedResponseCache | RedisStore | str | None:
    """The response cache's store (None without a cache), or why it cannot be opened: Redis
    cannot be reached ("Failed to initialize RedisCache: ...", a ``StartupError``)."""
    if spec.cache is None:
        return None
    if spec.cache.kind == "local":
        return SharedResponseCache.attach(spec.cache_segment)
    # NOTE: imported here: only a server with a Redis cache loads the redis package.
    from triton_mp.frontend.cache.redis_store import RedisStore

    try:
        return RedisStore.connect(spec.cache.settings)
    except StartupError as e:
        return e.message


async def _start_metrics(
    spec: FrontendSpec,
    pending: PendingTable,
    send: Callable[[bytes], None],
    cache: _CacheView | None = None,
    frontend_restarts: dict[int, int] | None = None,
    models: ModelTable | None = None,
    native: NativePort | None = None,
) -> MetricsEndpoint | str | None:
    """The metrics endpoint, serving; None when disabled; the startup error's text
    (``native``: the native server, whose gRPC thread's known-call counters it shows)."""
    if spec.metrics is None:
        return None

    def config_of(name: str) -> mc.ModelConfig | None:
        try:
            return None if models is None else models.get(name).config
        except TritonMPError:
            return None  # NOTE: unloaded since the statistics were taken

    metrics = MetricsEndpoint(
        spec.metrics,
        frontend_id=spec.frontend_id,
        pending=pending,
        send_scheduler=send,
        supervisor_pid=os.getppid(),
        cache=cache,
        frontend_restarts=frontend_restarts,
        latency_configs=config_of if spec.latency_histograms else None,
        native_known=None if native is None or native.teacher is None else native.teacher.stats,
    )
    try:
        await metrics.start()
    except TritonMPError as e:
        return e.message
    return metrics


def _log_listening(spec: FrontendSpec, http: HttpFrontend | None, native: bool) -> None:
    if spec.allow_grpc:
        how = " (TLS)" if spec.grpc_tls else " (native)" if native else ""
        log.info("gRPC frontend listening on %s:%s%s", spec.grpc_address, spec.grpc_port, how)
    for category, (key, _) in sorted(spec.grpc_restricted.items()):
        log.info("gRPC '%s' protocol restricted to header triton-grpc-protocol-%s", category, key)
    if spec.allow_grpc and spec.grpc_header_forward_pattern:
        log.info(
            "gRPC headers matching '%s' forwarded as parameters", spec.grpc_header_forward_pattern
        )
    if http is not None:
        log.info("HTTP frontend listening on %s:%d", spec.http_address, spec.http_port)
        if spec.http_header_forward_pattern:
            log.info(
                "HTTP headers matching '%s' forwarded as parameters",
                spec.http_header_forward_pattern,
            )
        for category, (key, _) in sorted(spec.http_restricted.items()):
            log.info("HTTP '%s' API restricted to header %s", category, key)


async def _drain(
    spec: FrontendSpec,
    inference: Inference,
    pending: PendingTable,
    server: grpc.aio.Server,
    http: HttpFrontend | None,
    native: NativePort | None,
) -> bool:
    """Refuse new requests, await the accepted ones (up to ``exit_timeout_s``), then stop
    the transports (and unlink the latency histograms' board). Returns whether a transport's
    stop had to cut calls still running at the end of the budget (gRPC answers not produced,
    or produced and not sent; HTTP answers not sent: a client that does not read)."""
    loop = asyncio.get_running_loop()
    # NOTE: as Triton does, keep listening while draining: health answers not-ready and new
    # inferences get UNAVAILABLE "Server is stopping..." until in-flight ones are answered.
    inference.start_draining()
    log.info("draining: %d requests in flight, up to %.1f s", len(pending), spec.exit_timeout_s)
    deadline = loop.time() + spec.exit_timeout_s
    answered_some = bool(len(pending))
    await inference.wait_drained(spec.exit_timeout_s)
    if answered_some:
        # NOTE: an answered request's response may still be on its way (grpc has written
        # the last bytes to the socket, the client has not read them): closing the
        # connection now can reset it and lose the response's tail. Give clients a moment.
        await asyncio.sleep(max(0.0, min(DRAIN_LINGER_S, deadline - loop.time())))
    cut = False
    if http is not None:
        cut = await http.stop(max(0.0, deadline - loop.time()))
    if native is not None:
        cut = await native.stop(max(0.5, deadline - loop.time())) or cut
    public = spec.grpc_port if native is None and spec.grpc_port else None
    cut = await stop_grpc(server, max(0.5, deadline - loop.time()), public) or cut
    inference.close()
    if cut:
        log.warning("exit timeout: cut calls whose answers were not sent")
    return cut


def _input_arena(spec: FrontendSpec, cache: SegmentCache) -> ArenaAllocator:
    """This process's input arenas: named by its pid, so a frontend restarted in a dead
    one's place allocates new objects, never ones workers still map (``ipc.memory.topology``)."""
    owner = process_arena_prefix(spec.arena_prefix, os.getpid())
    twin = input_arena_type()  # NOTE: the C++ allocator where the extension is built
    if twin is None:
        return ArenaAllocator(owner, spec.arena_bytes, spec.arena_budget_bytes, cache)
    return ArenaAllocator(owner, spec.arena_bytes, spec.arena_budget_bytes, cache, twin)


def _to_scheduler(spec: FrontendSpec) -> Sender:
    """The ring to the scheduler, its pushes in C++ under the lock the gRPC thread shares
    where the extension is built (``frontend.native.shared_ring``)."""
    attach = shared_ring_attach() or Ring.attach
    return Sender(spec.to_scheduler.ring, spec.to_scheduler.wakeup, attach=attach)


def _shared_allowance(to_scheduler: Sender) -> SharedAllowance | None:
    """The forming allowance of the C++ producer of the ring to the scheduler, where there is
    one (the gRPC thread counts its known calls in it too: ``dispatch.wakes``'
    ``SharedAllowance``); None: ``HeldWakes`` keeps its own."""
    if getattr(to_scheduler.ring, "producer", None) is None:
        return None
    module = importlib.import_module("triton_mp.frontend.native._native")
    return SharedAllowance(module.known_wake_join)


def _outstanding(pending: PendingTable, native: NativePort | None) -> Callable[[], int]:
    """The answers this process awaits (``PollingSelector.watch``: its early-wake and
    answer-due polls): the pending table's, and the known calls the native gRPC thread keeps,
    whose answers reach C++ only through this loop's inbox pass."""
    if native is None:
        return pending.__len__
    return lambda: len(pending) + native.owned()


def _direct_routes(spec: FrontendSpec, to_scheduler: Sender) -> DirectRoutes:
    """This frontend's routes to idle instances (``dispatch.direct``), each ring into a
    worker's inbox with its pushes in C++ where the extension is built (the gRPC thread
    hands its known calls over them too: ``_known_wiring``)."""
    attach = shared_ring_attach() or Ring.attach
    direct = DirectRoutes(
        spec.frontend_id, to_scheduler.push_quiet, to_scheduler.send_bytes, attach=attach
    )
    direct.update(spec.direct_routes)
    return direct


def _known_wiring(
    spec: FrontendSpec,
    to_scheduler: Sender,
    arena: ArenaAllocator,
    api: FrontendApi,
    inbox: InboxHandler,
    direct: DirectRoutes,
) -> Wiring | None:
    """What the native gRPC thread submits known calls with: the C++ producer of the ring
    to the scheduler and its wake-up semaphore (None where either is not there), and the
    direct routes, opened in C++ too (``DirectRoutes.mirror``)."""
    producer = getattr(to_scheduler.ring, "producer", None)
    if producer is None or spec.to_scheduler.wakeup.kind != "semaphore":
        return None
    native = importlib.import_module("triton_mp.frontend.native._native")
    native.direct_full_timeout(to_scheduler.full_timeout_s)
    direct.mirror(native)
    return Wiring(
        producer,
        spec.to_scheduler.wakeup.name,
        arena,
        api.tracer,
        inbox,
        api.shm.registry,
        to_scheduler.full_error,
    )


def _broadcast(to_peers: dict[int, Sender]) -> Callable[[bytes], None]:
    """Pushes encoded bytes to every other frontend."""

    def send_peers(data: bytes) -> None:
        for peer in to_peers.values():
            peer.send_bytes(data)

    return send_peers


async def serve(spec: FrontendSpec, ready: Connection, selector: PollingSelector) -> int:
    """Serve until SIGTERM, then drain. Returns the exit status (``run_frontend``)."""
    loop = asyncio.get_running_loop()
    name = str(spec.frontend_id)
    inbox: Inbox[ToFrontend] = Inbox(spec.inbox.wakeup, spec.inbox.rings, ToFrontend)
    to_scheduler = _to_scheduler(spec)
    peers = {j: Sender(c.ring, c.wakeup) for j, c in sorted(spec.to_peers.items())}
    cache = SegmentCache()
    arena = _input_arena(spec, cache)
    pending = PendingTable(cache, spec.first_request_id)
    models = ModelTable(spec.models)
    shm = _client_shm(spec, peers)
    direct = _direct_routes(spec, to_scheduler)
    scheduler_waker = Waker(spec.to_scheduler.wakeup)
    wakes = HeldWakes.over(to_scheduler, scheduler_waker.wake, _shared_allowance(to_scheduler))
    handler = InboxHandler(inbox, pending, shm.on_record, models, cache, direct)
    handler.resend_shm = shm.resend
    link = SupervisorLink(ready, handler.on_table_update)
    store = _open_cache(spec)
    if isinstance(store, str):
        report_start_failed(ready, "frontend", name, store)
        return 1
    step = None if store is None else ResponseCacheStep(store, to_scheduler.send_bytes, cache)
    api = build_api(
        spec,
        models=models,
        shm=shm,
        arena=arena,
        cache=cache,
        pending=pending,
        send_scheduler=to_scheduler.send_bytes,
        send_peers=_broadcast(peers),
        link=link,
        response_cache=step,
        inbox=handler,
        direct=direct,
        wakes=wakes,
    )
    handler.on_wakeup()  # NOTE: a restarted frontend's resent shm regions, before it serves
    server, servicer = grpc_server(spec, api)
    wiring = _known_wiring(spec, to_scheduler, arena, api, handler, direct)
    native = native_port(spec, servicer, wiring)
    failed = await start_grpc(server, spec, native)
    if failed:
        report_start_failed(ready, "frontend", name, failed)
        return 1
    http = await _start_http(spec, api)
    if isinstance(http, str):
        report_start_failed(ready, "frontend", name, http)
        await stop_grpc_now(server, native)
        return 1
    handler.watch(loop, selector, _outstanding(pending, native))
    view = None if store is None else _CacheView(models, store)
    metrics = await _start_metrics(
        spec, pending, to_scheduler.send_bytes, view, api.stats.frontend_restarts, models, native
    )
    if isinstance(metrics, str):
        report_start_failed(ready, "frontend", name, metrics)
        await stop_grpc_now(server, native)
        return 1
    stopping = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stopping.set)
    tune_gc()
    report_ready(ready, "frontend", name)
    link.start(loop)
    _log_listening(spec, http, native is not None)
    await stopping.wait()
    cut = await _drain(spec, api.inference, pending, server, http, native)
    api.tracer.close()
    if metrics is not None:
        await metrics.stop()
    handler.unwatch()
    link.stop(loop)
    arena.close_and_unlink()
    scheduler_waker.close()
    if store is not None:
        store.close()
    log.info("frontend stopped")
    return CALLS_CUT_EXIT if cut else 0


def run_frontend(spec_bytes: bytes, ready: Connection) -> int:
    """Process entry of a frontend.

    Args:
        spec_bytes: a msgpack-encoded ``FrontendSpec``.
        ready: the pipe to the supervisor: ``ipc.handshake`` once the ports are bound, then
            the control pipe.

    Returns:
        The exit status: 0 after a clean drain, ``CALLS_CUT_EXIT`` when the drain's budget
        ran out with gRPC calls unfinished, 1 when the start failed.
    """
    spec: FrontendSpec = Decoder(FrontendSpec).decode(spec_bytes)
    lg = spec.log
    configure_logging(
        "frontend", str(spec.frontend_id), lg.verbose, lg.format, levels=lg.levels, file=lg.file
    )
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # NOTE: the loop polls the inbox rings between events (frontend.dispatch.polling_loop).
    selector = PollingSelector()
    with asyncio.Runner(loop_factory=lambda: asyncio.SelectorEventLoop(selector)) as runner:
        return runner.run(serve(spec, ready, selector))
