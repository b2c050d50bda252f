"""OpenTelemetry mode: each finished trace as spans, exported over OTLP/HTTP.

Imported by the frontend's process shell only when ``--trace-config mode=opentelemetry``
(the SDK is not loaded otherwise). The spans are those Triton's ``TraceManager`` makes
(server ``src/tracer.cc``): a root span ``InferRequest`` with the transport's events
(GRPC_* / HTTP_*, INFER_RESPONSE_COMPLETE), under it a span named after the model (events
REQUEST_START, QUEUE_START, REQUEST_END; attributes ``triton.model_name``,
``triton.model_version``, ``triton.trace_id``, ``triton.trace_parent_id``,
``triton.request_id``) and under that a ``compute`` span (COMPUTE_*); a BLS child trace
adds its own model and compute spans under its parent's model span. A propagated W3C
``traceparent`` (gRPC metadata or HTTP header) becomes the root span's parent.

Times are wall-clock, as OpenTelemetry wants: each monotonic timestamp plus the offset
between the two clocks, read once when the exporter starts. Export is the SDK's batch span
processor (``bsp_*`` settings) with its OTLP/HTTP protobuf exporter (``opentelemetry,url``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from opentelemetry import context as otel_context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Span, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from triton_mp.common.trace_config import OTEL_SERVICE_NAME, TraceConfig
from triton_mp.frontend.tracing.tracer import Trace
from triton_mp.ipc.protocol.messages import ChildTrace

_MODEL_EVENTS = {"REQUEST_START", "QUEUE_START", "REQUEST_END"}


class OtelExporter:
    """Finished traces -> spans -> the OTLP/HTTP endpoint
    (``frontend.tracing.tracer.SpanExporter``).

    Args:
        config: the trace flags (url, resource attributes, batch span processor).
    """

    def __init__(self, config: TraceConfig) -> None:
        attributes = {"service.name": OTEL_SERVICE_NAME}
        attributes.update(dict(config.otel_resource))
        self._provider = TracerProvider(resource=Resource.create(attributes))
        self._provider.add_span_processor(
            BatchSpanProcessor(
                OTLPSpanExporter(endpoint=config.otel_url),
                max_queue_size=config.bsp_max_queue_size,
                schedule_delay_millis=config.bsp_schedule_delay_ms,
                max_export_batch_size=config.bsp_max_export_batch_size,
            )
        )
        self._tracer = self._provider.get_tracer("triton-mp")
        self._offset_ns = time.time_ns() - time.monotonic_ns()
        self._propagator = TraceContextTextMapPropagator()

    def _wall(self, ns: int) -> int:
        return ns + self._offset_ns

    def export(self, trace: Trace) -> None:
        """Turn one finished trace into its spans (they are exported in batches)."""
        stamps = sorted(trace.stamps, key=lambda s: s[1])
        if not stamps:
            return
        parent = None
        if trace.parent_context:
            parent = self._propagator.extract({"traceparent": trace.parent_context})
        root = self._tracer.start_span(
            "InferRequest", context=parent, start_time=self._wall(stamps[0][1])
        )
        for name, ns in stamps:
            if not name.startswith("COMPUTE_") and name not in _MODEL_EVENTS:
                root.add_event(name, timestamp=self._wall(ns))
        model_span = self._model_spans(
            root, trace.model, trace.version, trace.request_id, trace.id, 0, stamps
        )
        for child in trace.children:
            self._child(model_span, child, trace.id)
        root.end(end_time=self._wall(stamps[-1][1]))

    def _model_spans(
        self,
        parent: Span,
        model: str,
        version: int,
        request_id: str,
        trace_id: int,
        parent_id: int,
        stamps: Sequence[tuple[str, int]],
    ) -> Span:
        """The model span and its compute span; returns the model span (ended)."""
        model_stamps = [s for s in stamps if s[0] in _MODEL_EVENTS or s[0].startswith("COMPUTE_")]
        if not model_stamps:
            model_stamps = list(stamps)
        ctx = set_span_in_context(parent, otel_context.get_current())
        span = self._tracer.start_span(
            model, context=ctx, start_time=self._wall(model_stamps[0][1])
        )
        span.set_attribute("triton.model_name", model)
        span.set_attribute("triton.model_version", version)
        span.set_attribute("triton.trace_id", trace_id)
        span.set_attribute("triton.trace_parent_id", parent_id)
        if request_id:
            span.set_attribute("triton.request_id", request_id)
        for name, ns in model_stamps:
            if name in _MODEL_EVENTS:
                span.add_event(name, timestamp=self._wall(ns))
        compute = [s for s in model_stamps if s[0].startswith("COMPUTE_")]
        if compute:
            cctx = set_span_in_context(span, otel_context.get_current())
            cspan = self._tracer.start_span(
                "compute", context=cctx, start_time=self._wall(compute[0][1])
            )
            for name, ns in compute:
                cspan.add_event(name, timestamp=self._wall(ns))
            cspan.end(end_time=self._wall(compute[-1][1]))
        span.end(end_time=self._wall(model_stamps[-1][1]))
        return span

    def _child(self, parent: Span, child: ChildTrace, parent_id: int) -> None:
        stamps = sorted(child.stamps, key=lambda s: s[1])
        if not stamps:
            return
        span = self._model_spans(
            parent, child.model, child.version, child.request_id, 0, parent_id, stamps
        )
        for grandchild in child.children:
            self._child(span, grandchild, 0)

    def close(self) -> None:
        """Export what is queued, then stop."""
        self._provider.force_flush()
        self._provider.shutdown()
