"""The OCR classifier measured on raw onnxruntime, the yardstick of bench_ocr_cls.py and friends.

- ``MODEL`` / ``INPUT_NAME`` / ``INPUT_SHAPE``: ocr_cls's one input, float32 [batch, 3, 48, 192].
- ``locate_model``: ``ocr_cls/1/model.onnx`` in a repository, or the same file inside the
  rapidocr-onnxruntime wheel.
- ``measure_ort``: images/s of one InferenceSession per thread setting and batch size, in this
  process (nothing else should run meanwhile).
- ``sessions`` / ``run_sessions``: several sessions run at once, one Python thread each
  (onnxruntime releases the GIL in ``run``), as a server's instances run side by side.
"""

from __future__ import annotations

import hashlib
import importlib.util
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from common import BenchError, machine_busy_seconds

MODEL = "ocr_cls"
INPUT_NAME = "x"
INPUT_SHAPE = (3, 48, 192)  # CHW of one text-line crop; the ONNX graph leaves H and W dynamic
WHEEL_MODEL = "ch_ppocr_mobile_v2.0_cls_infer.onnx"  # the same file, inside rapidocr-onnxruntime


def locate_model(repo: Path, explicit: Path | None) -> tuple[Path, str]:
    """The ONNX file for the raw measurement: --onnx, else the repository's, else the wheel's."""
    if explicit is not None:
        return explicit, "--onnx"
    in_repo = repo / MODEL / "1" / "model.onnx"
    if in_repo.is_file():
        return in_repo, "model repository"
    spec = importlib.util.find_spec("rapidocr_onnxruntime")  # no import: it needs shapely etc.
    if spec and spec.origin:
        wheel = Path(spec.origin).parent / "models" / WHEEL_MODEL
        if wheel.is_file():
            return wheel, "rapidocr-onnxruntime wheel (not yet materialised in the repository)"
    raise BenchError(f"no {in_repo} and no rapidocr-onnxruntime wheel to take {WHEEL_MODEL} from")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def measure_ort(
    path: Path, threads: int | None, batches: list[int], seconds: float, warmup: float
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Images/s of one InferenceSession for each batch size; threads=None: ORT's default."""
    import numpy as np
    import onnxruntime as ort  # type: ignore[import-untyped]

    so = ort.SessionOptions()
    if threads is not None:
        so.intra_op_num_threads = threads
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    inp = sess.get_inputs()[0]
    if inp.name != INPUT_NAME or len(sess.get_inputs()) != 1:
        raise BenchError(
            f"{path}: expected one input named {INPUT_NAME!r}, got "
            f"{[(i.name, i.shape) for i in sess.get_inputs()]}"
        )
    signature = {
        "input": {"name": inp.name, "shape": inp.shape, "type": inp.type},
        "outputs": [{"name": o.name, "shape": o.shape, "type": o.type} for o in sess.get_outputs()],
    }
    config = "default" if threads is None else f"intra_op_num_threads={threads}"
    rng = np.random.default_rng(0)
    rows = []
    for b in batches:
        feed = {inp.name: rng.random((b, *INPUT_SHAPE), dtype=np.float32)}
        out = sess.run(None, feed)[0]
        if out.shape != (b, 2):
            raise BenchError(f"unexpected output shape {out.shape} for batch {b}")
        end = time.perf_counter() + warmup
        while time.perf_counter() < end:
            sess.run(None, feed)
        lat: list[float] = []
        busy0, cpu0, t0 = machine_busy_seconds(), time.process_time(), time.perf_counter()
        t = t0
        while t - t0 < seconds or len(lat) < 3:
            s = time.perf_counter()
            sess.run(None, feed)
            t = time.perf_counter()
            lat.append(t - s)
        wall, cpu = t - t0, time.process_time() - cpu0
        others = max(0.0, (machine_busy_seconds() - busy0 - cpu) / wall)
        rows.append(
            {
                "session": config,
                "batch": b,
                "infer_per_s": round(len(lat) * b / wall, 1),
                "batch_ms_p50": round(statistics.median(lat) * 1e3, 3),
                "runs": len(lat),
                "cores": round(cpu / wall, 2),
                "other_cores": round(others, 2),
            }
        )
        print(
            f"  ORT {config:24} batch {b:3}: {rows[-1]['infer_per_s']:9.1f} img/s  "
            f"({rows[-1]['batch_ms_p50']:.2f} ms/batch, {rows[-1]['cores']:.2f} cores; "
            f"others on the machine: {others:.2f} cores)",
            flush=True,
        )
    del sess
    return rows, signature


def sessions(model: str, count: int, threads: int | None) -> list[Any]:
    """``count`` InferenceSessions on CPU, each with ``threads`` intra-op threads (None:
    onnxruntime's default, one spinning thread per core)."""
    import onnxruntime as ort  # type: ignore[import-untyped]

    out = []
    for _ in range(count):
        so = ort.SessionOptions()
        if threads is not None:
            so.intra_op_num_threads = threads
        out.append(ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]))
    return out


def run_sessions(
    group: list[Any], feed: dict[str, Any], seconds: float
) -> tuple[float, float, list[float]]:
    """Back-to-back ``run`` calls of each session of ``group`` in its own thread for
    ``seconds`` (at least 5 each): wall seconds, this process's CPU seconds, and the latency
    of every call (seconds, sorted)."""
    lats: list[list[float]] = [[] for _ in group]

    def loop(i: int, t0: float) -> None:
        lat = lats[i]
        t = t0
        while t - t0 < seconds or len(lat) < 5:
            s0 = time.perf_counter()
            group[i].run(None, feed)
            t = time.perf_counter()
            lat.append(t - s0)

    for sess in group:
        for _ in range(3):
            sess.run(None, feed)
    cpu0, t0 = time.process_time(), time.perf_counter()
    if len(group) == 1:
        loop(0, t0)
    else:
        pool = [threading.Thread(target=loop, args=(i, t0)) for i in range(len(group))]
        for th in pool:
            th.start()
        for th in pool:
            th.join()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return wall, cpu, sorted(x for one in lats for x in one)
