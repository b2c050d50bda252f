"""bench/bench_vs_triton.py's pure pieces: the no-delay model's config, the per-workload
summary (medians and per-round ratios), the unclean-stop lines and the argument rules. The
bench runs servers; these run none."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from triton_mp.model_config.loader import read_config_pbtxt

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import bench_vs_triton  # noqa: E402
from vs_triton_report import summarise, unclean_stops  # noqa: E402
from vs_triton_workloads import (  # noqa: E402
    NODELAY_MODEL,
    OCR_2CORE_MODEL,
    WORKLOADS,
    nodelay_config,
    ocr_2core_config,
)


def _rec(side: str, workload: str, rnd: int, infer_s: float, p50_us: float) -> dict[str, Any]:
    return {
        "side": side,
        "workload": workload,
        "round": rnd,
        "throughput": infer_s,
        "p50_us": p50_us,
        "p99_us": 2 * p50_us,
        "cpu_us_per_infer": 1e6 / infer_s,
    }


def test_nodelay_config_renames_the_model_and_empties_its_batcher() -> None:
    text = (BENCH / "model_repository" / "add_sub_py" / "config.pbtxt").read_text()
    out = nodelay_config(text)
    assert f'name: "{NODELAY_MODEL}"' in out
    assert "dynamic_batching { }" in out
    assert "max_queue_delay_microseconds" not in out


def test_nodelay_config_refuses_a_config_it_cannot_rewrite() -> None:
    with pytest.raises(bench_vs_triton.BenchError):
        nodelay_config('name: "other"\nmax_batch_size: 8\n')


def test_ocr_2core_config_is_a_valid_two_instance_config_of_ocr_cls(tmp_path: Path) -> None:
    shipped = (BENCH.parent / "model_repository" / "ocr_cls" / "config.pbtxt").read_text()
    (tmp_path / "config.pbtxt").write_text(ocr_2core_config(shipped))
    cfg = read_config_pbtxt(tmp_path / "config.pbtxt")
    assert cfg.name == OCR_2CORE_MODEL
    assert cfg.max_batch_size == 16
    assert list(cfg.dynamic_batching.preferred_batch_size) == [16]
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 2000
    assert [g.count for g in cfg.instance_group] == [2]


def test_ocr_2core_config_refuses_a_config_it_cannot_rewrite() -> None:
    with pytest.raises(bench_vs_triton.BenchError):
        ocr_2core_config('name: "ocr_cls"\nmax_batch_size: 8\n')


def test_summarise_takes_medians_and_per_round_ratios() -> None:
    (w,) = [w for w in WORKLOADS if w.key == "add_sub_c16"]
    rounds = [
        {
            "round": 1,
            "runs": [
                _rec("Triton", w.key, 1, 1000.0, 2000.0),
                _rec("triton-mp", w.key, 1, 1500.0, 1000.0),
            ],
        },
        {
            "round": 2,
            "runs": [
                _rec("Triton", w.key, 2, 1000.0, 2000.0),
                _rec("triton-mp", w.key, 2, 500.0, 4000.0),
                {"side": "floor", "workload": w.key, "round": 2, "error": "boom\nfloor died"},
            ],
        },
    ]
    (row,) = summarise(rounds, [w])
    assert row["triton-mp"]["throughputs"] == [1500.0, 500.0]
    assert row["triton-mp"]["throughput"] == 1000.0
    assert row["ratios"] == [1.5, 0.5]
    assert row["ratio"] == 1.0
    assert row["p50_vs_triton"]["triton-mp"]["ratios"] == [0.5, 2.0]
    assert row["floor"]["rounds_ok"] == 0
    assert row["floor"]["error"] == "floor died"
    assert row["vs"]["triton-mp/floor"] == {"ratios": [], "ratio": None}


def test_ratios_to_raw_onnxruntime_divide_by_its_best_figure_of_the_run() -> None:
    (shipped, two_core) = [w for w in WORKLOADS if w.model.startswith("ocr_cls")]
    ort = "onnxruntime"
    rounds = [
        {"round": 1, "runs": [_rec("triton-mp", shipped.key, 1, 1000.0, 9e3),
                              _rec(ort, shipped.key, 1, 1250.0, 9e3),
                              _rec("triton-mp", two_core.key, 1, 1400.0, 9e3),
                              _rec(ort, two_core.key, 1, 2000.0, 9e3)]},
        {"round": 2, "runs": [_rec("triton-mp", shipped.key, 2, 1100.0, 9e3),
                              _rec(ort, shipped.key, 2, 1000.0, 9e3)]},
    ]  # fmt: skip
    rows = {r["workload"]: r for r in summarise(rounds, [shipped, two_core])}
    assert rows[shipped.key]["vs"]["triton-mp/onnxruntime"]["ratios"] == [0.5, 0.55]
    assert rows[two_core.key]["vs"]["triton-mp/onnxruntime"]["ratios"] == [0.7]


def test_cpu_outside_onnxruntime_of_the_2core_config_is_less_two_sessions_at_once() -> None:
    (shipped, two_core) = [w for w in WORKLOADS if w.model.startswith("ocr_cls")]
    raw = {"one_thread_cpu_us": {8: 800.0, 16: 810.0}, "two_session_cpu_us": {8: 850.0, 16: 870.0}}
    rounds = []
    for w in (shipped, two_core):
        mp = {**_rec("triton-mp", w.key, 1, 1000.0, 9e3), "avg_batch": 15.0}
        rounds.append(mp)
        rounds.append({**_rec("onnxruntime", w.key, 1, 2000.0, 9e3), **raw})
    rows = {
        r["workload"]: r for r in summarise([{"round": 1, "runs": rounds}], [shipped, two_core])
    }
    # 1e6 / 1000 images/s = 1000 us per image; batch 15 is nearest 16
    assert rows[shipped.key]["outside_ort_us"]["triton-mp"]["per_round"] == [190.0]
    assert rows[two_core.key]["outside_ort_us"]["triton-mp"]["per_round"] == [130.0]
    # a record from before the two-session figure: one session alone
    del rounds[3]["two_session_cpu_us"]
    rows = {r["workload"]: r for r in summarise([{"round": 1, "runs": rounds}], [two_core])}
    assert rows[two_core.key]["outside_ort_us"]["triton-mp"]["per_round"] == [190.0]


def test_unclean_stops_names_servers_that_left_something_but_not_ones_never_started() -> None:
    rounds = [
        {
            "round": 1,
            "start_errors": {"floor": "no port"},
            "servers": {
                "Triton": {"clean": True},
                "triton-mp": {
                    "clean": False,
                    "stop": "SIGKILL",
                    "exit_code": -9,
                    "leftover_processes": [{"cmdline": "python -m triton_mp worker"}],
                    "shm_left": ["/triton_mp_x"],
                },
                "floor": {"clean": False},
            },
        }
    ]
    (line,) = unclean_stops(rounds)
    assert line.startswith("round 1: triton-mp stop NOT clean: SIGKILL, exit -9")
    assert "/triton_mp_x" in line


def test_baseline_adds_the_base_side_next_to_triton_mp_and_skip_sides_removes() -> None:
    args = bench_vs_triton.parse_args(
        ["--quick", "--workloads", "add_sub_c1,id1m", "--baseline", "HEAD", "--skip-sides", "floor"]
    )
    sides = {w.key: w.sides for w in args.workloads}
    assert "triton-mp base" in sides["add_sub_c1"]
    assert "floor" not in sides["add_sub_c1"]
    assert "triton-mp base" in sides["id1m"]
    assert args.rounds == 1
    assert args.window_ms == 1000


def test_unknown_workloads_and_sides_are_refused() -> None:
    with pytest.raises(SystemExit):
        bench_vs_triton.parse_args(["--workloads", "nope"])
    with pytest.raises(SystemExit):
        bench_vs_triton.parse_args(["--skip-sides", "nobody"])
