#!/usr/bin/env python3
"""Raw onnxruntime's CPU per ocr_cls image: one 1-thread session alone, and two at once.

    python bench/ocr_cls_ort_pair.py --rounds 4 --seconds 4 --batch 16

The 2-core config (``vs_triton_workloads.ocr_2core_config``) runs two model instances of one
intra-op thread each, so two sessions run at the same time on the 2 cores and share L3 and
memory bandwidth. "CPU outside onnxruntime" in the server is its worker's CPU per image less
what onnxruntime itself takes per image *in that setting*, not less the figure of one session
measured alone. Per round this runs one process alone, then two processes at once (order
reversed every other round), each a 1-thread session without spinning (the server's default,
``backends.onnxruntime.options``) running batches of ``--batch`` float32 [3, 48, 192] images
for ``--seconds``; it prints each process's CPU µs per image (user+system, from
``time.process_time``) and the cores the rest of the machine used meanwhile.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

from common import ROOT, machine_busy_seconds
from ocr_cls_ort import INPUT_NAME, INPUT_SHAPE, locate_model


def _worker(path: str, batch: int, seconds: float, start: float, out: mp.Queue) -> None:
    """One 1-thread session: runs batches from ``start`` (time.time) for ``seconds``; puts
    (images, CPU seconds, wall seconds) on ``out``."""
    import numpy as np
    import onnxruntime as ort  # type: ignore[import-untyped]

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    feed = {INPUT_NAME: np.random.default_rng(0).random((batch, *INPUT_SHAPE), np.float32)}
    sess.run(None, feed)
    time.sleep(max(0.0, start - time.time()))
    images, c0, t0 = 0, time.process_time(), time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        sess.run(None, feed)
        images += batch
    out.put((images, time.process_time() - c0, time.perf_counter() - t0))


def measure(path: Path, procs: int, batch: int, seconds: float) -> dict[str, float]:
    """``procs`` sessions in as many processes at once; CPU µs per image (mean over them),
    images/s (sum) and the cores used by everything else on the machine."""
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()
    start = time.time() + 3.0  # every process has loaded its session by then
    ps = [
        ctx.Process(target=_worker, args=(str(path), batch, seconds, start, out))
        for _ in range(procs)
    ]
    for p in ps:
        p.start()
    time.sleep(max(0.0, start - time.time()))
    busy0, t0 = machine_busy_seconds(), time.perf_counter()
    got = [out.get() for _ in ps]
    busy, wall = machine_busy_seconds() - busy0, time.perf_counter() - t0
    for p in ps:
        p.join()
    cpu = sum(c for _, c, _ in got)
    return {
        "procs": procs,
        "us_per_image": round(statistics.mean(c / n * 1e6 for n, c, _ in got), 1),
        "images_per_s": round(sum(n / w for n, _, w in got), 1),
        "other_cores": round(max(0.0, (busy - cpu) / wall), 2),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    ap.add_argument("--json", type=Path, help="write every record here")
    args = ap.parse_args(argv)
    path, origin = locate_model(args.repository, None)
    print(f"ocr_cls from {origin}: {path}", flush=True)
    rows = []
    for r in range(args.rounds):
        for procs in (1, 2) if r % 2 == 0 else (2, 1):
            row = {"round": r + 1, **measure(path, procs, args.batch, args.seconds)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    alone = [x["us_per_image"] for x in rows if x["procs"] == 1]
    pair = [x["us_per_image"] for x in rows if x["procs"] == 2]
    ratios = [p / a for a, p in zip(alone, pair, strict=True)]
    print(
        f"batch {args.batch}: alone {statistics.median(alone):.0f} us/image, two at once "
        f"{statistics.median(pair):.0f} us/image each; ratio {statistics.median(ratios):.2f} "
        f"(per round {[round(x, 2) for x in ratios]})"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {"options": vars(args) | {"repository": str(path)}, "rows": rows},
                default=str,
                indent=2,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
