"""OpenTelemetry mode end to end: spans on a real OTLP/HTTP endpoint this test serves.

The server runs with ``--trace-config mode=opentelemetry`` and ``rate=0`` (Triton's way of
tracing only requests that carry a context), so exactly the requests sent with a W3C
``traceparent`` (gRPC metadata, HTTP header) are traced. The endpoint decodes each
``ExportTraceServiceRequest`` with the OpenTelemetry protobuf definitions; the test checks
the resource attributes, the span tree (InferRequest > model > compute) under the client's
parent span, the events on each and their wall-clock times.
"""

from __future__ import annotations

import http.server
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.helpers.server import PROJECT_REPOSITORY, ServerProcess, free_port, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


class _Collector(http.server.BaseHTTPRequestHandler):
    received: list[ExportTraceServiceRequest] = []

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        msg = ExportTraceServiceRequest()
        msg.ParseFromString(body)
        self.received.append(msg)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[tuple[str, list[ExportTraceServiceRequest]]]:
    port = free_port()
    _Collector.received = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}/v1/traces", _Collector.received
    finally:
        server.shutdown()
        server.server_close()


def _inputs(module):  # type: ignore[no-untyped-def]
    x = np.ones((1, 16), np.float32)
    ins = [
        module.InferInput("INPUT0", [1, 16], "FP32"),
        module.InferInput("INPUT1", [1, 16], "FP32"),
    ]
    for t in ins:
        t.set_data_from_numpy(x)
    return ins


def _spans(received: list[ExportTraceServiceRequest]) -> tuple[list, dict[str, str]]:
    spans, resource = [], {}
    for msg in received:
        for rs in msg.resource_spans:
            resource.update({a.key: a.value.string_value for a in rs.resource.attributes})
            for ss in rs.scope_spans:
                spans.extend(ss.spans)
    return spans, resource


def test_spans_arrive_with_the_propagated_parent(
    collector: tuple[str, list[ExportTraceServiceRequest]], tmp_path: Path
) -> None:
    url, received = collector
    repo = tmp_path / "repo"
    shutil.copytree(PROJECT_REPOSITORY / "add_sub_py", repo / "add_sub_py")
    server = ServerProcess(
        repo,
        tmp_path / "server.log",
        "--trace-config",
        "mode=opentelemetry",
        "--trace-config",
        "level=TIMESTAMPS",
        "--trace-config",
        "rate=0",
        "--trace-config",
        f"opentelemetry,url={url}",
        "--trace-config",
        "opentelemetry,resource=service.name=triton-mp-test",
        "--trace-config",
        "opentelemetry,resource=deployment=e2e",
        "--trace-config",
        "opentelemetry,bsp_schedule_delay=100",
    )
    parents = {"grpc": "00f067aa0ba902b7", "http": "00f067aa0ba902b8"}
    try:
        server.wait_live()
        g = grpcclient.InferenceServerClient(server.url)
        h = httpclient.InferenceServerClient(server.http_url)
        t0 = time.time_ns()
        g.infer("add_sub_py", _inputs(grpcclient))  # no context, rate 0: not traced
        for proto, client, module in (("grpc", g, grpcclient), ("http", h, httpclient)):
            tp = f"00-{TRACE_ID}-{parents[proto]}-01"
            client.infer("add_sub_py", _inputs(module), headers={"traceparent": tp})
        t1 = time.time_ns()
        wait_for(lambda: len(_spans(received)[0]) >= 6, 30, "six spans at the collector")
        g.close()
        h.close()
    finally:
        assert server.stop() == 0
    spans, resource = _spans(received)
    assert resource["service.name"] == "triton-mp-test"
    assert resource["deployment"] == "e2e"
    assert len(spans) == 6  # the request without a context was not traced
    by_id = {s.span_id: s for s in spans}
    roots = [s for s in spans if s.name == "InferRequest"]
    assert len(roots) == 2
    assert {s.parent_span_id.hex() for s in roots} == set(parents.values())
    for root in roots:
        assert root.trace_id.hex() == TRACE_ID
        assert t0 <= root.start_time_unix_nano <= root.end_time_unix_nano <= t1 + 10**9
        model = next(s for s in spans if s.parent_span_id == root.span_id)
        compute = next(s for s in spans if s.parent_span_id == model.span_id)
        assert model.name == "add_sub_py"
        assert compute.name == "compute"
        attrs = {a.key: a.value for a in model.attributes}
        assert attrs["triton.model_name"].string_value == "add_sub_py"
        assert attrs["triton.model_version"].int_value == 1
        assert [e.name for e in model.events] == ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
        assert [e.name for e in compute.events] == [
            "COMPUTE_START",
            "COMPUTE_INPUT_END",
            "COMPUTE_OUTPUT_START",
            "COMPUTE_END",
        ]
        root_events = [e.name for e in root.events]
        proto = "GRPC" if root.parent_span_id.hex() == parents["grpc"] else "HTTP"
        read = (
            ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END"]
            if proto == "GRPC"
            else [
                "HTTP_RECV_START",
                "HTTP_RECV_END",
            ]
        )
        assert root_events[:2] == read
        assert root_events[-2:] == [f"{proto}_SEND_START", f"{proto}_SEND_END"]
        assert "INFER_RESPONSE_COMPLETE" in root_events
        times = [e.time_unix_nano for e in root.events]
        assert times == sorted(times)
        assert by_id[model.parent_span_id] is root
