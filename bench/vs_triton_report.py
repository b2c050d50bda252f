"""bench_vs_triton.py's summary: medians and ratios per workload over the rounds
(``summarise``), the per-role CPU table, the frontend over the native floor, and the printed
table. Pure functions of the rounds' records."""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import common  # bench/common.py: bench/ is on sys.path when this runs as a script
from common import (
    fmt,
    med,
)
from vs_triton_ort import OCR_GOAL, goal_budget, goal_budget_line, outside_ort
from vs_triton_pinned import PINNED_ORT, PINNED_SERVER, SERVER_CPUS, pinned_lines, pinned_rounds
from vs_triton_rerun import rerun_summary
from vs_triton_workloads import FLOORS, OCR_2CORE_MODEL, PAIR, RATIOS, SERVERLESS, Workload


def ratio_key(num: str, den: str) -> str:
    return f"{num}/{den}"


def best_raw_ort(rounds: list[dict[str, Any]], side: str = "onnxruntime") -> float | None:
    """Raw onnxruntime's best images/s over every round and workload of a run (``side``: the
    unpinned one, or the pinned one on core 0), or None."""
    figures = [
        rec["throughput"]
        for r in rounds
        for rec in r["runs"]
        if rec.get("side") == side and rec.get("throughput")
    ]
    return max(figures) if figures else None


def summarise(
    rounds: list[dict[str, Any]], workloads: list[Workload], cpus: int | None = None
) -> list[dict[str, Any]]:
    """One row per workload: per side (those the workload ran on) medians over rounds, and the
    throughput ratios of RATIOS per round and their median. ``ratio``/``ratios`` (triton-mp /
    Triton) stay at the top level for the chart and older readers; ``vs`` holds every ratio;
    ``p50_vs_triton`` is each triton-mp side's p50 / Triton's p50, per round and median.

    Raw onnxruntime is one yardstick per run: every ratio to it divides by its best
    throughput of the whole run (``best_raw_ort``), not by its figure of the same round. The
    same measurement moved 740-2,370 images/s within one run (its spinning intra-op threads
    collapse next to any other process), and issue 33's goal is against its best. With
    ``cpus`` (the machine's usable cores) an ocr_cls row also gets ``goal_budget``: what the
    goal's rate leaves its workers (``vs_triton_ort.goal_budget``)."""
    rows = []
    best = {side: best_raw_ort(rounds, side) for side in SERVERLESS}
    for w in workloads:
        row: dict[str, Any] = {
            "workload": w.key,
            "label": w.label,
            "protocol": w.protocol,
            "sides": list(w.sides),
            "perf_analyzer_args": ["-i", w.protocol, *w.args()],
        }
        by_round: dict[int, dict[str, dict[str, Any]]] = {}
        for r in rounds:
            for rec in r["runs"]:
                if rec["workload"] == w.key:
                    by_round.setdefault(r["round"], {})[rec["side"]] = rec
        for side in w.sides:
            recs = [by_round[i][side] for i in sorted(by_round) if side in by_round[i]]
            good = [rec for rec in recs if rec.get("throughput") is not None]
            errors = [rec["error"] for rec in recs if rec.get("throughput") is None]
            s: dict[str, Any] = {
                "rounds_ok": len(good),
                "throughputs": [rec["throughput"] for rec in good],
                "throughput": med([rec["throughput"] for rec in good]),
                "p50_ms": None if not good else med([rec["p50_us"] for rec in good]) / 1000,
                "p50s_ms": [rec["p50_us"] / 1000 for rec in good],
                "p99_ms": None if not good else med([rec["p99_us"] for rec in good]) / 1000,
                "p99s_ms": [rec["p99_us"] / 1000 for rec in good],
                "server_cores": med([rec.get("server_cores") for rec in good]),
                "client_cores": med([rec.get("client_cores") for rec in good]),
                "machine_cores_busy": med([rec.get("machine_cores_busy") for rec in good]),
                "other_cores": med([common.other_cores(rec) for rec in good]),
                "server_queue_us": med([rec.get("server_queue_us") for rec in good]),
                "server_compute_us": med([rec.get("server_compute_us") for rec in good]),
                "cpu_us": med([rec.get("cpu_us_per_infer") for rec in good]),
                "wakeups": med([rec.get("wakeups_per_infer") for rec in good]),
                "roles": role_medians(good),
            }
            if errors:
                s["error"] = common.last_line(errors[-1], 160)
            row[side] = s
        vs: dict[str, dict[str, Any]] = {}
        for num, den in RATIOS:
            if num not in w.sides or den not in w.sides:
                continue
            per_round = []
            for i in sorted(by_round):
                a, b = by_round[i].get(num, {}), by_round[i].get(den, {})
                bound = best[den] if den in SERVERLESS else b.get("throughput")
                if bound and a.get("throughput") is not None:
                    per_round.append(round(a["throughput"] / bound, 3))
            vs[ratio_key(num, den)] = {
                "ratios": per_round,
                "ratio": round(statistics.median(per_round), 3) if per_round else None,
            }
        row["vs"] = vs
        row.update(ort_fields(w, by_round, best, cpus))
        # NOTE: PAIR lists the sides as (Triton, triton-mp); the ratio is triton-mp/Triton.
        pair = vs.get(ratio_key(PAIR[1], PAIR[0]), {"ratios": [], "ratio": None})
        row["ratios"], row["ratio"] = pair["ratios"], pair["ratio"]
        p50: dict[str, dict[str, Any]] = {}
        for side in (x for x in w.sides if x.startswith("triton-mp")):
            per_round = []
            for i in sorted(by_round):
                a, b = by_round[i].get(side, {}), by_round[i].get("Triton", {})
                if b.get("p50_us") and a.get("p50_us") is not None:
                    per_round.append(round(a["p50_us"] / b["p50_us"], 3))
            p50[side] = {
                "ratios": per_round,
                "ratio": round(statistics.median(per_round), 3) if per_round else None,
            }
        row["p50_vs_triton"] = p50
        rows.append(row)
    return rows


def ort_fields(
    w: Workload,
    by_round: dict[int, dict[str, dict[str, Any]]],
    best: dict[str, float | None],
    cpus: int | None,
) -> dict[str, Any]:
    """An ocr_cls row's fields (none for other workloads): each triton-mp side's CPU per
    image outside onnxruntime, the goal's budget for the workers (on the machine's ``cpus``
    with perf_analyzer on them; on ``SERVER_CPUS`` without it for the pinned workloads), and
    for the pinned ones their best raw figure and per-round core shares."""
    raw = next((s for s in w.sides if s in SERVERLESS), None)
    if raw is None:
        return {}
    sessions = 2 if w.model == OCR_2CORE_MODEL else 1
    out: dict[str, Any] = {
        "outside_ort_us": outside_ort(by_round, w.sides, sessions, raw),
        "outside_ort_sessions": sessions,
    }
    if raw == PINNED_ORT:
        out["pinned_ort_best"] = best[raw]
        out["pinned_rounds"] = pinned_rounds(by_round)
        out["goal_budget"] = goal_budget(
            by_round, best[raw], len(SERVER_CPUS), sides=(PINNED_SERVER, raw), client_shares=False
        )
        out["goal_budget_cpus"] = len(SERVER_CPUS)
    elif cpus:
        out["goal_budget"] = goal_budget(by_round, best[raw], cpus)
        out["goal_budget_cpus"] = cpus
    return out


def role_medians(recs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per process role (pa_run.py's ``roles``): the medians over rounds of its CPU µs and
    wake-ups per inference."""
    names = sorted({role for rec in recs for role in rec.get("roles") or {}})
    return {
        role: {
            k: med([(rec.get("roles") or {}).get(role, {}).get(k) for rec in recs])
            for k in ("cpu_us", "wakeups", "cores")
        }
        for role in names
    }


ROLE_ORDER = ("frontend", "scheduler", "worker", "supervisor", "stub", "main")


def cpu_table(rows: list[dict[str, Any]], names: dict[str, str]) -> str:
    """Per workload and server: CPU µs per inference (the whole tree, then per process role)
    and voluntary context switches (wake-ups) per inference, medians over rounds."""
    head = (
        f"{'workload':26} {'proto':5} {'server':16} | {'infer/s':>8} {'p50 ms':>7} "
        f"{'p99 ms':>7} | {'CPU us/inf':>10} {'wake/inf':>8} | "
        "per role: CPU us (wake-ups) per inference"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        for k, side in enumerate(r["sides"]):
            s = r[side]
            roles = s.get("roles") or {}
            per_role = ", ".join(
                f"{role} {fmt(roles[role]['cpu_us'], '.0f')} ({fmt(roles[role]['wakeups'], '.2f')})"
                for role in sorted(
                    roles, key=lambda x: ROLE_ORDER.index(x) if x in ROLE_ORDER else 99
                )
                if (roles[role].get("cores") or 0) >= 0.005 or side.startswith("triton-mp")
            )
            label = (r["label"], r["protocol"]) if k == 0 else ("", "")
            lines.append(
                f"{label[0]:26} {label[1]:5} {names[side][:16]:16} | "
                f"{fmt(s['throughput'], '8.1f')} {fmt(s['p50_ms'], '7.2f')} "
                f"{fmt(s['p99_ms'], '7.2f')} | {fmt(s.get('cpu_us'), '10.0f')} "
                f"{fmt(s.get('wakeups'), '8.2f')} | {per_role}".rstrip()
            )
    return "\n".join(lines)


def frontend_vs_native_floor(rounds: list[dict[str, Any]], workloads: list[Workload]) -> list[str]:
    """Per workload that ran on both: each triton-mp side's frontend CPU µs per inference
    (pa_run.py's role "frontend") over the native floor's whole CPU µs per inference, per
    round (the two measured seconds apart) and the median: issue 33's goal is <= 2x for
    add_sub_py c=16."""
    lines = []
    for w in workloads:
        if "native floor" not in w.sides:
            continue
        for side in (s for s in w.sides if s.startswith("triton-mp")):
            fe, nf, ratios = [], [], []
            for r in rounds:
                recs = {rec["side"]: rec for rec in r["runs"] if rec["workload"] == w.key}
                a = ((recs.get(side) or {}).get("roles") or {}).get("frontend", {}).get("cpu_us")
                b = (recs.get("native floor") or {}).get("cpu_us_per_infer")
                if a is not None and b:
                    fe.append(a)
                    nf.append(b)
                    ratios.append(round(a / b, 2))
            if ratios:
                lines.append(
                    f"{w.label} {w.protocol}: {side} frontend CPU {fmt(med(fe), '.0f')} us/inf, "
                    f"native floor {fmt(med(nf), '.0f')} us/inf: "
                    f"{fmt(statistics.median(ratios), '.2f')}x (per round {ratios})"
                )
    return lines


def side_names(mp_name: str) -> dict[str, str]:
    return {
        "Triton": "Triton 2.51",
        "triton-mp": mp_name,
        "triton-mp base": "triton-mp base",
        "triton-mp fp2": mp_name + " fp2",
        "triton-mp python": mp_name + " python",
        "floor": "Python floor",
        "native floor": "native floor",
        "identity floor": "identity floor",
        "onnxruntime": "raw onnxruntime",
        PINNED_SERVER: mp_name + " on core 0",
        PINNED_ORT: "raw onnxruntime on core 0",
    }


def side_cells(s: dict[str, Any]) -> str:
    return (
        f"{fmt(s['throughput'], '8.1f')} {fmt(s['p50_ms'], '7.2f')} "
        f"{fmt(s['p99_ms'], '7.2f')} {fmt(s['server_cores'], '5.2f')} "
        f"{fmt(s['client_cores'], '4.2f')} {fmt(s['other_cores'], '5.2f')}"
    )


def ratio_cell(v: dict[str, Any] | None) -> str:
    """``0.69x (0.84, 0.69, 0.68)``: the median, then each round's; "-" when not measured."""
    if not v or v["ratio"] is None:
        return "-"
    cell = fmt(v["ratio"], ".2f") + "x"
    if len(v["ratios"]) > 1:
        cell += f" ({', '.join(format(x, '.2f') for x in v['ratios'])})"
    return cell


def table(rows: list[dict[str, Any]], mp_name: str) -> str:
    """One line per workload and server: its medians, then its throughput over Triton's and
    over the floor's (median and per round), and for triton-mp its p50 over Triton's."""
    side_head = f"{'infer/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'srv c':>5} {'pa c':>4} {'bg c':>5}"
    names = side_names(mp_name)
    name_w = max(13, *(len(names[s]) for r in rows for s in r["sides"]))
    head = (
        f"{'workload':26} {'proto':5} {'server':{name_w}} | {side_head} | "
        f"{'infer/s vs Triton':24} | {'infer/s vs floor':24} | p50 vs Triton"
    )
    lines = [head, "-" * len(head)]
    errors: list[str] = []
    for r in rows:
        for k, side in enumerate(r["sides"]):
            s = r[side]
            if s["rounds_ok"] == 0 and s.get("error"):
                mark = f"[{len(errors) + 1}]"
                errors.append(f"{mark} {side}, {r['label']} {r['protocol']}: {s['error']}")
                cells = f"{'ERROR ' + mark:^{len(side_head)}}"
            else:
                cells = side_cells(s)
                if s.get("error"):
                    errors.append(
                        f"{side}, {r['label']} {r['protocol']} (some rounds): {s['error']}"
                    )
            vs_t = ratio_cell(r["vs"].get(ratio_key(side, "Triton")))
            vs_f = next(
                (
                    ratio_cell(r["vs"][ratio_key(side, f)])
                    for f in FLOORS
                    if ratio_key(side, f) in r["vs"]
                ),
                "-",
            )
            p50 = ratio_cell(r["p50_vs_triton"].get(side))
            label = (r["label"], r["protocol"]) if k == 0 else ("", "")
            lines.append(
                f"{label[0]:26} {label[1]:5} {names[side]:{name_w}} | {cells} | "
                f"{vs_t:24} | {vs_f:24} | {p50}".rstrip()
            )
    if errors:
        lines.append("")
        lines += errors
    return "\n".join(lines)


def print_report(
    result: dict[str, Any],
    rows: list[dict[str, Any]],
    args: argparse.Namespace,
    mp_name: str,
    stand_in: bool,
) -> None:
    """Print the run's tables: throughput and latency per side, CPU per inference per role,
    the frontend over the native floor, ocr_cls's CPU outside onnxruntime, the workload rounds
    that were rerun, unclean stops."""
    n, cpus = len(result["rounds"]), result["host"]["cpus_usable"]
    print(
        f"\nperf_analyzer -i <proto> -p {args.window_ms}, {n} round(s), medians over rounds; "
        f"{cpus} CPUs shared by server and perf_analyzer; Triton on {args.repository}"
        + (f", triton-mp on the STAND-IN {args.mp_repository}" if stand_in else "")
        + f"; triton-mp {result.get('triton_mp', '?')}"
    )
    la0, la1 = result["host"]["loadavg_at_start"], result["host"]["loadavg_at_end"]
    print(
        f"load average (1, 5, 15 min): at start {la0[0]:.2f} {la0[1]:.2f} {la0[2]:.2f}, "
        f"at end {la1[0]:.2f} {la1[1]:.2f} {la1[2]:.2f}"
    )
    print(
        "cores: srv c = server's whole process tree, pa c = perf_analyzer, bg c = "
        "everything else on the machine (background load, incl. the idle other server)"
    )
    print(table(rows, mp_name))
    print(
        "\nCPU per inference: the server's CPU time (pa_run.py: every process, sampled over "
        "the steady part of the run) / inferences served; wake/inf = voluntary context "
        "switches per inference"
    )
    print(cpu_table(rows, side_names(mp_name)))
    for line in frontend_vs_native_floor(result["rounds"], args.workloads):
        print(line)
    for r in rows:
        for side, v in (r.get("outside_ort_us") or {}).items():
            print(
                f"{r['label']}: {side} serving CPU per image outside onnxruntime "
                f"{fmt(v['median'], '.0f')} us (per round {v['per_round']}): its CPU per "
                "image less raw ORT's own with one intra-op thread at its average batch"
                + (" (two such sessions at once)" if r.get("outside_ort_sessions") == 2 else "")
            )
    for r in rows:
        if r.get("goal_budget"):
            print(goal_budget_line(r["label"], r["goal_budget"], r.get("goal_budget_cpus", cpus)))
    for r in rows:
        if PINNED_SERVER in r["sides"]:
            for line in pinned_lines(r, OCR_GOAL, args.pinned_nice):
                print(line)
    for line in rerun_summary(result["rounds"]):
        print(line)
    for line in unclean_stops(result["rounds"]):
        print(line)


def unclean_stops(rounds: list[dict[str, Any]]) -> list[str]:
    """One line per server whose stop was not clean (a side that never started is not one)."""
    lines = []
    for r in rounds:
        for side, info in r["servers"].items():
            if "clean" in info and not info["clean"] and side not in r.get("start_errors", {}):
                lines.append(
                    f"round {r['round']}: {side} stop NOT clean: {info.get('stop')}, exit "
                    f"{info.get('exit_code')}, leftover processes "
                    f"{[p['cmdline'][:60] for p in info.get('leftover_processes', [])]},"
                    f" /dev/shm left {info.get('shm_left')}"
                )
    return lines
