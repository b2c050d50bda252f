"""One metrics snapshot as Prometheus text: Triton's ``nv_*`` families and triton-mp's own.

Imported by ``frontend.metrics.endpoint`` (the endpoint takes the snapshot and answers with this);
pure, unit-testable without a server. ``MetricsSnapshot`` is the plain data of one scrape,
``SnapshotCollector`` turns it into Prometheus metric families and ``render`` writes the
text format 0.0.4, python models' custom families (``frontend.metrics.custom``) last.

Triton's families keep Triton's names, help strings, types and labels (``model``,
``version``; ``reason`` on failures, all four reasons present), so existing dashboards work.
Durations are reported in whole microseconds of the scheduler's nanosecond totals. Ours
are named ``triton_mp_*`` and follow Prometheus conventions (counters end in ``_total``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from triton_mp.common.close_reason import CloseReason
from triton_mp.frontend.metrics import cache as cache_metrics
from triton_mp.frontend.metrics import custom as custom_metrics
from triton_mp.frontend.metrics.gpu import GPU_COUNTERS, GpuReading, gpu_families
from triton_mp.frontend.metrics.host import CpuSample, ProcessMemory, cpu_families
from triton_mp.ipc.memory.response_cache import CacheStats
from triton_mp.ipc.protocol.reports import ModelQueueStatus, ModelStats

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
    """Every GPU's latest sample (``frontend.metrics.gpu``); empty without GPU metrics."""
    processes: tuple[ProcessMemory, ...] = ()
    custom: tuple[custom_metrics.Family, ...] = ()
    """Python models' custom metric families, merged over their instances."""
    cached_models: frozenset[str] = frozenset()
    """Models served with the response cache (their ``nv_cache_*_per_model`` counters)."""
    cache: CacheStats | None = None
    """The local response cache's counters; None for Redis or without a cache."""
    tensor_bytes: dict[str, int] | None = None
    """``PendingTable.copied_bytes`` of the frontend that serves the metrics."""
    frontend_restarts: dict[int, int] | None = None
    """Per frontend id, the supervisor's restarts of it
    (``supervisor.processes.frontend_restart``)."""
    native_known: dict[str, int] | None = None
    """The native gRPC thread's known calls by outcome (``frontend.native.known_teach``:
    sent, declined, ..., and ``cleared``: times it was un-taught); None: no such thread."""
    refused_frees: int | None = None
    """Arena block frees the frontend that serves the metrics refused
    (``ipc.tensor_pool.stray_frees``); None where not known."""


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
            yield from cpu_families(self._snap.cpu)
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
                "Tensor bytes this frontend copied: into its arena (in), out to answers (out); "
                "out_in_place: output bytes its answers sent uncopied from the workers' arenas "
                "or the request's own input block",
                labels=("direction",),
            )
            for direction, n in self._snap.tensor_bytes.items():
                copied.add_metric((direction,), n)
            yield copied
        if self._snap.frontend_restarts is not None:
            restarts = CounterMetricFamily(
                "triton_mp_frontend_restarts",
                "Times the frontend process came back after it died",
                labels=("frontend",),
            )
            for fid, n in sorted(self._snap.frontend_restarts.items()):
                restarts.add_metric((str(fid),), n)
            yield restarts
        if self._snap.native_known is not None:
            known = CounterMetricFamily(
                "triton_mp_frontend_native_known_calls",
                "Known unary ModelInfer calls the native gRPC thread took, by outcome (sent: "
                "submitted without Python, direct_handed of them straight to an idle instance; "
                "the others were left to Python; cleared: un-teachings)",
                labels=("outcome",),
            )
            for outcome, n in sorted(self._snap.native_known.items()):
                known.add_metric((outcome,), n)
            yield known
        if self._snap.refused_frees is not None:
            yield CounterMetricFamily(
                "triton_mp_frontend_refused_frees",
                "Frees of shared-memory tensor blocks this frontend refused because the block "
                "was freed already or its room reused; each one is a bug, 0 is expected",
                value=self._snap.refused_frees,
            )


def render(snapshot: MetricsSnapshot) -> bytes:
    """The snapshot in Prometheus text format 0.0.4 (what ``GET /metrics`` answers)."""
    families = list(SnapshotCollector(snapshot).collect())
    text = "".join(map(_family_text, families))
    if snapshot.custom:
        taken = {f.name for f in families} | {s.name for f in families for s in f.samples}
        text += custom_metrics.render(snapshot.custom, taken)
    return text.encode()


_TRITON_NAMED = frozenset((*TRITON_COUNTERS, *cache_metrics.MODEL_COUNTERS, *GPU_COUNTERS))
"""Counter families named as Triton names them: no ``_total`` (dashboards query these)."""


def _family_text(family: Metric) -> str:
    """One family as prometheus-client's ``generate_latest`` lays it out (a counter is
    ``<name>_total`` in HELP and TYPE unless Triton names it; labels in name order), with
    values written as Triton's prometheus-cpp writes them (``custom.format_value``: ``5``,
    not prometheus-client's ``5.0``)."""
    name = family.name
    if family.type == "counter" and name not in _TRITON_NAMED:
        name += "_total"
    help_text = family.documentation.replace("\\", "\\\\").replace("\n", "\\n")
    lines = [f"# HELP {name} {help_text}\n", f"# TYPE {name} {family.type}\n"]
    for s in family.samples:
        value = custom_metrics.format_value(s.value)
        lines.append(custom_metrics.sample_line(s.name, sorted(s.labels.items()), value))
    return "".join(lines)
