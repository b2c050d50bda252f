"""``/metrics`` without a server: rendering hand-made snapshots, and the endpoint in-process.

``render`` is checked line by line against Triton's names, types, help strings and labels
(the text a Grafana dashboard queries) and against our own ``triton_mp_*`` families. The
endpoint runs on this test's event loop with a "scheduler" that is a function answering
each query with hand-made replies (or staying silent).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import NamedTuple

import aiohttp
import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.unit.fake_queues import busy_cls, idle_add_sub, instance, level
from triton_mp.common.errors import StartupError
from triton_mp.frontend.dispatch.pending import PendingTable
from triton_mp.frontend.metrics.endpoint import MetricsEndpoint
from triton_mp.frontend.metrics.host import CpuSample, ProcessMemory, cpu_utilization
from triton_mp.frontend.metrics.render import (
    FAILURE_REASONS,
    TRITON_COUNTERS,
    MetricsSnapshot,
    batch_size_buckets,
    render,
)
from triton_mp.ipc import Decoder, SegmentCache
from triton_mp.ipc.protocol.messages import (
    QueueQuery,
    QueueReply,
    StatsQuery,
    StatsReply,
    ToScheduler,
)
from triton_mp.ipc.protocol.reports import ModelStats, StatDuration
from triton_mp.ipc.protocol.specs import MetricsSpec

pytestmark = pytest.mark.timeout(60)


def _cls_stats() -> ModelStats:
    return ModelStats(
        name="ocr_cls",
        version=1,
        inference_count=130,
        execution_count=40,
        success=StatDuration(120, 9_876_543_210),
        fail=StatDuration(10, 5_000),
        queue=StatDuration(120, 1_234_567),
        compute_input=StatDuration(120, 2_000_999),
        compute_infer=StatDuration(120, 300_000_000),
        compute_output=StatDuration(120, 999),
        fail_reasons={"REJECTED": 7, "BACKEND": 3},
    )


SNAPSHOT = MetricsSnapshot(
    stats=(_cls_stats(), ModelStats(name="add_sub", version=1)),
    queues=(busy_cls(), idle_add_sub()),
    cpu=CpuSample(utilization=0.25, memory_total_bytes=8 << 30, memory_used_bytes=3 << 30),
    processes=(
        ProcessMemory("supervisor", "", 50_000_000),
        ProcessMemory("scheduler", "", 40_000_000),
        ProcessMemory("frontend", "0", 70_000_000),
        ProcessMemory("worker", "ocr_cls_0_0", 300_000_000),
    ),
)


def _lines(snapshot: MetricsSnapshot = SNAPSHOT) -> list[str]:
    return render(snapshot).decode().splitlines()


def _value(lines: list[str], sample: str) -> float:
    """The value of the one line that starts with ``sample`` + space."""
    (line,) = [x for x in lines if x.startswith(sample + " ")]
    return float(line.rsplit(" ", 1)[1])


CLS = 'model="ocr_cls",version="1"'
ADD = 'model="add_sub",version="1"'


def test_triton_counters_keep_their_names_types_and_help_without_a_total_suffix() -> None:
    lines = _lines()
    for name, doc in TRITON_COUNTERS.items():
        assert f"# HELP {name} {doc}" in lines
        assert f"# TYPE {name} counter" in lines
    assert not [x for x in lines if x.startswith("nv_") and x.split()[0].endswith("_total")]
    assert "# TYPE nv_inference_pending_request_count gauge" in lines
    assert (
        "# HELP nv_inference_pending_request_count "
        "Instantaneous number of pending requests awaiting execution per-model." in lines
    )


def test_triton_families_come_in_triton_order() -> None:
    names = [x.split()[2] for x in _lines() if x.startswith("# TYPE nv_")]
    assert names == [
        *TRITON_COUNTERS,
        "nv_inference_pending_request_count",
        "nv_cpu_utilization",
        "nv_cpu_memory_total_bytes",
        "nv_cpu_memory_used_bytes",
    ]


def test_per_model_counts_and_durations_in_whole_microseconds() -> None:
    lines = _lines()
    expected = {
        "nv_inference_request_success": 120,
        "nv_inference_count": 130,
        "nv_inference_exec_count": 40,
        "nv_inference_request_duration_us": 9_876_543,
        "nv_inference_queue_duration_us": 1_234,
        "nv_inference_compute_input_duration_us": 2_000,
        "nv_inference_compute_infer_duration_us": 300_000,
        "nv_inference_compute_output_duration_us": 0,
    }
    for name, value in expected.items():
        assert _value(lines, f"{name}{{{CLS}}}") == value, name
        assert _value(lines, f"{name}{{{ADD}}}") == 0, name


def test_every_failure_reason_exists_for_every_model() -> None:
    lines = _lines()
    got = {
        reason: _value(
            lines, f'nv_inference_request_failure{{model="ocr_cls",reason="{reason}",version="1"}}'
        )
        for reason in FAILURE_REASONS
    }
    assert got == {"REJECTED": 7, "CANCELED": 0, "BACKEND": 3, "OTHER": 0}
    for reason in FAILURE_REASONS:
        assert (
            _value(
                lines,
                f'nv_inference_request_failure{{model="add_sub",reason="{reason}",version="1"}}',
            )
            == 0
        )


def test_pending_request_count_is_every_queued_request_of_the_model() -> None:
    lines = _lines()
    assert _value(lines, f"nv_inference_pending_request_count{{{CLS}}}") == 12 + 40
    assert _value(lines, f"nv_inference_pending_request_count{{{ADD}}}") == 0


def test_cpu_gauges_and_their_absence_without_cpu_metrics() -> None:
    lines = _lines()
    assert _value(lines, "nv_cpu_utilization") == 0.25
    assert _value(lines, "nv_cpu_memory_total_bytes") == 8 << 30
    assert _value(lines, "nv_cpu_memory_used_bytes") == 3 << 30
    assert "# HELP nv_cpu_utilization CPU utilization rate [0.0 - 1.0]" in lines
    no_cpu = MetricsSnapshot(stats=SNAPSHOT.stats, queues=SNAPSHOT.queues)
    assert not [x for x in _lines(no_cpu) if "nv_cpu_" in x]


def test_queue_families_per_priority_level() -> None:
    lines = _lines()
    one, two = f'level="1",{CLS}', f'level="2",{CLS}'
    assert _value(lines, f"triton_mp_queue_depth{{{one}}}") == 12
    assert _value(lines, f"triton_mp_queue_depth{{{two}}}") == 40
    assert _value(lines, f"triton_mp_queue_delayed{{{two}}}") == 3
    assert _value(lines, f"triton_mp_queue_oldest_age_us{{{two}}}") == 1_250_000
    assert _value(lines, f"triton_mp_queue_rejected_total{{{two}}}") == 7
    assert _value(lines, f"triton_mp_queue_timed_out_total{{{two}}}") == 2
    assert _value(lines, f'triton_mp_queue_depth{{level="0",{ADD}}}') == 0


def test_batch_size_histogram_is_cumulative_with_power_of_two_bounds() -> None:
    lines = _lines()
    # busy_cls formed {1: 5, 3: 2, 8: 60, 16: 40}; max_batch_size 32
    expected = {"1.0": 5, "2.0": 5, "4.0": 7, "8.0": 67, "16.0": 107, "32.0": 107, "+Inf": 107}
    got = {
        x.split('le="')[1].split('"')[0]: float(x.rsplit(" ", 1)[1])
        for x in lines
        if x.startswith("triton_mp_batch_size_bucket{") and CLS in x
    }
    assert got == expected
    assert _value(lines, f"triton_mp_batch_size_count{{{CLS}}}") == 107
    assert _value(lines, f"triton_mp_batch_size_sum{{{CLS}}}") == 5 + 6 + 480 + 640


@pytest.mark.parametrize(
    ("max_batch_size", "sizes", "bounds"),
    [
        (0, [], [1]),
        (0, [1], [1]),
        (8, [], [1, 2, 4, 8]),
        (12, [3], [1, 2, 4, 8, 12]),
        (4, [6], [1, 2, 4, 6]),
    ],
)
def test_batch_size_buckets(max_batch_size: int, sizes: list[int], bounds: list[int]) -> None:
    assert batch_size_buckets(max_batch_size, sizes) == bounds


def test_close_reasons_all_present_and_instances_labelled() -> None:
    lines = _lines()
    reasons = {
        x.split('reason="')[1].split('"')[0]: float(x.rsplit(" ", 1)[1])
        for x in lines
        if x.startswith('triton_mp_batch_close_total{model="ocr_cls",')
    }
    assert reasons == {"max": 0, "preferred": 100, "delay": 0, "idle": 7, "shape": 0, "single": 0}
    busy = f'instance="ocr_cls_0_0",{CLS}'
    dead = f'instance="ocr_cls_0_1",{CLS}'
    assert _value(lines, f"triton_mp_instance_live{{{busy}}}") == 1
    assert _value(lines, f"triton_mp_instance_live{{{dead}}}") == 0
    assert _value(lines, f"triton_mp_instance_requests_in_flight{{{busy}}}") == 5
    assert _value(lines, f"triton_mp_instance_executions_total{{{dead}}}") == 99
    assert _value(lines, f"triton_mp_instance_restarts_total{{{busy}}}") == 0


def test_restarts_and_process_memory() -> None:
    queues = (
        msgspec.structs.replace(
            idle_add_sub(), levels=(level(0),), instances=(instance("add_sub_0_0", restarts=2),)
        ),
    )
    lines = _lines(MetricsSnapshot(stats=(), queues=queues, processes=SNAPSHOT.processes))
    assert _value(lines, f'triton_mp_instance_restarts_total{{instance="add_sub_0_0",{ADD}}}') == 2
    rss = "triton_mp_process_resident_memory_bytes"
    assert _value(lines, f'{rss}{{instance="",role="supervisor"}}') == 50_000_000
    assert _value(lines, f'{rss}{{instance="ocr_cls_0_0",role="worker"}}') == 300_000_000
    assert _value(lines, f'{rss}{{instance="0",role="frontend"}}') == 70_000_000


def test_refused_frees_are_a_counter_of_the_serving_frontend_and_absent_when_unknown() -> None:
    lines = _lines(MetricsSnapshot(stats=(), queues=(), refused_frees=3))
    assert _value(lines, "triton_mp_frontend_refused_frees_total") == 3
    assert "# TYPE triton_mp_frontend_refused_frees_total counter" in lines
    assert not [x for x in _lines() if "refused_frees" in x]


def test_output_parses_as_prometheus_text() -> None:
    families = {f.name: f for f in text_string_to_metric_families(render(SNAPSHOT).decode())}
    assert families["nv_inference_request_success"].type == "counter"
    assert families["nv_inference_pending_request_count"].type == "gauge"
    assert families["triton_mp_batch_size"].type == "histogram"
    assert families["triton_mp_queue_rejected"].type == "counter"
    success = {s.labels["model"]: s.value for s in families["nv_inference_request_success"].samples}
    assert success == {"ocr_cls": 120, "add_sub": 0}


def test_label_values_are_escaped() -> None:
    odd = ModelStats(name='we"ird\\name', version=3)
    text = render(MetricsSnapshot(stats=(odd,), queues=())).decode()
    assert 'nv_inference_count{model="we\\"ird\\\\name",version="3"} 0' in text.splitlines()


class _Times(NamedTuple):
    user: float
    nice: float
    system: float
    idle: float
    iowait: float
    irq: float
    softirq: float
    steal: float


def test_cpu_utilization_is_busy_over_busy_plus_idle() -> None:
    old = _Times(100, 0, 50, 1000, 10, 0, 0, 0)
    new = _Times(130, 5, 60, 1045, 15, 3, 2, 0)
    assert cpu_utilization(old, new) == pytest.approx(50 / 100)
    assert cpu_utilization(new, new) == 0.0
    assert cpu_utilization(new, old) == 0.0  # counters that went back count as 0


# ------------------------------------------------------------------ the endpoint in-process

Answer = Callable[[StatsQuery | QueueQuery], StatsReply | QueueReply | None]


def _answers(query: StatsQuery | QueueQuery) -> StatsReply | QueueReply:
    if isinstance(query, StatsQuery):
        return StatsReply(query_id=query.query_id, stats=SNAPSHOT.stats)
    return QueueReply(query_id=query.query_id, models=SNAPSHOT.queues)


def _endpoint(
    answer: Answer, port: int = 0, timeout_s: float = 5.0
) -> tuple[MetricsEndpoint, PendingTable]:
    pending = PendingTable(SegmentCache())
    decoder = Decoder(ToScheduler)
    loop = asyncio.get_running_loop()

    def send(data: bytes) -> None:
        query = decoder.decode(data)
        assert isinstance(query, StatsQuery | QueueQuery)
        assert query.frontend_id == 0
        reply = answer(query)
        if reply is not None:
            # NOTE: answered later on the loop, as the inbox wake-up would.
            loop.call_soon(pending.deliver, [reply])

    spec = MetricsSpec(address="127.0.0.1", port=port, cpu_metrics=True, interval_ms=50)
    endpoint = MetricsEndpoint(
        spec,
        frontend_id=0,
        pending=pending,
        send_scheduler=send,
        supervisor_pid=1,
        reply_timeout_s=timeout_s,
    )
    return endpoint, pending


async def _get(port: int, path: str = "/metrics") -> tuple[int, str, str]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}{path}") as resp,
    ):
        return resp.status, resp.headers.get("Content-Type", ""), await resp.text()


def test_endpoint_serves_what_the_scheduler_answers() -> None:
    async def main() -> None:
        endpoint, _ = _endpoint(_answers)
        await endpoint.start()
        try:
            status, ctype, body = await _get(endpoint.port)
            assert status == 200
            assert ctype == "text/plain; charset=utf-8"
            lines = body.splitlines()
            assert _value(lines, f"nv_inference_request_success{{{CLS}}}") == 120
            assert _value(lines, f'triton_mp_queue_depth{{level="2",{CLS}}}') == 40
            await asyncio.sleep(0.2)  # a few CPU samples
            _, _, body = await _get(endpoint.port)
            assert 0.0 <= _value(body.splitlines(), "nv_cpu_utilization") <= 1.0
            # NOTE: 2.51 answers any other path 200 with no body.
            assert (await _get(endpoint.port, "/")) == (200, "text/plain; charset=utf-8", "")
            assert (await _get(endpoint.port, "/metrics?x=1"))[2] != ""
        finally:
            await endpoint.stop()

    asyncio.run(main())


def test_endpoint_answers_503_when_the_scheduler_is_silent_and_forgets_the_queries() -> None:
    async def main() -> None:
        endpoint, pending = _endpoint(lambda q: None, timeout_s=0.2)
        await endpoint.start()
        try:
            status, _, body = await _get(endpoint.port)
            assert status == 503
            assert "scheduler did not answer" in body
            assert not pending._queries
        finally:
            await endpoint.stop()

    asyncio.run(main())


def test_endpoint_refuses_a_port_in_use_with_tritons_words() -> None:
    async def main() -> None:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            endpoint, _ = _endpoint(_answers, port=port)
            with pytest.raises(StartupError) as e:
                await endpoint.start()
            assert e.value.message.startswith(
                f"failed to start Metrics service: Socket '127.0.0.1:{port}' already in use"
            )
            await endpoint.stop()

    asyncio.run(main())
