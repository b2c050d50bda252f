"""Request tracing in the frontend: sampling, the trace of one request, writing it out.

Imported by the frontend only; no transport. A transport asks ``Tracer.sample`` whether a
request is traced once it knows the model (one attribute check, ``Tracer.active``, when
tracing is off). A traced request's ``Trace`` collects Triton's timestamps where they happen:

- the transport: ``GRPC_WAITREAD_START/END`` or ``HTTP_RECV_START/END``, then
  ``GRPC_SEND_START/END`` or ``HTTP_SEND_START/END`` around each response it sends;
- the core (``frontend.inference``, ``frontend.dispatch.ticket``): ``REQUEST_START`` when the
  request is accepted (its ``arrival_ns``), ``INFER_RESPONSE_COMPLETE`` as each response arrives,
  ``REQUEST_END`` with the final one;
- the scheduler (``QUEUE_START``) and the worker (``COMPUTE_START``, ``COMPUTE_INPUT_END``,
  ``COMPUTE_OUTPUT_START``, ``COMPUTE_END``), which travel back on the final
  ``InferResponse`` (``ipc.protocol.messages.TraceRecord``), with the worker's child traces (BLS).

Every timestamp is ``time.monotonic_ns()`` of the process that took it: CLOCK_MONOTONIC is
one clock for every process of the machine. ``Tracer.finish`` hands the trace to its
setting (``frontend.tracing.settings``), which writes Triton's JSON, or, in opentelemetry
mode, to the span exporter (``frontend.tracing.otel``).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Protocol

from triton_mp.common.errors import ErrorCode, TritonMPError
from triton_mp.common.trace_config import TraceConfig, TraceLevel
from triton_mp.frontend.tracing.settings import NewSetting, TraceSetting, TraceSettings
from triton_mp.ipc.protocol.messages import (
    ChildTrace,
    TensorTrace,
    TraceContext,
    TraceRecord,
    TraceSettingUpdate,
)
from triton_mp.ipc.recordio.codec import encode

log = logging.getLogger(__name__)


class SpanExporter(Protocol):
    """Where opentelemetry mode sends finished traces (``frontend.tracing.otel.OtelExporter``)."""

    def export(self, trace: Trace) -> None:
        """Turn one finished trace into spans and queue them for export."""

    def close(self) -> None:
        """Flush and stop."""


class Trace:
    """One traced request (Triton's ``InferenceTrace``).

    Attributes:
        id: the trace id (unique in this frontend's file).
        model, version: the model and the version that ran (-1 until known).
        request_id: the client's request ``id``.
        level: ``TraceLevel`` bits of the setting that sampled it.
        stamps: (name, ns) in the order they were taken here.
        tensors: the TENSORS-level entries.
        children: child traces (BLS requests) with their own events.
        parent_context: a propagated W3C ``traceparent`` (opentelemetry mode), or "".
    """

    __slots__ = (
        "children",
        "id",
        "level",
        "model",
        "parent_context",
        "request_id",
        "setting",
        "stamps",
        "tensors",
        "version",
    )

    def __init__(
        self, trace_id: int, setting: TraceSetting, model: str, request_id: str, level: int
    ) -> None:
        self.id = trace_id
        self.setting = setting
        self.model = model
        self.version = -1
        self.request_id = request_id
        self.level = level
        self.stamps: list[tuple[str, int]] = []
        self.tensors: list[TensorTrace] = []
        self.children: list[ChildTrace] = []
        self.parent_context = ""

    def stamp(self, name: str, ns: int | None = None) -> None:
        """Record timestamp ``name`` at ``ns`` (now when None)."""
        self.stamps.append((name, time.monotonic_ns() if ns is None else ns))

    def context(self) -> TraceContext:
        """What travels with the request to the scheduler and the worker."""
        return TraceContext(self.level)

    def absorb(self, record: TraceRecord) -> None:
        """Take the scheduler's and the worker's events from a response."""
        self.stamps.extend(record.stamps)
        self.tensors.extend(record.tensors)
        self.children.extend(record.children)

    @property
    def tensors_level(self) -> bool:
        """Whether tensors are traced."""
        return bool(self.level & TraceLevel.TENSORS)


def _header(tid: int, model: str, version: int, request_id: str, parent: int) -> str:
    obj: dict[str, object] = {"id": tid, "model_name": model, "model_version": version}
    if request_id:
        obj["request_id"] = request_id
    if parent:
        obj["parent_id"] = parent
    return json.dumps(obj, separators=(",", ":"))


def _objects(
    tid: int,
    stamps: list[tuple[str, int]],
    tensors: list[TensorTrace],
) -> list[str]:
    out = [
        json.dumps({"id": tid, "timestamps": [{"name": n, "ns": ns}]}, separators=(",", ":"))
        for n, ns in sorted(stamps, key=lambda s: s[1])
    ]
    for t in tensors:
        tensor = {"name": t.name, "data": t.data, "shape": t.shape, "dtype": t.dtype}
        out.append(
            json.dumps({"id": tid, "activity": t.activity, "tensor": tensor}, separators=(",", ":"))
        )
    return out


class Tracer:
    """Sampling and writing of this frontend's traces.

    Args:
        config: the trace flags.
        frontend_id, frontends: this frontend's index and how many there are (trace ids
            are ``frontend_id + 1 + k * frontends``; frontend k > 0 writes
            ``<file>.frontend<k>``).
        exporter: opentelemetry mode's span exporter (built lazily by the process shell).
        send_peers: pushes encoded bytes to every other frontend: a settings update made
            here is applied there too (``TraceSettingUpdate``).

    Attributes:
        active: False when no setting traces anything: the one check an untraced request
            makes.
    """

    def __init__(
        self,
        config: TraceConfig,
        *,
        frontend_id: int = 0,
        frontends: int = 1,
        exporter: SpanExporter | None = None,
        send_peers: Callable[[bytes], None] | None = None,
    ) -> None:
        self._send_peers = send_peers
        name = config.file
        if name and frontend_id:
            name = f"{name}.frontend{frontend_id}"
        self.settings = TraceSettings(config, file_name=name)
        self._frontend_id = frontend_id
        self._frontends = frontends
        self._next = 0
        self.exporter = exporter
        self.active = self.settings.active
        self.on_refresh: Callable[[], None] | None = None
        """Called after every settings update (the native known path un-learns:
        ``frontend.native.known_teach``)."""

    @classmethod
    def off(cls) -> Tracer:
        """A tracer that traces nothing (tracing flags at their defaults)."""
        return cls(TraceConfig())

    def model_ready(self, ready: Callable[[], bool]) -> bool:
        """``ready()``, False when it raises (the model is unknown)."""
        try:
            return ready()
        except TritonMPError:
            return False

    def new_id(self) -> int:
        """A fresh trace id."""
        self._next += 1
        return self._frontend_id + 1 + (self._next - 1) * self._frontends

    def sample(self, model: str, request_id: str = "", *, parent_context: str = "") -> Trace | None:
        """Whether this request (for ``model``) is traced: its ``Trace``, or None.

        Args:
            parent_context: a propagated W3C ``traceparent``: traced whatever the rate says
                (opentelemetry mode only, as Triton).
        """
        setting = self.settings.setting_for(model)
        force = bool(parent_context) and setting.mode == "opentelemetry" and bool(setting.level)
        if not setting.take_sample(force):
            return None
        trace = Trace(self.new_id(), setting, model, request_id, setting.level)
        trace.parent_context = parent_context if force else ""
        return trace

    def setting_request(
        self, model: str, new: NewSetting | None, model_ready: bool
    ) -> dict[str, str | list[str]]:
        """One TraceSetting call (gRPC or HTTP): apply ``new`` (None: read only) to
        ``model``'s setting ("" = global) and answer the settings now in force.

        Raises:
            TritonMPError: INVALID_ARG ``Request for unknown model : <m>`` for a model that
                is not ready; the update's errors (``TraceSettings.update``).
        """
        if model and not model_ready:
            raise TritonMPError(f"Request for unknown model : {model}", ErrorCode.INVALID_ARG)
        if new is not None:
            self.settings.update(model, new)
            self.refresh()
            if self._send_peers is not None:
                fields = {k: getattr(new, k) for k in NewSetting.__dataclass_fields__}
                update = TraceSettingUpdate(frontend_id=self._frontend_id, model=model, **fields)
                self._send_peers(encode(update))
        return self.settings.view(model)

    def apply_peer(self, msg: TraceSettingUpdate) -> None:
        """Another frontend's settings update (it was valid there; the same here unless
        two updates crossed, then this one is logged and dropped)."""
        fields = {k: getattr(msg, k) for k in NewSetting.__dataclass_fields__}
        try:
            self.settings.update(msg.model, NewSetting(**fields))
        except TritonMPError as e:
            log.warning("trace settings from frontend %d not applied: %s", msg.frontend_id, e)
        self.refresh()

    def refresh(self) -> None:
        """Recompute ``active`` after a settings update."""
        self.active = self.settings.active
        if self.on_refresh is not None:
            self.on_refresh()

    def finish(self, trace: Trace) -> None:
        """The request's last response left: write the trace (or export its spans)."""
        if trace.setting.mode == "opentelemetry":
            trace.setting.outstanding -= 1
            if self.exporter is not None:
                self.exporter.export(trace)
            return
        objects = [_header(trace.id, trace.model, trace.version, trace.request_id, 0)]
        objects += _objects(trace.id, trace.stamps, trace.tensors)
        for child in trace.children:
            objects += self._child_objects(child, trace.id)
        trace.setting.write(objects)

    def _child_objects(self, child: ChildTrace, parent: int) -> list[str]:
        tid = self.new_id()
        out = [_header(tid, child.model, child.version, child.request_id, parent)]
        out += _objects(tid, list(child.stamps), list(child.tensors))
        for grandchild in child.children:
            out += self._child_objects(grandchild, tid)
        return out

    def close(self) -> None:
        """Shutdown: write what is left, end the files, flush the exporter."""
        self.settings.close()
        if self.exporter is not None:
            self.exporter.close()


TraceSink = Callable[[Trace], None]
