"""bench_vs_triton.py's raw onnxruntime side of ocr_cls: the measurement in this process
(``raw_ort_record``) and each triton-mp side's CPU per image outside onnxruntime
(``outside_ort``)."""

from __future__ import annotations

import argparse
import time
from typing import Any

from common import (
    med,
)
from vs_triton_workloads import ORT_BATCHES


def raw_ort_record(args: argparse.Namespace, seconds: float) -> dict[str, Any]:
    """Raw onnxruntime on ocr_cls's ONNX file, in this process (the servers idle): one
    InferenceSession with ORT's default CPU settings and one with ``intra_op_num_threads=1``,
    batch sizes ``ORT_BATCHES``. A pa_run-shaped record: ``throughput`` the best images/s,
    p50/p99 of that configuration's ``session.run`` calls (per batch, µs), CPU per image
    (this process's CPU time / images); ``one_thread_cpu_us``: batch size -> CPU µs per
    image with one intra-op thread, what the model itself costs a worker (one thread)."""
    import numpy as np
    import ocr_cls_ort
    import onnxruntime as ort  # type: ignore[import-untyped]

    rows: list[dict[str, Any]] = []
    for threads in (None, 1):
        so = ort.SessionOptions()
        if threads is not None:
            so.intra_op_num_threads = threads
        sess = ort.InferenceSession(str(args.ort_model), so, providers=["CPUExecutionProvider"])
        name = sess.get_inputs()[0].name
        for b in ORT_BATCHES:
            shape = (b, *ocr_cls_ort.INPUT_SHAPE)
            feed = {name: np.random.default_rng(0).random(shape, np.float32)}
            for _ in range(3):
                sess.run(None, feed)
            lat: list[float] = []
            cpu0, t0 = time.process_time(), time.perf_counter()
            t = t0
            while t - t0 < seconds or len(lat) < 5:
                s0 = time.perf_counter()
                sess.run(None, feed)
                t = time.perf_counter()
                lat.append(t - s0)
            wall, cpu = t - t0, time.process_time() - cpu0
            lat.sort()
            rows.append(
                {
                    "threads": threads or 0,
                    "batch": b,
                    "throughput": round(len(lat) * b / wall, 1),
                    "p50_us": round(lat[len(lat) // 2] * 1e6, 1),
                    "p99_us": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e6, 1),
                    "cpu_us_per_infer": round(cpu * 1e6 / (len(lat) * b), 1),
                    "cores": round(cpu / wall, 2),
                }
            )
        del sess
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
        "best": {k: best[k] for k in ("threads", "batch")},
        "one_thread_cpu_us": {r["batch"]: r["cpu_us_per_infer"] for r in rows if r["threads"]},
        "ort_rows": rows,
    }


def outside_ort(
    by_round: dict[int, dict[str, dict[str, Any]]], sides: tuple[str, ...]
) -> dict[str, dict[str, Any]]:
    """ocr_cls: each triton-mp side's CPU µs per image outside onnxruntime, per round and
    median: its whole tree's figure less the model's own (raw ORT with one intra-op thread,
    as a worker runs it, at the batch size nearest the server's average batch)."""
    out: dict[str, dict[str, Any]] = {}
    for side in (x for x in sides if x.startswith("triton-mp")):
        vals = []
        for i in sorted(by_round):
            rec, raw = by_round[i].get(side, {}), by_round[i].get("onnxruntime", {})
            one = raw.get("one_thread_cpu_us") or {}
            if rec.get("cpu_us_per_infer") is None or not one:
                continue
            batch = rec.get("avg_batch") or max(one)
            near = min(one, key=lambda b: abs(int(b) - batch))
            vals.append(round(rec["cpu_us_per_infer"] - one[near], 1))
        out[side] = {"per_round": vals, "median": med(vals) if vals else None}
    return out
