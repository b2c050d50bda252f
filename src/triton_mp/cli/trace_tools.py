"""``triton-mp trace summary FILE`` and ``triton-mp trace timeline FILE -o OUT``.

Imported by ``cli.main`` when the ``trace`` command runs; reads a trace file in Triton's
JSON format (ours or tritonserver's) and writes nothing but its own output. Pure apart
from reading and writing those files.

- ``summary``: per model (and transport), the mean, p50 and p99 of each phase, in
  microseconds, the way Triton's ``qa/common/trace_summary.py`` breaks a request down:
  network read (``*_RECV``/``GRPC_WAITREAD``), queue (QUEUE_START to COMPUTE_START),
  compute input, infer, output (the three COMPUTE phases), send (``*_SEND``), the
  handler (REQUEST_START to REQUEST_END) and the whole request.
- ``timeline``: the Chrome trace-event format (Perfetto, chrome://tracing): one process
  track per process that owns events (the frontend, the scheduler, one per model's
  workers), one row per trace in each, a complete event per phase and an instant event
  per INFER_RESPONSE_COMPLETE. Which process took a timestamp follows from its name: the
  transport's, REQUEST_* and INFER_RESPONSE_COMPLETE are the frontend's (a BLS child's
  REQUEST_* its caller's worker's), QUEUE_START the scheduler's, COMPUTE_* the worker's.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class TraceEntry:
    """One trace of the file: its header and its (name, ns) timestamps."""

    id: int
    model: str = ""
    version: int = -1
    request_id: str = ""
    parent_id: int = 0
    stamps: list[tuple[str, int]] = field(default_factory=list)

    def first(self, name: str) -> int | None:
        """The earliest timestamp called ``name``."""
        found = [ns for n, ns in self.stamps if n == name]
        return min(found) if found else None

    @property
    def protocol(self) -> str:
        """``GRPC``, ``HTTP``, or ``BLS`` for a child trace."""
        names = {n for n, _ in self.stamps}
        if any(n.startswith("GRPC_") for n in names):
            return "GRPC"
        if any(n.startswith("HTTP_") for n in names):
            return "HTTP"
        return "BLS" if self.parent_id else "OTHER"


def load(path: Path) -> list[TraceEntry]:
    """Every trace of a trace file (objects grouped by ``id``, in order of first sight).

    Raises:
        ValueError: the file is not a JSON array of Triton trace objects.
    """
    data = json.loads(path.read_text())
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON array of trace objects")
    traces: dict[int, TraceEntry] = {}
    for obj in data:
        if not isinstance(obj, dict) or "id" not in obj:
            raise ValueError(f"{path}: not a Triton trace object: {obj!r:.80}")
        t = traces.setdefault(int(obj["id"]), TraceEntry(int(obj["id"])))
        if "model_name" in obj:
            t.model = str(obj["model_name"])
            t.version = int(obj.get("model_version", -1))
            t.request_id = str(obj.get("request_id", ""))
            t.parent_id = int(obj.get("parent_id", 0))
        for s in obj.get("timestamps", ()):
            t.stamps.append((str(s["name"]), int(s["ns"])))
    for t in traces.values():
        t.stamps.sort(key=lambda s: s[1])
    return list(traces.values())


PHASES: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    (
        "network read",
        ("HTTP_RECV_START", "GRPC_WAITREAD_START"),
        ("HTTP_RECV_END", "GRPC_WAITREAD_END"),
    ),
    ("queue", ("QUEUE_START",), ("COMPUTE_START",)),
    ("compute input", ("COMPUTE_START",), ("COMPUTE_INPUT_END",)),
    ("infer", ("COMPUTE_INPUT_END",), ("COMPUTE_OUTPUT_START",)),
    ("output", ("COMPUTE_OUTPUT_START",), ("COMPUTE_END",)),
    ("send", ("HTTP_SEND_START", "GRPC_SEND_START"), ("HTTP_SEND_END", "GRPC_SEND_END")),
    ("handler", ("REQUEST_START",), ("REQUEST_END",)),
)
"""(phase, start names, end names): the first start and the first end present (a decoupled
request's first send)."""


def phase_ns(trace: TraceEntry) -> dict[str, int]:
    """Each phase's duration in ns (phases the trace lacks are absent), and ``total``."""
    out: dict[str, int] = {}
    for phase, starts, ends in PHASES:
        a = next((v for n in starts if (v := trace.first(n)) is not None), None)
        b = next((v for n in ends if (v := trace.first(n)) is not None), None)
        if a is not None and b is not None and b >= a:
            out[phase] = b - a
    if trace.stamps:
        out["total"] = trace.stamps[-1][1] - trace.stamps[0][1]
    return out


def _percentile(values: list[int], q: float) -> float:
    """The nearest-rank percentile: the smallest value with at least ``q`` of them at or
    below it."""
    ordered = sorted(values)
    return float(ordered[max(1, math.ceil(q * len(ordered))) - 1])


def summary(traces: list[TraceEntry]) -> str:
    """The ``summary`` report: one block per (model, version, protocol)."""
    groups: dict[tuple[str, int, str], list[TraceEntry]] = {}
    for t in traces:
        groups.setdefault((t.model, t.version, t.protocol), []).append(t)
    lines = []
    for (model, version, protocol), members in sorted(groups.items()):
        lines.append(f"Summary for {model} ({version}), {protocol}: trace count = {len(members)}")
        lines.append(f"  {'phase':<14} {'mean us':>10} {'p50 us':>10} {'p99 us':>10}")
        per_trace = [phase_ns(t) for t in members]
        for phase in [p for p, _, _ in PHASES] + ["total"]:
            values = [d[phase] for d in per_trace if phase in d]
            if not values:
                continue
            lines.append(
                f"  {phase:<14} {statistics.fmean(values) / 1e3:>10.1f} "
                f"{_percentile(values, 0.5) / 1e3:>10.1f} {_percentile(values, 0.99) / 1e3:>10.1f}"
            )
    return "\n".join(lines) + "\n"


_SPANS = (
    ("read", ("HTTP_RECV_START", "GRPC_WAITREAD_START"), ("HTTP_RECV_END", "GRPC_WAITREAD_END")),
    ("queue", ("QUEUE_START",), ("COMPUTE_START",)),
    ("input", ("COMPUTE_START",), ("COMPUTE_INPUT_END",)),
    ("infer", ("COMPUTE_INPUT_END",), ("COMPUTE_OUTPUT_START",)),
    ("output", ("COMPUTE_OUTPUT_START",), ("COMPUTE_END",)),
)


def _owner(trace: TraceEntry, span: str, by_id: dict[int, TraceEntry]) -> str:
    if span == "queue":
        return "scheduler"
    if span in ("input", "infer", "output"):
        return f"worker {trace.model}"
    if trace.parent_id and trace.parent_id in by_id:
        return f"worker {by_id[trace.parent_id].model}"
    return "frontend"


def timeline(traces: list[TraceEntry]) -> dict[str, object]:
    """The Chrome trace-event document (``traceEvents``, times in µs from the first
    timestamp): pid = process track, tid = trace id."""
    starts = [t.stamps[0][1] for t in traces if t.stamps]
    t0 = min(starts) if starts else 0
    by_id = {t.id: t for t in traces}
    pids: dict[str, int] = {}
    events: list[dict[str, object]] = []

    def pid(name: str) -> int:
        if name not in pids:
            pids[name] = len(pids) + 1
        return pids[name]

    def add(name: str, owner: str, t: TraceEntry, a: int, b: int | None) -> None:
        ev: dict[str, object] = {
            "name": name,
            "cat": t.model,
            "pid": pid(owner),
            "tid": t.id,
            "ts": (a - t0) / 1e3,
            "args": {"trace_id": t.id, "model": t.model, "request_id": t.request_id},
        }
        if b is None:
            ev.update(ph="i", s="t")
        else:
            ev.update(ph="X", dur=(b - a) / 1e3)
        events.append(ev)

    for t in traces:
        request = _owner(t, "request", by_id)
        a, b = t.first("REQUEST_START"), t.first("REQUEST_END")
        if a is not None and b is not None:
            add(f"{t.model} request", request, t, a, b)
        for span, s_names, e_names in _SPANS:
            a = next((v for n in s_names if (v := t.first(n)) is not None), None)
            b = next((v for n in e_names if (v := t.first(n)) is not None), None)
            if a is not None and b is not None and b >= a:
                add(span, _owner(t, span, by_id), t, a, b)
        sends = [ns for n, ns in t.stamps if n.endswith("_SEND_START")]
        ends = [ns for n, ns in t.stamps if n.endswith("_SEND_END")]
        for a, b in zip(sends, ends, strict=False):
            add("send", "frontend", t, a, b)
        for n, ns in t.stamps:
            if n == "INFER_RESPONSE_COMPLETE":
                add("response", request, t, ns, None)
    for name, number in pids.items():
        events.append({"name": "process_name", "ph": "M", "pid": number, "args": {"name": name}})
        events.append(
            {"name": "process_sort_index", "ph": "M", "pid": number, "args": {"sort_index": number}}
        )
    return {"traceEvents": events, "displayTimeUnit": "ns"}
