#!/usr/bin/env python3
"""The OCR classifier pipeline as one ensemble request against the same three models called
one after another by the client, in one run of one server.

``triton-mp start`` serves ``ocr_cls_pre``, ``ocr_cls``, ``ocr_cls_post`` and the
``ocr_cls_pipeline`` ensemble of them (copies of the default repository's directories). For
each concurrency (``--concurrency``, default 1, 8 and 32) and each way (the order alternates
between concurrencies), ``c`` client threads, each with its own ``tritonclient.grpc`` client,
send raw UINT8 text-line crops (rendered, 48 to 64 pixels high, of varying width) for
``--seconds`` seconds (after a one-second warm-up):

- ``ensemble``: one ModelInfer of ``ocr_cls_pipeline`` per crop (label and score back);
- ``chained``: ``ocr_cls_pre`` (the [1, 3, 48, 192] FP32 tensor comes back to the client),
  then ``ocr_cls`` with it (the probabilities come back), then ``ocr_cls_post``.

Every answer is checked against the label and score of that crop taken once, in turn, before
the measurements. It prints crops/s and p50 latency per way and concurrency and the ratio
ensemble / chained, and writes them to ``--json``. Exit status 0 when every request was
answered correctly and the server left nothing behind.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import common  # bench/common.py: bench/ is on sys.path when this runs as a script
import numpy as np
from common import ROOT, TritonMP

MODELS = ("ocr_cls_pre", "ocr_cls", "ocr_cls_post", "ocr_cls_pipeline")
CLS_OUTPUT = "save_infer_model/scale_0.tmp_1"


def _crops(n: int = 16) -> list[np.ndarray]:
    """Text-line-like BGR crops: dark strokes on white, heights 48-64, widths 120-400."""
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        h, w = 48 + (i % 3) * 8, 120 + (i * 37) % 280
        img = np.full((h, w, 3), 255, np.uint8)
        for x in range(4, w - 8, 9):
            top = int(rng.integers(6, h // 3))
            img[top : h - top, x : x + 3] = rng.integers(0, 80, 3, dtype=np.uint8)
        out.append(img)
    return out


def _input(grpcclient: Any, name: str, array: np.ndarray, dtype: str) -> Any:
    t = grpcclient.InferInput(name, list(array.shape), dtype)
    t.set_data_from_numpy(array)
    return t


def _ensemble(grpcclient: Any, client: Any, crop: np.ndarray) -> tuple[bytes, float]:
    r = client.infer("ocr_cls_pipeline", [_input(grpcclient, "crop", crop, "UINT8")])
    return r.as_numpy("label")[0], float(r.as_numpy("score")[0])


def _chained(grpcclient: Any, client: Any, crop: np.ndarray) -> tuple[bytes, float]:
    x = client.infer("ocr_cls_pre", [_input(grpcclient, "crop", crop, "UINT8")]).as_numpy("x")
    probs = client.infer("ocr_cls", [_input(grpcclient, "x", x, "FP32")]).as_numpy(CLS_OUTPUT)
    r = client.infer("ocr_cls_post", [_input(grpcclient, "probs", probs, "FP32")])
    return r.as_numpy("label")[0], float(r.as_numpy("score")[0])


WAYS = {"ensemble": _ensemble, "chained": _chained}


def measure(url: str, way: str, concurrency: int, seconds: float, expected: list) -> dict:
    """``concurrency`` threads send crops ``way`` for ``seconds``; throughput and latency."""
    import tritonclient.grpc as grpcclient

    crops = _crops()
    fn = WAYS[way]
    latencies: list[list[float]] = [[] for _ in range(concurrency)]
    wrong = [0] * concurrency
    start = threading.Barrier(concurrency + 1)
    window = {"begin": 0.0, "end": 0.0}

    def worker(k: int) -> None:
        client = grpcclient.InferenceServerClient(url)
        try:
            start.wait()
            i = k
            while True:
                t0 = time.perf_counter()
                if t0 >= window["end"]:
                    return
                got = fn(grpcclient, client, crops[i % len(crops)])
                t1 = time.perf_counter()
                if (
                    got[0] != expected[i % len(crops)][0]
                    or abs(got[1] - expected[i % len(crops)][1]) > 1e-6
                ):
                    wrong[k] += 1
                if t0 >= window["begin"]:
                    latencies[k].append(t1 - t0)
                i += concurrency
        finally:
            client.close()

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(concurrency)]
    for t in threads:
        t.start()
    now = time.perf_counter()
    window["begin"], window["end"] = now + 1.0, now + 1.0 + seconds
    start.wait()
    for t in threads:
        t.join()
    lat = sorted(x for per in latencies for x in per)
    return {
        "way": way,
        "concurrency": concurrency,
        "crops_per_s": len(lat) / seconds,
        "p50_ms": 1000 * statistics.median(lat) if lat else None,
        "wrong": sum(wrong),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "ensemble_ocr.json")
    args = ap.parse_args(argv)
    from triton_mp.cli.assets import materialise_ocr_models

    work = Path(tempfile.mkdtemp(prefix="bench_ens_"))
    repo = work / "repo"
    source = ROOT / "model_repository"
    materialise_ocr_models(source)
    for name in MODELS:
        shutil.copytree(source / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    server = TritonMP(repo, work / "server.log")
    rows: list[dict] = []
    ok = True
    try:
        errors = server.start(list(MODELS))
        if errors:
            print(f"models not ready: {errors}", file=sys.stderr)
            return 1
        import tritonclient.grpc as grpcclient

        client = grpcclient.InferenceServerClient(server.url)
        expected = [_chained(grpcclient, client, c) for c in _crops()]
        assert expected == [_ensemble(grpcclient, client, c) for c in _crops()]
        client.close()
        for n, c in enumerate(args.concurrency):
            order = ["ensemble", "chained"] if n % 2 == 0 else ["chained", "ensemble"]
            for way in order:
                row = measure(server.url, way, c, args.seconds, expected)
                rows.append(row)
                ok &= row["wrong"] == 0
                print(
                    f"{way:9s} c={c:<3d} {row['crops_per_s']:8.1f} crops/s  "
                    f"p50 {row['p50_ms']:.2f} ms  wrong {row['wrong']}",
                    flush=True,
                )
    finally:
        info = server.stop()
        print(server.stop_line())
        ok &= not info.get("leftover_processes") and not info.get("shm_left")
        shutil.rmtree(work, ignore_errors=True)
    ratios = {}
    print("\nconcurrency  ensemble/chained (crops/s)")
    for c in args.concurrency:
        by = {r["way"]: r for r in rows if r["concurrency"] == c}
        ratios[c] = by["ensemble"]["crops_per_s"] / by["chained"]["crops_per_s"]
        print(f"{c:11d}  {ratios[c]:.2f}x")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {"rows": rows, "ratios": ratios, "machine": common.machine_busy_seconds()}, indent=1
        )
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
