"""``triton-mp analyze``'s readings and outputs without a server: ``/proc`` parsing of this
test's own process tree, statistics deltas, flags, config files and the report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from google.protobuf import text_format

from triton_mp._proto import model_config_pb2
from triton_mp.analyze import report
from triton_mp.analyze.options import parse_bytes, settings_from_args
from triton_mp.analyze.probe import procs
from triton_mp.analyze.probe.measure import breakdown
from triton_mp.analyze.sweep import checkpoint
from triton_mp.analyze.sweep.results import Measurement, ProcessMemory, Result
from triton_mp.analyze.sweep.space import Point, Variant, shipped_variant
from triton_mp.cli.main import build_parser

CONFIG = {
    "name": "add_sub",
    "backend": "onnxruntime",
    "max_batch_size": 8,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [16]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [16]}],
    "instance_group": [{"name": "add_sub_0", "count": 2, "kind": "KIND_CPU"}],
    "dynamic_batching": {"preferred_batch_size": [8], "max_queue_delay_microseconds": 100},
}


def test_classify_reads_triton_mp_titles() -> None:
    assert procs.classify(["triton-mp: worker ocr_cls_0_1"], 5) == ("worker", "ocr_cls_0_1")
    assert procs.classify(["triton-mp: scheduler"], 5) == ("scheduler", "")
    assert procs.classify(
        ["python", "-c", "from multiprocessing.resource_tracker import main"], 5
    ) == ("resource_tracker", "")
    assert procs.classify(["/bin/sleep", "5"], 7) == ("other", "7")


def test_snapshot_covers_the_tree_with_cpu_and_rss() -> None:
    spin = (
        "import time, sys\n"
        "while time.process_time() < 0.2: pass\n"
        "print('spun', flush=True)\n"
        "time.sleep(30)\n"
    )
    before = procs.snapshot(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "spun"
        after = procs.snapshot(os.getpid())
        pids = [p.pid for p in after]
        assert pids[0] == os.getpid()
        assert child.pid in pids
        mine = next(p for p in after if p.pid == child.pid)
        with open(f"/proc/{child.pid}/status") as f:
            vmrss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
        assert abs(mine.rss_bytes - vmrss) < 4 << 20
        # a process new since ``before`` counts all its CPU: at least the 200 ms it spun
        assert procs.cpu_ms_by_role(before, after)["other"] >= 190
    finally:
        child.kill()
        child.wait()


def test_cpu_by_role_counts_new_processes_whole_and_gone_ones_not() -> None:
    def s(pid: int, role: str, ticks: int) -> procs.ProcessSample:
        return procs.ProcessSample(
            pid=pid, ppid=1, role=role, name="", cpu_ticks=ticks, rss_bytes=0
        )

    tick_ms = 1000 / procs.CLOCK_TICKS_PER_S
    out = procs.cpu_ms_by_role(
        [s(1, "frontend", 10), s(2, "worker", 5)], [s(1, "frontend", 30), s(3, "worker", 4)]
    )
    assert out == {"frontend": 20 * tick_ms, "worker": 4 * tick_ms}


def test_instances_of_matches_the_models_groups_only() -> None:
    ps = [
        ProcessMemory(role="worker", name="add_sub_0_0", pid=1, rss_bytes=1),
        ProcessMemory(role="worker", name="add_sub_0_1", pid=2, rss_bytes=2),
        ProcessMemory(role="worker", name="add_sub_py_0_0", pid=3, rss_bytes=4),
        ProcessMemory(role="frontend", name="0", pid=4, rss_bytes=8),
    ]
    assert [p.pid for p in procs.instances_of(ps, ["add_sub_0"])] == [1, 2]
    assert procs.instances_of(ps, []) == ()


def test_remote_memory_reads_triton_mp_metrics() -> None:
    text = (
        "# TYPE triton_mp_process_resident_memory_bytes gauge\n"
        'triton_mp_process_resident_memory_bytes{instance="",role="supervisor"} 5.0e+07\n'
        'triton_mp_process_resident_memory_bytes{instance="m_0_0",role="worker"} 7.5e+07\n'
    )
    got = procs.remote_memory(text)
    assert [(p.role, p.name, p.rss_bytes) for p in got] == [
        ("supervisor", "", 50_000_000),
        ("worker", "m_0_0", 75_000_000),
    ]


def test_breakdown_is_per_request_means_of_the_deltas() -> None:
    before = {
        "success": {"count": 10, "ns": 0},
        "queue": {"count": 10, "ns": 10_000},
        "inference_count": 10,
        "execution_count": 5,
    }
    after = {
        "success": {"count": 30, "ns": 0},
        "queue": {"count": 30, "ns": 50_000},
        "compute_infer": {"count": 20, "ns": 200_000},
        "inference_count": 50,
        "execution_count": 10,
    }
    b = breakdown(before, after)
    assert (b.requests, b.inferences, b.executions) == (20, 40, 5)
    assert b.queue_us == 2.0
    assert b.compute_infer_us == 10.0
    assert b.avg_batch == 8.0


def test_flags_become_settings() -> None:
    argv = "analyze --model m --url h:1 --instance-counts 1,3 --latency-budget-ms 50"
    argv += " --max-memory 2GiB --objectives throughput:2,memory --preferred-batch-sizes 4,8"
    argv += " --dynamic-batching on --concurrency 8,1"
    args = build_parser().parse_args([*argv.split(), "--preferred-batch-sizes", ""])
    s = settings_from_args(args)
    assert s.space.instance_counts == (1, 3)
    assert s.space.concurrencies == (1, 8)
    assert s.space.preferred == ((4, 8), ())
    assert s.space.dynamic_batching == (True,)
    assert s.constraints.latency_budget_ms == 50
    assert s.constraints.max_memory_bytes == 2 << 30
    assert s.objectives == {"throughput": 2.0, "memory": 1.0}
    assert s.output == "analyze_m"
    assert parse_bytes("512MiB") == 512 << 20
    assert parse_bytes("1000") == 1000
    with pytest.raises(ValueError, match="exactly one"):
        settings_from_args(build_parser().parse_args(["analyze", "--model", "m"]))
    with pytest.raises(SystemExit):
        build_parser().parse_args(
            ["analyze", "--model", "m", "--url", "h:1", "--dynamic-batching", "maybe"]
        )


def _result(v: Variant, c: int, tput: float, p99_ms: float) -> Result:
    inst = tuple(
        ProcessMemory(role="worker", name=f"add_sub_0_{i}", pid=100 + i, rss_bytes=70 << 20)
        for i in range(v.instance_count)
    )
    m = Measurement(
        throughput_per_s=tput, p50_us=p99_ms * 400, p95_us=p99_ms * 800, p99_us=p99_ms * 1000,
        cpu_ms_per_inference=0.5, cpu_ms_by_role={"frontend": 0.3, "worker": 0.2}, instances=inst,
        processes=(*inst, ProcessMemory(role="frontend", name="0", pid=9, rss_bytes=80 << 20)),
        load_generator="perf_analyzer",
    )  # fmt: skip
    return Result(point=Point(variant=v, concurrency=c), measurement=m)


def test_report_writes_loadable_configs_html_and_json(tmp_path: Path) -> None:
    from triton_mp.analyze.sweep.pareto import Constraints
    from triton_mp.analyze.sweep.settings import Settings

    shipped = shipped_variant(CONFIG)
    two = Variant(instance_count=2, max_batch_size=8, dynamic_batching=True, max_queue_delay_us=0)
    served_two = {
        **CONFIG,
        "dynamic_batching": {"preferred_batch_size": [8], "max_queue_delay_microseconds": 0},
    }
    ck = checkpoint.Checkpoint(
        fingerprint="x", settings={}, configs={"shipped": CONFIG, two.key(): served_two}
    )
    ck.results += [
        _result(shipped, 1, 100, 5),
        _result(shipped, 4, 300, 60),
        _result(two, 1, 150, 4),
        _result(two, 4, 400, 20),
    ]
    settings = Settings(
        model="add_sub", output=str(tmp_path), constraints=Constraints(latency_budget_ms=50)
    )
    recs = report.write(settings, ck, tmp_path)
    assert [r.result.point.key() for r in recs] == ["i2_b8_dyn0@c4", "shipped@c1"]
    text = (tmp_path / "configs" / "1_i2_b8_dyn0" / "config.pbtxt").read_text()
    assert text.startswith("# triton-mp analyze recommendation 1")
    parsed = text_format.Parse(text, model_config_pb2.ModelConfig())
    assert parsed.instance_group[0].count == 2
    assert parsed.dynamic_batching.max_queue_delay_microseconds == 0
    page = (tmp_path / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 2
    for name in report.CHART_FILES:
        assert (tmp_path / name).read_bytes().startswith(b"\x89PNG")
    assert "Recommended configs" in page
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["recommendations"][0]["point"] == "i2_b8_dyn0@c4"
    assert summary["shipped_best"] == "shipped@c1"  # concurrency 4 is over the budget
    assert len(summary["results"]) == 4


def test_gpu_note_names_each_device_s_peak() -> None:
    from triton_mp.analyze.sweep.results import GpuSample

    base = _result(Variant(instance_count=1, max_batch_size=8, dynamic_batching=False), 1, 1, 1)
    assert report.gpu_note([base]) == "GPU: none visible through NVML"

    def with_gpu(used_mib: int, util: int) -> Result:
        g = GpuSample(index=0, name="H200", used_bytes=used_mib << 20, utilization_percent=util)
        m = msgspec.structs.replace(base.measurement, gpus=(g,))
        return Result(point=base.point, measurement=m)

    note = report.gpu_note([with_gpu(100, 80), with_gpu(300, 20)])
    assert note == "GPU (highest over the points): 0 H200: 300 MiB used, 80% busy"
