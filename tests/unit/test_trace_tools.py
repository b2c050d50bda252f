"""``triton-mp trace summary`` and ``trace timeline`` on a hand-made trace file."""

from __future__ import annotations

import json
from pathlib import Path

from triton_mp.cli import trace_tools
from triton_mp.cli.main import main

GRPC = [
    ("GRPC_WAITREAD_START", 1_000),
    ("GRPC_WAITREAD_END", 3_000),
    ("REQUEST_START", 4_000),
    ("QUEUE_START", 5_000),
    ("COMPUTE_START", 9_000),
    ("COMPUTE_INPUT_END", 10_000),
    ("COMPUTE_OUTPUT_START", 20_000),
    ("COMPUTE_END", 21_000),
    ("INFER_RESPONSE_COMPLETE", 22_000),
    ("REQUEST_END", 23_000),
    ("GRPC_SEND_START", 24_000),
    ("GRPC_SEND_END", 26_000),
]


def _file(tmp_path: Path, scale: int = 1) -> Path:
    objs: list[dict] = []
    for tid, k in ((1, 1), (2, 3)):
        objs.append({"id": tid, "model_name": "m", "model_version": 1})
        objs += [{"id": tid, "timestamps": [{"name": n, "ns": ns * k}]} for n, ns in GRPC]
    objs.append({"id": 3, "model_name": "child", "model_version": 2, "parent_id": 1})
    objs += [
        {"id": 3, "timestamps": [{"name": "REQUEST_START", "ns": 11_000}]},
        {"id": 3, "timestamps": [{"name": "REQUEST_END", "ns": 15_000}]},
    ]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(objs))
    return path


def test_phases_and_summary(tmp_path: Path) -> None:
    traces = trace_tools.load(_file(tmp_path))
    assert [t.protocol for t in traces] == ["GRPC", "GRPC", "BLS"]
    assert trace_tools.phase_ns(traces[0]) == {
        "network read": 2_000,
        "queue": 4_000,
        "compute input": 1_000,
        "infer": 10_000,
        "output": 1_000,
        "send": 2_000,
        "handler": 19_000,
        "total": 25_000,
    }
    text = trace_tools.summary(traces)
    assert "Summary for m (1), GRPC: trace count = 2" in text
    # queue: 4 us and 12 us -> mean 8, p50 (nearest rank) 4, p99 12
    assert "  queue                 8.0        4.0       12.0" in text
    assert "Summary for child (2), BLS: trace count = 1" in text


def test_timeline_puts_each_phase_on_its_process(tmp_path: Path) -> None:
    doc = trace_tools.timeline(trace_tools.load(_file(tmp_path)))
    events = doc["traceEvents"]
    assert isinstance(events, list)
    procs = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    owner = {(e["tid"], e["name"]): procs[e["pid"]] for e in events if e["ph"] in ("X", "i")}
    assert owner[(1, "read")] == owner[(1, "send")] == owner[(1, "response")] == "frontend"
    assert owner[(1, "queue")] == "scheduler"
    assert owner[(1, "infer")] == "worker m"
    assert owner[(3, "child request")] == "worker m"  # the BLS caller's worker
    infer = next(e for e in events if e["name"] == "infer" and e["tid"] == 1)
    assert (infer["ts"], infer["dur"]) == (9.0, 10.0)  # µs from the first timestamp


def test_the_cli_writes_the_timeline(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = _file(tmp_path)
    assert main(["trace", "summary", str(path)]) == 0
    assert "trace count = 2" in capsys.readouterr().out
    out = tmp_path / "tl.json"
    assert main(["trace", "timeline", str(path), "-o", str(out)]) == 0
    assert json.loads(out.read_text())["displayTimeUnit"] == "ns"
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert main(["trace", "summary", str(bad)]) == 1
