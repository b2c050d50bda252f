"""bench/bench_vs_triton.py's pure pieces: the no-delay model's config, the per-workload
summary (medians and per-round ratios), the unclean-stop lines and the argument rules. The
bench runs servers; these run none."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from triton_mp.model_config.loader import read_config_pbtxt

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import bench_vs_triton  # noqa: E402
from common import BenchError  # noqa: E402
from vs_triton_ort import goal_budget_line  # noqa: E402
from vs_triton_pinned import (  # noqa: E402
    CLIENT_CPUS,
    PINNED_ORT,
    PINNED_ORT_CONFIGS,
    PINNED_SERVER,
    PINNED_SIDES,
    SERVER_CPUS,
    autogroup_nice,
    core_shares,
    cpu_ticks,
    off_pin,
    parse_cpu_list,
    pinned,
    pinned_lines,
    set_autogroup_nice,
    thread_affinities,
)
from vs_triton_report import summarise, unclean_stops  # noqa: E402
from vs_triton_workloads import (  # noqa: E402
    NODELAY_MODEL,
    OCR_1CORE_MODEL,
    OCR_2CORE_MODEL,
    WORKLOADS,
    Workload,
    nodelay_config,
    ocr_1core_config,
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


def _workload(key: str) -> Workload:
    (w,) = [w for w in WORKLOADS if w.key == key]
    return w


def test_ocr_shm_workload_is_the_2core_config_through_system_shared_memory() -> None:
    plain, shm = _workload("ocr_cls_c32_2core"), _workload("ocr_cls_c32_2core_shm")
    assert shm.model == plain.model == OCR_2CORE_MODEL
    assert shm.sides == plain.sides == ("triton-mp", "onnxruntime")
    assert shm.args("triton-mp") == [*plain.args("triton-mp"), "--shared-memory", "system"]
    assert shm.label != plain.label


def test_ocr_shm_workload_ratio_and_cpu_outside_ort_use_the_runs_raw_ort() -> None:
    plain, shm = _workload("ocr_cls_c32_2core"), _workload("ocr_cls_c32_2core_shm")
    raw = {"one_thread_cpu_us": {16: 810.0}, "two_session_cpu_us": {16: 870.0}}
    runs = [
        {**_rec("triton-mp", plain.key, 1, 2000.0, 9e3), "avg_batch": 16.0},
        {**_rec("onnxruntime", plain.key, 1, 4000.0, 9e3), **raw},
        {**_rec("triton-mp", shm.key, 1, 3200.0, 9e3), "avg_batch": 16.0, "cpu_us_per_infer": 1e3},
        {**_rec("onnxruntime", shm.key, 1, 3000.0, 9e3), **raw},
    ]
    rows = {r["workload"]: r for r in summarise([{"round": 1, "runs": runs}], [plain, shm])}
    assert rows[shm.key]["vs"]["triton-mp/onnxruntime"]["ratios"] == [0.8]
    # the best raw figure of the run (4000/s, the plain workload's) is the bound of both
    assert rows[plain.key]["vs"]["triton-mp/onnxruntime"]["ratios"] == [0.5]
    # 1000 us per image less two one-thread sessions at once at batch 16
    assert rows[shm.key]["outside_ort_sessions"] == 2
    assert rows[shm.key]["outside_ort_us"]["triton-mp"]["per_round"] == [130.0]


def test_nodelay_config_renames_the_model_and_empties_its_batcher() -> None:
    text = (BENCH / "model_repository" / "add_sub_py" / "config.pbtxt").read_text()
    out = nodelay_config(text)
    assert f'name: "{NODELAY_MODEL}"' in out
    assert "dynamic_batching { }" in out
    assert "max_queue_delay_microseconds" not in out


def test_nodelay_config_refuses_a_config_it_cannot_rewrite() -> None:
    with pytest.raises(bench_vs_triton.BenchError):
        nodelay_config('name: "other"\nmax_batch_size: 8\n')


SHIPPED_OCR = BENCH.parent / "model_repository" / "ocr_cls" / "config.pbtxt"


def _ocr_batching_8(tmp_path: Path, rewrite: Callable[[str], str], name: str) -> Any:
    """The shipped ocr_cls config as ``rewrite`` makes it, parsed; asserts it is ``name``
    with batches of 8 and a 2 ms delay (what both bench configs keep)."""
    (tmp_path / "config.pbtxt").write_text(rewrite(SHIPPED_OCR.read_text()))
    cfg = read_config_pbtxt(tmp_path / "config.pbtxt")
    assert cfg.name == name
    assert cfg.max_batch_size == 8
    assert list(cfg.dynamic_batching.preferred_batch_size) == [8]
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 2000
    return cfg


def test_ocr_2core_config_is_a_valid_two_instance_config_of_ocr_cls(tmp_path: Path) -> None:
    cfg = _ocr_batching_8(tmp_path, ocr_2core_config, OCR_2CORE_MODEL)
    assert [g.count for g in cfg.instance_group] == [2]


def test_ocr_2core_config_refuses_a_config_it_cannot_rewrite() -> None:
    with pytest.raises(bench_vs_triton.BenchError):
        ocr_2core_config('name: "ocr_cls"\nmax_batch_size: 32\n')


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
    shipped, two_core = _workload("ocr_cls_c32"), _workload("ocr_cls_c32_2core")
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
    shipped, two_core = _workload("ocr_cls_c32"), _workload("ocr_cls_c32_2core")
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


# ------------------------------------------------------- rerunning an unstable workload round
UNSTABLE_ERROR = (
    "Request concurrency: 16\nFailed to obtain stable measurement within 10 measurement "
    "windows for concurrency 16. Please try to increase the --measurement-interval.\n"
    "Failed to obtain stable measurement."
)


def _unstable(side: str) -> dict[str, Any]:
    return {"label": side, "rc": 1, "attempts": 3, "error": UNSTABLE_ERROR}


class _FakeRound:
    """What ``measure_workload`` uses of a round: its order, number, record and a ``measure``
    that answers from a script of records per try (no server, no perf_analyzer)."""

    def __init__(self, script: list[dict[str, dict[str, Any]]]) -> None:
        self.order = ["Triton", "triton-mp"]
        self.i = 2
        self.rnd: dict[str, Any] = {"round": 2, "runs": []}
        self.script = script
        self.measured: list[str] = []
        self.recorded: list[tuple[str, dict[str, Any]]] = []

    def measure(self, w: Any, side: str) -> dict[str, Any]:
        tries = sum(1 for s in self.measured if s == side)
        self.measured.append(side)
        return dict(self.script[min(tries, len(self.script) - 1)][side])

    def record(self, w: Any, side: str, rec: dict[str, Any]) -> None:
        self.recorded.append((side, rec))


def _pair_workload() -> Any:
    (w,) = [w for w in WORKLOADS if w.key == "id1m"]
    return dataclasses.replace(w, sides=("Triton", "triton-mp"))


def test_only_a_run_without_a_stable_measurement_asks_for_a_rerun() -> None:
    from vs_triton_rerun import rerun_round, unstable_sides  # noqa: PLC0415

    good = _rec("triton-mp", "id1m", 1, 900.0, 4000.0)
    not_ready = {"error": "identity_py not ready: UNAVAILABLE: failed to load"}
    timed_out = {"error": "no result after 150 s"}
    recs = {"Triton": _unstable("Triton"), "triton-mp": good}
    assert unstable_sides(recs) == ["Triton"]
    assert rerun_round(recs, tries=1, max_tries=2)
    assert not rerun_round(recs, tries=2, max_tries=2), "bounded: the last try stands"
    assert not rerun_round(recs, tries=1, max_tries=1)
    for other in (not_ready, timed_out):
        assert unstable_sides({"Triton": other, "triton-mp": good}) == []
        assert not rerun_round({"Triton": other, "triton-mp": good}, 1, 3)
    # NOTE: a record with a figure is never unstable, whatever perf_analyzer printed before
    assert unstable_sides({"Triton": {**good, "error": UNSTABLE_ERROR}}) == []


def test_an_unstable_side_reruns_every_side_of_the_workload_round_and_says_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    w = _pair_workload()
    first = {"Triton": _unstable("Triton"), "triton-mp": _rec("triton-mp", w.key, 2, 900, 4e3)}
    second = {
        "Triton": _rec("Triton", w.key, 2, 600.0, 6e3),
        "triton-mp": _rec("triton-mp", w.key, 2, 880.0, 4e3),
    }
    r = _FakeRound([first, second])
    bench_vs_triton.measure_workload(r, w, max_tries=2)  # type: ignore[arg-type]
    assert r.measured == ["Triton", "triton-mp", "Triton", "triton-mp"]
    assert [(s, rec["throughput"], rec["tries"]) for s, rec in r.recorded] == [
        ("Triton", 600.0, 2),
        ("triton-mp", 880.0, 2),
    ]
    (rerun,) = r.rnd["reruns"]
    assert (rerun["workload"], rerun["try"], rerun["unstable"]) == (w.key, 1, ["Triton"])
    out = capsys.readouterr().out
    assert (
        "no stable measurement for Triton; rerunning round 2 of this workload (try 2 of 2)" in out
    )
    from vs_triton_rerun import rerun_summary  # noqa: PLC0415

    assert rerun_summary([r.rnd]) == [
        f"round 2: {w.key} rerun after try 1 (no stable measurement for Triton)"
    ]


def test_a_side_that_stays_unstable_ends_the_round_after_the_last_try() -> None:
    w = _pair_workload()
    always = {"Triton": _unstable("Triton"), "triton-mp": _unstable("triton-mp")}
    r = _FakeRound([always])
    bench_vs_triton.measure_workload(r, w, max_tries=3)  # type: ignore[arg-type]
    assert len(r.measured) == 6
    assert len(r.rnd["reruns"]) == 2
    assert [(s, rec.get("throughput"), rec["tries"]) for s, rec in r.recorded] == [
        ("Triton", None, 3),
        ("triton-mp", None, 3),
    ]


def test_a_round_whose_failure_is_not_instability_is_not_rerun() -> None:
    w = _pair_workload()
    r = _FakeRound(
        [{"Triton": {"error": "Triton did not start: boom"}, "triton-mp": {"error": "x"}}]
    )
    bench_vs_triton.measure_workload(r, w, max_tries=3)  # type: ignore[arg-type]
    assert len(r.measured) == 2
    assert "reruns" not in r.rnd


def test_goal_budget_is_what_the_goal_rate_leaves_the_workers() -> None:
    w = _workload("ocr_cls_c32_2core_shm")

    def mp(rnd: int, pa_cores: float, fe: float, worker: float) -> dict[str, Any]:
        roles = {"frontend": {"cpu_us": fe}, "scheduler": {"cpu_us": 20.0}}
        roles["worker"] = {"cpu_us": worker}
        return {**_rec("triton-mp", w.key, rnd, 2000.0, 9e3), "client_cores": pa_cores,
                "roles": roles}  # fmt: skip

    def ort(rnd: int, infer_s: float) -> dict[str, Any]:
        return {**_rec("onnxruntime", w.key, rnd, infer_s, 9e3), "cpu_us_per_infer": 500.0}

    rounds = [
        {"round": 1, "runs": [mp(1, 0.12, 40.0, 600.0), ort(1, 4000.0)]},
        {"round": 2, "runs": [mp(2, 0.16, 60.0, 620.0), ort(2, 3000.0)]},
        {"round": 3, "runs": [{"side": "triton-mp", "workload": w.key, "round": 3,
                               "error": "no stable measurement"}, ort(3, 3500.0)]},
    ]  # fmt: skip
    (row,) = summarise(rounds, [w], cpus=2)
    b = row["goal_budget"]
    # 0.8 x the run's best raw figure (4000/s): 3200/s, 2 cores -> 625 us per image
    assert (b["rate"], b["budget_us"]) == (3200.0, 625.0)
    # perf_analyzer 0.12 and 0.16 cores at 2000/s: 60 and 80 us, median 70; frontend +
    # scheduler 60 and 80, median 70: the workers may spend 625 - 140 = 485 (1.55 cores)
    assert (b["pa_us"], b["others_us"]) == (70.0, 70.0)
    assert (b["workers_allowed_us"], b["workers_allowed_cores"]) == (485.0, 1.55)
    assert (b["workers_us"], b["raw_ort_us"]) == (610.0, 500.0)
    # no usable-core count, no budget; a run where triton-mp never measured: None
    assert "goal_budget" not in summarise(rounds, [w])[0]
    (row,) = summarise([{"round": 3, "runs": rounds[2]["runs"]}], [w], cpus=2)
    assert row["goal_budget"] is None


# --------------------------------------------------------------------------- pinned (core 0)


def test_pinned_workloads_serve_the_1core_config_on_core0_against_raw_ort_on_core0() -> None:
    plain, shm = _workload("ocr_cls_c32_core0"), _workload("ocr_cls_c32_core0_shm")
    assert plain.model == shm.model == OCR_1CORE_MODEL
    assert plain.sides == shm.sides == (PINNED_SERVER, PINNED_ORT)
    assert shm.args(PINNED_SERVER) == [*plain.args(PINNED_SERVER), "--shared-memory", "system"]
    assert PINNED_SIDES == {PINNED_SERVER: SERVER_CPUS, PINNED_ORT: SERVER_CPUS}
    assert not SERVER_CPUS & CLIENT_CPUS
    # the 2-core workloads are unchanged: unpinned sides
    assert _workload("ocr_cls_c32_2core").sides == ("triton-mp", "onnxruntime")
    # raw ORT on one core is one session with one intra-op thread (ORT's own pool would pin
    # its threads to every core)
    assert PINNED_ORT_CONFIGS == ((1, 1),)


def test_ocr_1core_config_is_one_instance_one_thread_batching_8(tmp_path: Path) -> None:
    cfg = _ocr_batching_8(tmp_path, ocr_1core_config, OCR_1CORE_MODEL)
    assert [g.count for g in cfg.instance_group] == [1]
    assert cfg.parameters["intra_op_thread_count"].string_value == "1"
    assert "max_batch_size: 16" in ocr_1core_config(SHIPPED_OCR.read_text(), 16)
    with pytest.raises(BenchError):
        ocr_1core_config('name: "ocr_cls"\n')


def test_parse_cpu_list_reads_ranges_and_single_cpus() -> None:
    assert parse_cpu_list("0\n") == {0}
    assert parse_cpu_list("0-2,5") == {0, 1, 2, 5}
    assert parse_cpu_list("") == frozenset()


def test_off_pin_names_each_thread_that_may_leave_the_pinned_cpus() -> None:
    affs = {
        (10, 10): ("triton-mp: supervisor", frozenset({0})),
        (11, 12): ("triton-mp: worker ocr_cls_1core_0_0", frozenset({0, 1})),
    }
    (line,) = off_pin(affs, frozenset({0}))
    assert line.startswith("pid 11 tid 12 (triton-mp: worker")
    assert off_pin(affs, frozenset({0, 1})) == []
    assert off_pin({}, frozenset({0})) == ["no thread found"]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two usable CPUs")
def test_a_process_started_in_pinned_inherits_the_pin_and_one_outside_does_not() -> None:
    """The bench pins a server by starting it inside ``pinned``; check_pin refuses a tree
    with a thread that may run elsewhere."""
    cpu = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    with pinned(frozenset({cpu})):
        inside = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    outside = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert os.sched_getaffinity(0) == before
        affs = thread_affinities(inside.pid)
        assert affs
        assert all(cpus == {cpu} for _, cpus in affs.values())
        bench_vs_triton.check_pin(SimpleNamespace(pid=inside.pid, info={}), frozenset({cpu}))
        with pytest.raises(BenchError, match="not on cpus"):
            bench_vs_triton.check_pin(SimpleNamespace(pid=outside.pid, info={}), frozenset({cpu}))
    finally:
        for p in (inside, outside):
            p.kill()
            p.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="restoring a raised nice value needs root")
def test_pinned_sets_the_nice_value_children_inherit_and_restores_the_threads() -> None:
    cpu = min(os.sched_getaffinity(0))
    before = os.getpriority(os.PRIO_PROCESS, 0)
    group = autogroup_nice(os.getpid())
    with pinned(frozenset({cpu}), nice=before + 3):
        assert os.getpriority(os.PRIO_PROCESS, 0) == before + 3
        if group is not None:  # the session's autogroup too, else the nice value weighs little
            assert autogroup_nice(os.getpid()) == before + 3
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert os.getpriority(os.PRIO_PROCESS, child.pid) == before + 3
        assert os.getpriority(os.PRIO_PROCESS, 0) == before
        assert autogroup_nice(os.getpid()) == group
    finally:
        child.kill()
        child.wait()


def test_autogroup_nice_reads_and_sets_procs_autogroup_line(tmp_path: Path) -> None:
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "autogroup").write_text("/autogroup-5879 nice 0\n")
    assert autogroup_nice(7, tmp_path) == 0
    assert set_autogroup_nice(7, -10, tmp_path)
    assert (tmp_path / "7" / "autogroup").read_text() == "-10"
    assert autogroup_nice(8, tmp_path) is None
    assert not set_autogroup_nice(8, -10, tmp_path)


def test_core_shares_split_each_cpus_ticks_into_busy_idle_and_steal(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal
    stat.write_text(
        "cpu  10 0 10 10 0 0 0 0 0 0\ncpu0 5 0 5 5 0 0 0 0 0 0\ncpu1 5 0 5 5 0 0 0 0 0 0\nintr 1\n"
    )
    a = cpu_ticks(stat)
    assert a == {0: (10, 5, 0), 1: (10, 5, 0)}
    stat.write_text(
        "cpu  0 0 0 0 0 0 0 0 0 0\ncpu0 65 0 5 15 5 5 5 10 0 0\ncpu1 5 0 5 105 0 0 0 0 0 0\n"
    )
    shares = core_shares(a, cpu_ticks(stat))
    # cpu0: busy 60 + 5 + 5 = 70, idle 10 + 5 = 15, steal 10 -> of 95... busy 0.737
    assert shares["0"] == {
        "busy": round(70 / 95, 3),
        "idle": round(15 / 95, 3),
        "steal": round(10 / 95, 3),
    }
    assert shares["1"] == {"busy": 0.0, "idle": 1.0, "steal": 0.0}


def _pinned_rounds() -> list[dict[str, Any]]:
    w = _workload("ocr_cls_c32_core0")
    shares = {"0": {"busy": 0.95, "idle": 0.05, "steal": 0.0}, "1": {"busy": 0.4, "idle": 0.6}}
    runs = []
    for i, (mp, ort) in enumerate([(1200.0, 1500.0), (1000.0, 1600.0)], start=1):
        runs.append(
            {
                **_rec(PINNED_SERVER, w.key, i, mp, 9e3),
                "cpu_us_per_infer": 800.0,
                "avg_batch": 8.0,
                "client_cores": 0.24,
                "server_cores": 0.9,
                "roles": {
                    "frontend": {"cpu_us": 100.0},
                    "scheduler": {"cpu_us": 40.0},
                    "worker": {"cpu_us": 660.0},
                },
                "core_shares": shares,
            }
        )
        runs.append(
            {
                **_rec(PINNED_ORT, w.key, i, ort, 9e3),
                "cpu_us_per_infer": 600.0,
                "own_cores": 0.7,
                "one_thread_cpu_us": {8: 600.0, 16: 620.0},
                "core_shares": shares,
            }
        )
    # an unpinned raw ORT figure in the same run, higher: not the pinned workload's bound
    runs.append(_rec("onnxruntime", "ocr_cls_c32_2core", 1, 4000.0, 9e3))
    return [{"round": 1, "runs": runs[:2] + runs[4:]}, {"round": 2, "runs": runs[2:4]}]


def test_pinned_ratio_divides_by_raw_ort_on_core0_and_the_budget_leaves_out_perf_analyzer() -> None:
    w = _workload("ocr_cls_c32_core0")
    (row,) = summarise(_pinned_rounds(), [w], cpus=2)
    assert row["pinned_ort_best"] == 1600.0
    assert row["vs"][f"{PINNED_SERVER}/{PINNED_ORT}"]["ratios"] == [0.75, 0.625]
    b = row["goal_budget"]
    assert row["goal_budget_cpus"] == 1
    assert b["rate"] == 1280.0  # 0.8 x 1600
    assert b["budget_us"] == 781.2  # 1e6 / 1280 on one core
    assert b["pa_us"] is None  # perf_analyzer runs on core 1
    assert b["others_us"] == 140.0
    assert b["workers_allowed_us"] == 641.2
    assert b["workers_us"] == 660.0
    assert "perf_analyzer (on other cores) 0" in goal_budget_line("x", b, 1)
    # 800 us per image less raw ORT's one thread at batch 8
    assert row["outside_ort_us"][PINNED_SERVER]["per_round"] == [200.0, 200.0]
    r1 = row["pinned_rounds"][0]
    assert r1["cpu_ratio"] == 0.75  # 600 / 800
    assert r1["server_core_idle"] == 0.05
    assert r1["server_core_background"] == 0.05  # 0.95 busy - 0.9 the server's tree
    assert r1["ort_core_background"] == 0.25  # 0.95 busy - 0.7 raw ORT's own
    assert r1["client_core_background"] == 0.16  # 0.4 busy - 0.24 perf_analyzer's
    assert ", all at nice -10:" in pinned_lines(row, 0.8, -10)[0]
    lines = pinned_lines(row, 0.8)
    assert "nice" not in lines[0]
    assert "0.69x raw onnxruntime's best on cpu [0] (1600 img/s" in lines[0]
    assert "frontend 100 / scheduler 40 / worker 660" in lines[-1]
    # median of 0.24 cores / 1200 img/s and / 1000 img/s
    assert "perf_analyzer on core 1: 220" in lines[-1]
