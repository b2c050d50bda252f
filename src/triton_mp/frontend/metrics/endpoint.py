"""Prometheus metrics on ``--metrics-port``: the ``GET /metrics`` endpoint.

Imported by the frontend; frontend 0 serves ``GET /metrics`` on its asyncio loop (Triton
has one metrics endpoint per server). Nothing is counted here. The scheduler sees every
request of every frontend and keeps Triton's ModelStatistics and the queue state, so each
scrape asks it for both (``StatsQuery``, ``QueueQuery``), reads the memory of every
triton-mp process (``frontend.metrics.host``) and renders that one snapshot
(``frontend.metrics.render``). ``MetricsEndpoint`` is the aiohttp server, the scheduler
queries and the CPU and GPU poller (``frontend.metrics.gpu``: Triton's ``nv_gpu_*``
families per ``gpu_uuid``).

Python models' custom metrics (``pb_utils.MetricFamily``) come last: each scrape also
copies the workers' shared-memory boards, which ``frontend.metrics.custom`` merges and writes.
"""

from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import psutil
from aiohttp import web

from triton_mp._proto import model_config_pb2 as mc
from triton_mp.common.errors import StartupError
from triton_mp.common.process.gpus import NvmlUnavailable, nvml_from_env
from triton_mp.frontend.metrics import custom as custom_metrics
from triton_mp.frontend.metrics import latency as latency_metrics
from triton_mp.frontend.metrics.gpu import GpuGauges
from triton_mp.frontend.metrics.host import (
    CpuSample,
    cpu_utilization,
    memory_bytes,
    process_memory,
)
from triton_mp.frontend.metrics.render import MetricsSnapshot, render
from triton_mp.ipc.memory.response_cache import CacheStats
from triton_mp.ipc.protocol.messages import QueueQuery, QueueReply, StatsQuery, StatsReply
from triton_mp.ipc.protocol.specs import MetricsSpec
from triton_mp.ipc.recordio.codec import encode
from triton_mp.ipc.tensor_pool import stray_frees

if TYPE_CHECKING:
    from triton_mp.frontend.dispatch.pending import PendingTable

log = logging.getLogger(__name__)

SCHEDULER_REPLY_TIMEOUT_S = 5.0
"""How long a scrape waits for the scheduler before answering 503."""

CONTENT_TYPE = "text/plain; charset=utf-8"
"""2.51's metrics port's ``Content-Type`` (on a 405: libevhtp's ``text/plain``)."""


class CacheView(Protocol):
    """What a scrape reads of the response cache (``frontend.main`` provides it)."""

    def models(self) -> frozenset[str]:
        """The models served with the cache now."""
        ...

    def stats(self) -> CacheStats | None:
        """The local cache's counters; None for Redis."""
        ...


def _gpu_gauges(spec: MetricsSpec) -> GpuGauges | None:
    """The GPU sampler for ``spec.gpus`` (None: no GPU metrics, or NVML is gone)."""
    if not spec.gpus:
        return None
    try:
        return GpuGauges(spec.gpus, nvml_from_env())
    except NvmlUnavailable as e:
        log.warning("GPU metrics will not be available: %s", e)
        return None


class MetricsEndpoint:
    """``GET /metrics`` on ``spec.address:spec.port`` (aiohttp, on the frontend's loop).

    Args:
        spec: address, port, whether to report CPU gauges and how often to sample them.
        frontend_id: this frontend's index (the scheduler answers on its inbox).
        pending: the table the scheduler's replies are delivered to.
        send_scheduler: pushes encoded bytes to the scheduler.
        supervisor_pid: whose process tree's memory is reported.
        reply_timeout_s: how long a scrape waits for the scheduler before answering 503.
        cache: the response cache's models and counters; None without a cache.
        frontend_restarts: the frontends' restart counts (``StatsApi.frontend_restarts``,
            kept up to date by the inbox handler).
        latency_configs: a model's config by name, when ``histogram_latencies`` is on
            (``latency_metrics.loaded_series``: every loaded version has its series).
        native_known: the native gRPC thread's known-call counters
            (``frontend.native.known_teach.NativeKnown.stats``); None: none.
    """

    def __init__(
        self,
        spec: MetricsSpec,
        *,
        frontend_id: int,
        pending: PendingTable,
        send_scheduler: Callable[[bytes], None],
        supervisor_pid: int,
        reply_timeout_s: float = SCHEDULER_REPLY_TIMEOUT_S,
        cache: CacheView | None = None,
        frontend_restarts: dict[int, int] | None = None,
        latency_configs: Callable[[str], mc.ModelConfig | None] | None = None,
        native_known: Callable[[], dict[str, int]] | None = None,
    ) -> None:
        self._spec = spec
        self._native_known = native_known
        self._latency_configs = latency_configs
        self._fid = frontend_id
        self._pending = pending
        self._send = send_scheduler
        self._supervisor_pid = supervisor_pid
        self._timeout_s = reply_timeout_s
        self._cache = cache
        self._restarts = frontend_restarts if frontend_restarts is not None else {}
        self._runner: web.AppRunner | None = None
        self._poller: asyncio.Task[None] | None = None
        self._cpu: CpuSample | None = None
        self._gpus: GpuGauges | None = None
        self._boards = custom_metrics.BoardReader(spec.server_id) if spec.server_id else None
        self.port = spec.port
        """The bound port (the real one when ``spec.port`` is 0)."""

    async def start(self) -> None:
        """Bind and serve; start sampling the CPU gauges.

        Raises:
            StartupError: the address cannot be bound (in use, not local), worded as
                Triton's ``failed to start Metrics service: ...``.
        """
        app = web.Application()
        # NOTE: one handler for every path and verb, as Triton's HTTPMetricsServer::Handle.
        app.router.add_route("*", "/{path:.*}", self._handle)
        # NOTE: no access log: a scrape every few seconds would drown the server's log.
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self._spec.address, self._spec.port)
        try:
            await site.start()
        except OSError as e:
            await runner.cleanup()
            where = f"{self._spec.address}:{self._spec.port}"
            raise StartupError(
                f"failed to start Metrics service: Socket '{where}' already in use ({e.strerror})"
                if e.errno == errno.EADDRINUSE
                else f"failed to start Metrics service on '{where}': {e.strerror}"
            ) from None
        self._runner = runner
        self.port = int(runner.addresses[0][1])
        if self._spec.cpu_metrics:
            total, used = memory_bytes()
            self._cpu = CpuSample(0.0, total, used)
        self._gpus = _gpu_gauges(self._spec)
        if self._gpus is not None:
            self._gpus.sample()
        if self._spec.cpu_metrics or self._gpus is not None:
            self._poller = asyncio.create_task(self._poll())
        log.info("metrics served on %s:%d/metrics", self._spec.address, self.port)

    async def stop(self) -> None:
        """Stop serving (idempotent)."""
        if self._poller is not None:
            self._poller.cancel()
            self._poller = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._boards is not None:
            self._boards.close()

    async def _poll(self) -> None:
        """Sample the CPU and GPU gauges every ``interval_ms``, as Triton's polling thread
        does (NVML reads are short blocking calls: they run off the event loop)."""
        last = psutil.cpu_times()
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self._spec.interval_ms / 1000)
            if self._spec.cpu_metrics:
                now = psutil.cpu_times()
                total, used = memory_bytes()
                self._cpu = CpuSample(cpu_utilization(last, now), total, used)
                last = now
            if self._gpus is not None:
                await loop.run_in_executor(None, self._gpus.sample)

    async def _ask(self, make: Callable[[int], StatsQuery | QueueQuery]) -> StatsReply | QueueReply:
        qid, fut = self._pending.new_query()
        self._send(encode(make(qid)))
        try:
            return await asyncio.wait_for(fut, self._timeout_s)
        except BaseException:  # timed out, or the scrape went away
            self._pending.forget_query(qid)
            raise

    async def snapshot(self) -> MetricsSnapshot:
        """Ask the scheduler for statistics and queues (both at once) and read memory.

        Raises:
            TimeoutError: the scheduler did not answer within ``reply_timeout_s``.
        """
        asks = [
            asyncio.ensure_future(
                self._ask(lambda q: StatsQuery(query_id=q, frontend_id=self._fid))
            ),
            asyncio.ensure_future(
                self._ask(lambda q: QueueQuery(query_id=q, frontend_id=self._fid))
            ),
        ]
        try:
            stats, queues = await asyncio.gather(*asks)
        except BaseException:
            # NOTE: gather leaves the other ask waiting: cancelled here, it forgets its query
            # before the 503 goes out, not at its own timeout (a loaded machine saw it left)
            for ask in asks:
                ask.cancel()
            await asyncio.gather(*asks, return_exceptions=True)
            raise
        assert isinstance(stats, StatsReply)
        assert isinstance(queues, QueueReply)
        merged = [] if self._boards is None else custom_metrics.merge(self._boards.read())
        if self._latency_configs is not None:
            versions = [(s.name, s.version) for s in stats.stats]
            merged = latency_metrics.loaded_series(merged, versions, self._latency_configs)
        custom = tuple(merged)
        return MetricsSnapshot(
            stats=stats.stats,
            queues=queues.models,
            cpu=self._cpu,
            gpus=self._gpus.readings if self._gpus is not None else (),
            processes=process_memory(self._supervisor_pid),
            custom=custom,
            cached_models=self._cache.models() if self._cache is not None else frozenset(),
            cache=self._cache.stats() if self._cache is not None else None,
            tensor_bytes=dict(self._pending.copied_bytes),
            frontend_restarts=dict(self._restarts),
            native_known=None if self._native_known is None else self._native_known(),
            refused_frees=stray_frees(),
        )

    async def _handle(self, request: web.Request) -> web.Response:
        """2.51's answers: 405 (a JSON error labelled text/plain) to any verb but GET, the
        metrics on ``/metrics`` (a query string allowed), 200 with no body on other paths."""
        if request.method != "GET":
            body = b'{"error":"Method Not Allowed"}'
            return web.Response(status=405, body=body, content_type="text/plain")
        headers = {"Content-Type": CONTENT_TYPE}
        if request.raw_path.split("?", 1)[0] != "/metrics":
            return web.Response(headers=headers)
        try:
            snap = await self.snapshot()
        except TimeoutError:
            return web.Response(
                status=503,
                text=f"the scheduler did not answer within {self._timeout_s:g} s\n",
            )
        return web.Response(body=render(snap), headers=headers)
