"""Prometheus metrics on ``--metrics-port``: Triton's ``nv_*`` families and triton-mp's own.

Imported by the frontend; frontend 0 serves ``GET /metrics`` on its asyncio loop (Triton
has one metrics endpoint per server). Nothing is counted here. The scheduler sees every
request of every frontend and keeps Triton's ModelStatistics and the queue state, so each
scrape asks it for both (``StatsQuery``, ``QueueQuery``), reads the memory of every
triton-mp process with psutil, and renders that one snapshot:

- ``MetricsSnapshot`` is the plain data, ``SnapshotCollector`` turns it into Prometheus
  metric families and ``render`` writes the text format (unit-testable without a server);
- ``MetricsEndpoint`` is the aiohttp server, the scheduler queries and the CPU and GPU
  poller (``frontend.gpu_metrics``: Triton's ``nv_gpu_*`` families per ``gpu_uuid``).

Python models' custom metrics (``pb_utils.MetricFamily``) come last: each scrape also
copies the workers' shared-memory boards, which ``frontend.custom_metrics`` merges and writes.

Triton's families keep Triton's names, help strings, types and labels (``model``,
``version``; ``reason`` on failures, all four reasons present), so existing dashboards work.
Durations are reported in whole microseconds of the scheduler's nanosecond totals. Ours
are named ``triton_mp_*`` and follow Prometheus conventions (counters end in ``_total``).
"""

from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Protocol

import psutil
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from triton_mp.common.close_reason import CloseReason
from triton_mp.common.errors import StartupError
from triton_mp.common.gpus import NvmlUnavailable, nvml_from_env
from triton_mp.frontend import cache_metrics, custom_metrics
from triton_mp.frontend.gpu_metrics import GPU_COUNTERS, GpuGauges, GpuReading, gpu_families
from triton_mp.ipc.codec import encode
from triton_mp.ipc.messages import QueueQuery, QueueReply, StatsQuery, StatsReply
from triton_mp.ipc.reports import ModelQueueStatus, ModelStats
from triton_mp.ipc.response_cache import CacheStats
from triton_mp.ipc.specs import MetricsSpec

if TYPE_CHECKING:
    from triton_mp.frontend.pending import PendingTable

log = logging.getLogger(__name__)

KNOWN_REASONS = tuple(r.value for r in CloseReason)
"""Batch close reasons reported from the start (``CloseReason`` order), 0 until seen."""
FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
"""Triton's ``nv_inference_request_failure`` reasons; every series exists from the start."""

TRITON_COUNTERS = {
    "nv_inference_request_success": "Number of successful inference requests, all batch sizes",
    "nv_inference_request_failure": "Number of failed inference requests, all batch sizes",
    "nv_inference_count": "Number of inferences performed (does not include cached requests)",
    "nv_inference_exec_count": (
        "Number of model executions performed (does not include cached requests)"
    ),
    "nv_inference_request_duration_us": (
        "Cumulative inference request duration in microseconds (includes cached requests)"
    ),
    "nv_inference_queue_duration_us": (
        "Cumulative inference queuing duration in microseconds (includes cached requests)"
    ),
    "nv_inference_compute_input_duration_us": (
        "Cumulative compute input duration in microseconds (does not include cached requests)"
    ),
    "nv_inference_compute_infer_duration_us": (
        "Cumulative compute inference duration in microseconds (does not include cached requests)"
    ),
    "nv_inference_compute_output_duration_us": (
        "Cumulative inference compute output duration in microseconds "
        "(does not include cached requests)"
    ),
}
"""Triton's per-model counters, in Triton's order, with Triton's help strings."""

SCHEDULER_REPLY_TIMEOUT_S = 5.0
"""How long a scrape waits for the scheduler before answering 503."""


class CacheView(Protocol):
    """What a scrape reads of the response cache (``frontend.main`` provides it)."""

    def models(self) -> frozenset[str]:
        """The models served with the cache now."""
        ...

    def stats(self) -> CacheStats | None:
        """The local cache's counters; None for Redis."""
        ...


class CpuSample(NamedTuple):
    """The machine's CPU and memory, as Triton's ``nv_cpu_*`` gauges report them."""

    utilization: float
    """Busy share of all CPUs since the previous sample, 0.0 to 1.0."""
    memory_total_bytes: int
    memory_used_bytes: int
    """Total minus available (``/proc/meminfo``), as Triton computes it."""


class ProcessMemory(NamedTuple):
    """Resident memory of one triton-mp process."""

    role: str
    """``supervisor``, ``scheduler``, ``frontend``, ``worker``, ``resource_tracker``
    (multiprocessing's helper) or ``other``."""
    instance: str
    """Frontend index, worker instance name (``add_sub_0_0``), pid (``other``) or empty."""
    rss_bytes: int


@dataclass(frozen=True)
class MetricsSnapshot:
    """Everything one scrape reports, taken at one moment."""

    stats: tuple[ModelStats, ...]
    """The scheduler's ModelStatistics per model version."""
    queues: tuple[ModelQueueStatus, ...]
    """The scheduler's queues, instances and batch histograms per model version."""
    cpu: CpuSample | None = None
    """None when ``--allow-cpu-metrics=false``."""
    gpus: tuple[GpuReading, ...] = ()
    """Every GPU's latest sample (``frontend.gpu_metrics``); empty without GPU metrics."""
    processes: tuple[ProcessMemory, ...] = ()
    custom: tuple[custom_metrics.Family, ...] = ()
    """Python models' custom metric families, merged over their instances."""
    cached_models: frozenset[str] = frozenset()
    """Models served with the response cache (their ``nv_cache_*_per_model`` counters)."""
    cache: CacheStats | None = None
    """The local response cache's counters; None for Redis or without a cache."""
    tensor_bytes: dict[str, int] | None = None
    """``PendingTable.copied_bytes`` of the frontend that serves the metrics."""


def _us(ns: int) -> int:
    return ns // 1000


def batch_size_buckets(max_batch_size: int, sizes: Iterable[int]) -> list[int]:
    """Upper bounds of the batch-size histogram: powers of two up to the largest batch the
    model can form (or did form), which is itself the last bound (``+Inf`` comes on top).

    >>> batch_size_buckets(12, [3])
    [1, 2, 4, 8, 12]
    """
    top = max(1, max_batch_size, *sizes)
    bounds = []
    b = 1
    while b < top:
        bounds.append(b)
        b *= 2
    bounds.append(top)
    return bounds


class SnapshotCollector:
    """A prometheus-client collector over one ``MetricsSnapshot`` (see ``render``)."""

    def __init__(self, snapshot: MetricsSnapshot) -> None:
        self._snap = snapshot

    def collect(self) -> Iterator[Metric]:
        """Every metric family of the snapshot: Triton's first, in Triton's order, then ours."""
        yield from self._triton_model_families()
        yield from cache_metrics.model_families(self._snap.stats, self._snap.cached_models)
        yield from cache_metrics.cache_families(self._snap.cache)
        yield from gpu_families(self._snap.gpus)
        if self._snap.cpu is not None:
            yield from self._cpu_families(self._snap.cpu)
        yield from self._queue_families()
        yield from self._process_families()

    def _triton_model_families(self) -> Iterator[Metric]:
        families = {name: Metric(name, doc, "counter") for name, doc in TRITON_COUNTERS.items()}
        pending = GaugeMetricFamily(
            "nv_inference_pending_request_count",
            "Instantaneous number of pending requests awaiting execution per-model.",
            labels=("model", "version"),
        )
        # NOTE: batches waiting for the rate limiter's resources are pending too.
        depth = {
            (q.model, q.version): sum(lv.depth for lv in q.levels)
            + sum(i.waiting_requests for i in q.instances)
            for q in self._snap.queues
        }
        for st in self._snap.stats:
            labels = {"model": st.name, "version": str(st.version)}

            def add(name: str, value: int, labels: dict[str, str] = labels) -> None:
                # NOTE: samples keep the family's name: Triton's counters have no _total.
                families[name].add_sample(name, labels, value)

            add("nv_inference_request_success", st.success.count)
            for reason in FAILURE_REASONS:
                add(
                    "nv_inference_request_failure",
                    st.fail_reasons.get(reason, 0),
                    {**labels, "reason": reason},
                )
            add("nv_inference_count", st.inference_count)
            add("nv_inference_exec_count", st.execution_count)
            add("nv_inference_request_duration_us", _us(st.success.ns))
            add("nv_inference_queue_duration_us", _us(st.queue.ns))
            add("nv_inference_compute_input_duration_us", _us(st.compute_input.ns))
            add("nv_inference_compute_infer_duration_us", _us(st.compute_infer.ns))
            add("nv_inference_compute_output_duration_us", _us(st.compute_output.ns))
            pending.add_metric((st.name, str(st.version)), depth.get((st.name, st.version), 0))
        yield from families.values()
        yield pending

    @staticmethod
    def _cpu_families(cpu: CpuSample) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]", value=cpu.utilization
        )
        yield GaugeMetricFamily(
            "nv_cpu_memory_total_bytes",
            "CPU total memory (RAM), in bytes",
            value=cpu.memory_total_bytes,
        )
        yield GaugeMetricFamily(
            "nv_cpu_memory_used_bytes",
            "CPU used memory (RAM), in bytes",
            value=cpu.memory_used_bytes,
        )

    def _queue_families(self) -> Iterator[Metric]:
        """The scheduler's queues, batches and instances, in that order."""
        yield from self._level_families()
        yield from self._batch_families()
        yield from self._instance_families()

    def _level_families(self) -> Iterator[Metric]:
        lv = ("model", "version", "level")
        depth = GaugeMetricFamily(
            "triton_mp_queue_depth",
            "Requests waiting in the scheduler's queue, per priority level (delayed included)",
            labels=lv,
        )
        delayed = GaugeMetricFamily(
            "triton_mp_queue_delayed",
            "Waiting requests whose queue timeout expired under timeout_action DELAY",
            labels=lv,
        )
        oldest = GaugeMetricFamily(
            "triton_mp_queue_oldest_age_us",
            "How long the oldest waiting request has waited, in microseconds (0 when empty)",
            labels=lv,
        )
        rejected = CounterMetricFamily(
            "triton_mp_queue_rejected",
            "Requests refused because the priority level held max_queue_size requests",
            labels=lv,
        )
        timed_out = CounterMetricFamily(
            "triton_mp_queue_timed_out",
            "Requests failed by a queue timeout under timeout_action REJECT",
            labels=lv,
        )
        for q in self._snap.queues:
            for level in q.levels:
                key = (q.model, str(q.version), str(level.level))
                depth.add_metric(key, level.depth)
                delayed.add_metric(key, level.delayed)
                oldest.add_metric(key, level.oldest_age_us)
                rejected.add_metric(key, level.rejected)
                timed_out.add_metric(key, level.timed_out)
        yield from (depth, delayed, oldest, rejected, timed_out)

    def _batch_families(self) -> Iterator[Metric]:
        mv = ("model", "version")
        batch_size = HistogramMetricFamily(
            "triton_mp_batch_size",
            "Total batch size of each batch the scheduler formed",
            labels=mv,
        )
        closed = CounterMetricFamily(
            "triton_mp_batch_close",
            "Batches formed, by why they closed: max, preferred, delay, idle, shape, single",
            labels=(*mv, "reason"),
        )
        for q in self._snap.queues:
            model = (q.model, str(q.version))
            buckets: list[tuple[str, float]] = []
            for bound in batch_size_buckets(q.max_batch_size, q.batch_sizes):
                cumulative = sum(n for size, n in q.batch_sizes.items() if size <= bound)
                buckets.append((f"{float(bound)}", cumulative))
            buckets.append(("+Inf", sum(q.batch_sizes.values())))
            batch_size.add_metric(
                model, buckets, sum_value=sum(s * n for s, n in q.batch_sizes.items())
            )
            # NOTE: every reason from the start, as Triton pre-creates its failure reasons.
            for reason in (*KNOWN_REASONS, *sorted(set(q.close_reasons) - set(KNOWN_REASONS))):
                closed.add_metric((*model, reason), q.close_reasons.get(reason, 0))
        yield from (batch_size, closed)

    def _instance_families(self) -> Iterator[Metric]:
        iv = ("model", "version", "instance")
        live = GaugeMetricFamily(
            "triton_mp_instance_live", "1 while the instance's worker serves, else 0", labels=iv
        )
        in_flight = GaugeMetricFamily(
            "triton_mp_instance_requests_in_flight",
            "Requests in the batch the instance is running",
            labels=iv,
        )
        executions = CounterMetricFamily(
            "triton_mp_instance_executions", "Batches the instance finished", labels=iv
        )
        restarts = CounterMetricFamily(
            "triton_mp_instance_restarts",
            "Times the instance's worker process came back after it died",
            labels=iv,
        )
        for q in self._snap.queues:
            for inst in q.instances:
                key = (q.model, str(q.version), inst.name)
                live.add_metric(key, 1 if inst.live else 0)
                in_flight.add_metric(key, inst.requests_in_flight)
                executions.add_metric(key, inst.executions)
                restarts.add_metric(key, inst.restarts)
        yield from (live, in_flight, executions, restarts)

    def _process_families(self) -> Iterator[Metric]:
        rss = GaugeMetricFamily(
            "triton_mp_process_resident_memory_bytes",
            "Resident memory of each triton-mp process, in bytes",
            labels=("role", "instance"),
        )
        for p in self._snap.processes:
            rss.add_metric((p.role, p.instance), p.rss_bytes)
        yield rss
        if self._snap.tensor_bytes is not None:
            copied = CounterMetricFamily(
                "triton_mp_frontend_tensor_bytes",
                "Tensor bytes this frontend copied: into its arena (in), out to answers (out)",
                labels=("direction",),
            )
            for direction, n in self._snap.tensor_bytes.items():
                copied.add_metric((direction,), n)
            yield copied


def render(snapshot: MetricsSnapshot) -> bytes:
    """The snapshot in Prometheus text format 0.0.4 (what ``GET /metrics`` answers).

    A fresh registry per call: it holds only this snapshot's collector, so concurrent
    scrapes never see each other's numbers and no process-wide registry is touched.
    """
    families = list(SnapshotCollector(snapshot).collect())
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    text = generate_latest(registry).decode()
    # NOTE: prometheus-client names a counter family ``<name>_total`` in HELP and TYPE (the
    # OpenMetrics rule) whatever its samples are called. Triton's counters have no _total,
    # and dashboards query Triton's names, so those two header lines get Triton's name back.
    for name in (*TRITON_COUNTERS, *cache_metrics.MODEL_COUNTERS, *GPU_COUNTERS):
        text = text.replace(f"# HELP {name}_total ", f"# HELP {name} ", 1)
        text = text.replace(f"# TYPE {name}_total counter", f"# TYPE {name} counter", 1)
    if snapshot.custom:
        taken = {f.name for f in families} | {s.name for f in families for s in f.samples}
        text += custom_metrics.render(snapshot.custom, taken)
    return text.encode()


class _Families:
    """A collector over families collected already (``render`` needs their names too)."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def cpu_utilization(old: object, new: object) -> float:
    """Busy share of the CPUs between two ``psutil.cpu_times()`` samples (0.0 to 1.0).

    Triton's formula (core ``metrics.cc``): busy = user + nice + system + irq + softirq +
    steal, idle = idle + iowait; counters that went backwards count as 0.
    """

    def delta(field: str) -> float:
        return max(0.0, getattr(new, field, 0.0) - getattr(old, field, 0.0))

    busy = sum(delta(f) for f in ("user", "nice", "system", "irq", "softirq", "steal"))
    idle = delta("idle") + delta("iowait")
    return busy / (busy + idle) if busy + idle > 0 else 0.0


def _memory() -> tuple[int, int]:
    vm = psutil.virtual_memory()
    return int(vm.total), int(vm.total - vm.available)


def process_memory(supervisor_pid: int) -> tuple[ProcessMemory, ...]:
    """Resident memory of the supervisor and every process it started.

    Roles and instances come from the process titles the supervisor sets
    (``triton-mp: worker add_sub_0_0``); multiprocessing's resource tracker is
    ``resource_tracker``, any other child ``other`` with its pid as instance. Processes that
    exit meanwhile are skipped.
    """
    out: list[ProcessMemory] = []
    try:
        supervisor = psutil.Process(supervisor_pid)
        out.append(ProcessMemory("supervisor", "", supervisor.memory_info().rss))
        children = supervisor.children()
    except psutil.Error:
        return ()
    for child in children:
        try:
            cmdline = child.cmdline()
            rss = child.memory_info().rss
        except psutil.Error:
            continue
        title = cmdline[0] if cmdline else ""
        if title.startswith("triton-mp: "):
            role, _, instance = title.removeprefix("triton-mp: ").partition(" ")
            out.append(ProcessMemory(role, instance.strip(), rss))
        elif any("resource_tracker" in arg for arg in cmdline):
            out.append(ProcessMemory("resource_tracker", "", rss))
        else:
            out.append(ProcessMemory("other", str(child.pid), rss))
    return tuple(out)


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
    ) -> None:
        self._spec = spec
        self._fid = frontend_id
        self._pending = pending
        self._send = send_scheduler
        self._supervisor_pid = supervisor_pid
        self._timeout_s = reply_timeout_s
        self._cache = cache
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
        app.router.add_get("/metrics", self._handle)
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
            total, used = _memory()
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
                total, used = _memory()
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
        stats, queues = await asyncio.gather(
            self._ask(lambda q: StatsQuery(query_id=q, frontend_id=self._fid)),
            self._ask(lambda q: QueueQuery(query_id=q, frontend_id=self._fid)),
        )
        assert isinstance(stats, StatsReply)
        assert isinstance(queues, QueueReply)
        custom = () if self._boards is None else tuple(custom_metrics.merge(self._boards.read()))
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
        )

    async def _handle(self, request: web.Request) -> web.Response:
        try:
            snap = await self.snapshot()
        except TimeoutError:
            return web.Response(
                status=503,
                text=f"the scheduler did not answer within {self._timeout_s:g} s\n",
            )
        return web.Response(body=render(snap), headers={"Content-Type": CONTENT_TYPE_PLAIN_0_0_4})
