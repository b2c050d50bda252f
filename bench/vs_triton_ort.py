"""bench_vs_triton.py's raw onnxruntime side of ocr_cls: the measurement in this process
(``raw_ort_record``), each triton-mp side's CPU per image outside onnxruntime
(``outside_ort``), and how long its instances wait for batches (``instance_waits``)."""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Callable
from typing import Any

from common import (
    med,
)
from procs import cmdline, descendants, main_thread_ns, sleep_shares
from vs_triton_workloads import ORT_BATCHES

RAW_ORT_CONFIGS: tuple[tuple[int, int | None], ...] = ((1, None), (1, 1), (2, 1))
"""Raw onnxruntime's configurations, (sessions, intra-op threads; None: ORT's default): one
session with ORT's default CPU settings (one spinning intra-op thread per core), one session
with one thread, and two one-thread sessions at once, each run by its own Python thread (ORT
releases the GIL in ``run``), as the 2-core config's two instances run it. The default
session's spinning threads collapse when anything else runs on the machine (650 images/s at
1.9 cores at load 3.5 here, against 2,216 quiet); two one-thread sessions keep their
throughput then, and on a quiet machine they are a best of their own, not a lesser figure."""


def raw_ort_record(
    args: argparse.Namespace,
    seconds: float,
    configs: tuple[tuple[int, int | None], ...] = RAW_ORT_CONFIGS,
) -> dict[str, Any]:
    """Raw onnxruntime on ocr_cls's ONNX file, in this process (the servers idle): each of
    ``configs`` (default ``RAW_ORT_CONFIGS``) at batch sizes ``ORT_BATCHES``. A pa_run-shaped
    record:
    ``throughput`` the best images/s, p50/p99 of that configuration's ``session.run`` calls
    (per batch, µs), CPU per image (this process's CPU time / images); ``one_thread_cpu_us``:
    batch size -> CPU µs per image of one session with one intra-op thread alone, what the
    model itself costs a worker (one thread); ``two_session_cpu_us``: the same for two such
    sessions at once (what it costs each of the 2-core config's two workers); ``ort_rows``:
    every configuration's figures (``sessions``, ``threads``: 0 for ORT's default,
    ``batch``)."""
    import numpy as np
    import ocr_cls_ort

    rows: list[dict[str, Any]] = []
    for n_sessions, threads in configs:
        group = ocr_cls_ort.sessions(str(args.ort_model), n_sessions, threads)
        name = group[0].get_inputs()[0].name
        for b in ORT_BATCHES:
            shape = (b, *ocr_cls_ort.INPUT_SHAPE)
            feed = {name: np.random.default_rng(0).random(shape, np.float32)}
            wall, cpu, lat = ocr_cls_ort.run_sessions(group, feed, seconds)
            images = len(lat) * b
            rows.append(
                {
                    "sessions": n_sessions,
                    "threads": threads or 0,
                    "batch": b,
                    "throughput": round(images / wall, 1),
                    "p50_us": round(lat[len(lat) // 2] * 1e6, 1),
                    "p99_us": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e6, 1),
                    "cpu_us_per_infer": round(cpu * 1e6 / images, 1),
                    "cores": round(cpu / wall, 2),
                }
            )
        del group
    best = max(rows, key=lambda r: r["throughput"])
    return {
        "throughput": best["throughput"],
        "p50_us": best["p50_us"],
        "p99_us": best["p99_us"],
        "server_cores": best["cores"],
        "client_cores": 0.0,
        "machine_cores_busy": best["cores"],
        "cpu_us_per_infer": best["cpu_us_per_infer"],
        "wakeups_per_infer": None,
        "roles": {
            "onnxruntime": {"cpu_us": best["cpu_us_per_infer"], "wakeups": None, "cores": 1.0}
        },
        "best": {k: best[k] for k in ("sessions", "threads", "batch")},
        "one_thread_cpu_us": {
            r["batch"]: r["cpu_us_per_infer"]
            for r in rows
            if r["threads"] == 1 and r["sessions"] == 1
        },
        "two_session_cpu_us": {
            r["batch"]: r["cpu_us_per_infer"]
            for r in rows
            if r["threads"] == 1 and r["sessions"] == 2
        },
        "ort_rows": rows,
    }


def outside_ort(
    by_round: dict[int, dict[str, dict[str, Any]]],
    sides: tuple[str, ...],
    sessions: int = 1,
    raw_side: str = "onnxruntime",
) -> dict[str, dict[str, Any]]:
    """ocr_cls: each triton-mp side's CPU µs per image outside onnxruntime, per round and
    median: its whole tree's figure less the model's own, raw ORT with one intra-op thread
    (as a worker runs it) at the batch size nearest the server's average batch. ``sessions``
    2 (the 2-core config's two instances): less the figure of two such sessions running at
    once (``two_session_cpu_us``), since two instances share L3 and memory bandwidth and
    each pays more per image than one alone; a record without it falls back to one alone.
    ``raw_side``: the side whose records hold raw ORT's figures (the pinned workloads' own)."""
    out: dict[str, dict[str, Any]] = {}
    for side in (x for x in sides if x.startswith("triton-mp")):
        vals = []
        for i in sorted(by_round):
            rec, raw = by_round[i].get(side, {}), by_round[i].get(raw_side, {})
            one = (sessions == 2 and raw.get("two_session_cpu_us")) or raw.get("one_thread_cpu_us")
            if rec.get("cpu_us_per_infer") is None or not one:
                continue
            batch = rec.get("avg_batch") or max(one)
            near = min(one, key=lambda b: abs(int(b) - batch))
            vals.append(round(rec["cpu_us_per_infer"] - one[near], 1))
        out[side] = {"per_round": vals, "median": med(vals) if vals else None}
    return out


def instance_waits(server_pid: int, model: str) -> Callable[[], dict[int, dict[str, float]]]:
    """Starts watching the main threads of ``model``'s workers in the triton-mp tree of
    ``server_pid`` (``triton-mp: worker <model>_<group>_<index>``); the returned function
    gives, per worker pid, its ``run`` / ``runqueue`` / ``sleep`` shares of the wall time
    since (``procs.sleep_shares``: sleep is time waiting for a batch). Issue 33's question:
    do the instances wait while the cores idle?"""
    name = re.compile(rf"^triton-mp: worker {re.escape(model)}_\d+_\d+$")
    pids = [p for p, _ in descendants(server_pid) if name.match(cmdline(p))]
    before, t0 = main_thread_ns(pids), time.monotonic()
    return lambda: sleep_shares(before, main_thread_ns(pids), time.monotonic() - t0)


OCR_GOAL = 0.8
"""Issue 33's ocr_cls goal: triton-mp's images/s at least this share of raw onnxruntime's
best images/s of the run."""


def goal_budget(
    by_round: dict[int, dict[str, dict[str, Any]]],
    best_ort: float | None,
    cpus: int,
    goal: float = OCR_GOAL,
    sides: tuple[str, str] = ("triton-mp", "onnxruntime"),
    client_shares: bool = True,
) -> dict[str, Any] | None:
    """What serving ``goal`` x raw onnxruntime's best (``best_ort`` images/s) leaves the
    workers on ``cpus`` cores: at that rate the machine gives ``cpus`` x 1e6 / rate CPU µs
    per image to everything on it; less what perf_analyzer (its cores / the server's
    images/s) and triton-mp's roles other than its workers (frontend, scheduler, ...) spent
    per image in each round, the rest is what the workers may spend per image (and, times
    the rate, the cores they may use), with no core idle. Beside it the workers' own figure
    and raw onnxruntime's CPU per image at its best. Medians over the rounds where the
    triton-mp side measured; None when it never did or there is no raw figure."""
    if not best_ort:
        return None
    rate = goal * best_ort
    budget = cpus * 1e6 / rate
    pa, rest, workers, raw = [], [], [], []
    for i in sorted(by_round):
        rec, ort = by_round[i].get(sides[0], {}), by_round[i].get(sides[1], {})
        roles = rec.get("roles") or {}
        if not rec.get("throughput") or (roles.get("worker") or {}).get("cpu_us") is None:
            continue
        pa.append((rec.get("client_cores") or 0.0) * 1e6 / rec["throughput"])
        rest.append(sum(v["cpu_us"] or 0.0 for k, v in roles.items() if k != "worker"))
        workers.append(roles["worker"]["cpu_us"])
        if ort.get("cpu_us_per_infer"):
            raw.append(ort["cpu_us_per_infer"])
    if not workers:
        return None
    pa_us = med(pa) if client_shares else None
    allowed = budget - (pa_us or 0.0) - med(rest)
    return {
        "goal": goal,
        "rate": round(rate, 1),
        "budget_us": round(budget, 1),
        "pa_us": None if pa_us is None else round(pa_us, 1),
        "others_us": round(med(rest), 1),
        "workers_allowed_us": round(allowed, 1),
        "workers_allowed_cores": round(allowed * rate / 1e6, 2),
        "workers_us": round(med(workers), 1),
        "raw_ort_us": round(med(raw), 1) if raw else None,
    }


def goal_budget_line(label: str, b: dict[str, Any], cpus: int) -> str:
    """The printed sentence of a ``goal_budget`` record."""
    raw = "-" if b["raw_ort_us"] is None else f"{b['raw_ort_us']:.0f}"
    pa = (
        "perf_analyzer (on other cores) 0"
        if b["pa_us"] is None
        else f"perf_analyzer {b['pa_us']:.0f}"
    )
    return (
        f"{label}: at {b['goal']}x raw ORT's best ({b['rate']:.0f} img/s) {cpus} core(s) give "
        f"{b['budget_us']:.0f} us per image; {pa} + triton-mp's "
        f"roles but its workers {b['others_us']:.0f} leave the workers "
        f"{b['workers_allowed_us']:.0f} us per image ({b['workers_allowed_cores']:.2f} cores, "
        f"no core idle); they spent {b['workers_us']:.0f}, raw ORT at its best {raw} "
        "(medians over rounds)"
    )
