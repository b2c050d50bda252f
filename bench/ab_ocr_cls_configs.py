#!/usr/bin/env python3
"""ocr_cls under several config.pbtxt variants and raw onnxruntime, side by side in one run.

    python bench/ab_ocr_cls_configs.py --rounds 2
    python bench/ab_ocr_cls_configs.py --variants shipped,t2spin,c2spin

Variants (``VARIANTS``; each rewrites model_repository/ocr_cls/config.pbtxt): ``shipped`` as
is; ``t2`` ``intra_op_thread_count`` 2; ``spin`` adds
``session.intra_op.allow_spinning`` 1; ``c2``/``c3`` ``count`` 2/3 (one intra-op thread
each); ``p816``/``p16`` ``preferred_batch_size``; ``d2k`` ``max_queue_delay_microseconds``
2000; ``b16``/``b8`` ``max_batch_size`` 16/8 (``b8``: preferred [8]).

Every variant's server (this checkout's src/) is started at once on its own repository; per
round perf_analyzer (gRPC, c=32 by default, through bench/pa_run.py) runs against each in
turn (order reversed every other round), each followed by raw onnxruntime in this process
(the servers idle): 3 s of one session with default options at batch 32 and 3 s of two
1-thread sessions at once at batch 8, the better of the two. Printed per run: images/s, its
ratio to that raw ORT figure, average batch size, p50, and cores per role (frontend, scheduler,
each worker; perf_analyzer; the machine), from /proc.

NOTE: raw ORT with its default spinning intra-op threads is fragile on 2 shared cores: the
same measurement gave 740-2,370 images/s in one run (every figure at 1.98 cores), so compare
each variant with the best raw figure of the run, not only its own round's.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import common  # bench/common.py: bench/ is on sys.path when this runs as a script
import ocr_cls_ort
from ab_ocr_cls import run_with_roles
from bench_vs_triton import check_pin
from common import ROOT, TritonMP
from ocr_cls_ort import INPUT_SHAPE, MODEL, locate_model
from vs_triton_pinned import CLIENT_CPUS, SERVER_CPUS, pinned

SPIN = 'parameters { key: "session.intra_op.allow_spinning" value: { string_value: "1" } }\n'


def threads(n: int) -> str:
    return f'parameters {{ key: "intra_op_thread_count" value: {{ string_value: "{n}" }} }}\n'


def count(text: str, n: int) -> str:
    return re.sub(r"count:\s*\d+", f"count: {n}", text)


def preferred(text: str, sizes: str) -> str:
    return re.sub(r"preferred_batch_size:\s*\[[^]]*\]", f"preferred_batch_size: [ {sizes} ]", text)


def delay(text: str, us: int) -> str:
    return re.sub(
        r"max_queue_delay_microseconds:\s*\d+", f"max_queue_delay_microseconds: {us}", text
    )


def max_batch(text: str, n: int) -> str:
    return re.sub(r"max_batch_size:\s*\d+", f"max_batch_size: {n}", text)


def two_core(t: str, instances: int = 2, batch: int = 32, us: int = 2000) -> str:
    """``count`` instances, preferred [16], ``max_batch_size`` batch, delay ``us``."""
    return delay(max_batch(preferred(count(t, instances), "16"), batch), us)


def one_core(t: str, batch: int) -> str:
    """One instance of one intra-op thread, ``max_batch_size`` and preferred ``batch``, 2000
    µs: bench_vs_triton's ``ocr_1core_config`` at ``batch``, under ocr_cls's name."""
    return preferred(delay(max_batch(count(t, 1), batch), 2000), str(batch)) + threads(1)


VARIANTS: dict[str, Callable[[str], str]] = {
    "shipped": lambda t: t,
    "t2": lambda t: t + threads(2),
    "t2spin": lambda t: t + threads(2) + SPIN,
    "c2": lambda t: count(t, 2),
    "c2spin": lambda t: count(t, 2) + SPIN,
    "c2p816": lambda t: preferred(count(t, 2), "8, 16"),
    "c2p16": lambda t: preferred(count(t, 2), "16"),
    "c2p16d2k": lambda t: two_core(t),
    "c3p16d2k": lambda t: two_core(t, instances=3),
    "c2b16d0": lambda t: two_core(t, batch=16, us=0),
    "c2b16d2k": lambda t: two_core(t, batch=16),
    "c2b16d5k": lambda t: two_core(t, batch=16, us=5000),
    "c2b8d2k": lambda t: preferred(two_core(t, batch=8), "8"),
    "c2b16p816d2k": lambda t: preferred(two_core(t, batch=16), "8, 16"),
    "c1b8d2k": lambda t: one_core(t, 8),
    "c1b16d2k": lambda t: one_core(t, 16),
    "c1b32d2k": lambda t: one_core(t, 32),
}
"""Variant name -> its rewrite of the shipped config.pbtxt text."""


RAW_2CORE = ((1, None, 32), (2, 1, 8))
RAW_1CORE = ((1, 1, 8), (1, 1, 16), (1, 1, 32))
"""Raw onnxruntime's (sessions, intra-op threads, batch) per mode: on the machine, and on
core 0 alone (``--core0``: one thread; ORT's own pool pins threads to every core)."""


def raw_ort(
    onnx: Path, seconds: float, configs: tuple[tuple[int, int | None, int], ...] = RAW_2CORE
) -> tuple[float, float]:
    """Raw onnxruntime's images/s and cores, the best of ``configs``: by default one session
    with its default settings at batch 32 and two 1-thread sessions at once at batch 8 (the
    2-core configs' shape; the default's spinning threads collapse when anything else runs),
    ``seconds`` each."""
    import numpy as np

    best = (0.0, 0.0)
    for count, threads, batch in configs:
        group = ocr_cls_ort.sessions(str(onnx), count, threads)
        feed = {
            group[0].get_inputs()[0].name: np.random.default_rng(0).random(
                (batch, *INPUT_SHAPE), np.float32
            )
        }
        wall, cpu, lat = ocr_cls_ort.run_sessions(group, feed, seconds)
        best = max(best, (len(lat) * batch / wall, cpu / wall))
    return best


def per_role_us(cores: dict[int, tuple[str, float]], images_per_s: float) -> dict[str, float]:
    """CPU µs per image of each role (every process of that role together) from the cores
    each process used over a run of ``images_per_s``; empty when nothing was served."""
    if images_per_s <= 0:
        return {}
    out: dict[str, float] = {}
    for role, used in cores.values():
        out[role] = out.get(role, 0.0) + used * 1e6 / images_per_s
    return {role: us for role, us in sorted(out.items()) if us >= 0.5}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--variants", default="shipped,t2,c2,c2p16d2k,c2b16d2k")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--window-ms", type=int, default=1500)
    ap.add_argument(
        "--shm",
        action="store_true",
        help="perf_analyzer sends the images through system shared memory (--shared-memory "
        "system; run it in a private /dev/shm: `unshare --mount` and a tmpfs, as "
        "bench_vs_triton.py does, when others may run shm benchmarks)",
    )
    ap.add_argument(
        "--core0",
        action="store_true",
        help="servers and raw onnxruntime on cpu 0 alone (every server thread checked), "
        "perf_analyzer on cpu 1, as bench_vs_triton.py's ocr_cls_c32_core0 (variants c1b*)",
    )
    args = ap.parse_args()
    server_cpus = SERVER_CPUS if args.core0 else None

    def client() -> contextlib.AbstractContextManager[None]:
        return pinned(CLIENT_CPUS) if args.core0 else contextlib.nullcontext()

    pa_extra = ("-s", "30", *(("--shared-memory", "system") if args.shm else ()))
    peers_env = common.load_peers_env(ROOT / ".peers" / "peers.env")
    repo0 = ROOT / "model_repository"
    onnx, _ = locate_model(repo0.resolve(), None)
    base = (repo0 / MODEL / "config.pbtxt").read_text()
    names = args.variants.split(",")
    tmp = Path(tempfile.mkdtemp(prefix="ab_ocr_cls_cfg."))
    servers: dict[str, TritonMP] = {}
    try:
        for name in names:
            d = tmp / name / MODEL
            (d / "1").mkdir(parents=True)
            (d / "config.pbtxt").write_text(VARIANTS[name](base))
            shutil.copyfile(onnx, d / "1" / "model.onnx")
            s = TritonMP(tmp / name, tmp / f"{name}.log")
            servers[name] = s
            with pinned(server_cpus) if server_cpus else contextlib.nullcontext():
                failed = s.start([MODEL])
            if server_cpus:
                check_pin(s, server_cpus)
            if failed:
                print(f"{name}: not ready: {failed}", flush=True)
                return 1
        for r in range(args.rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                with client():
                    rec, cores = run_with_roles(
                        servers[name],
                        MODEL,
                        name,
                        args.concurrency,
                        ROOT / "bench" / "pa_run.py",
                        peers_env,
                        args.window_ms,
                        1,
                        tmp / "pa.jsonl",
                        pa_extra,
                    )
                roles = [
                    f"{role}:{used:.2f}"
                    for _, (role, used) in sorted(cores.items())
                    if used > 0.005
                ]
                tp = rec.get("throughput") or 0.0
                per_image = per_role_us(cores, tp)
                if server_cpus:
                    with pinned(server_cpus):
                        ort_ips, ort_cores = raw_ort(onnx, 1.0, RAW_1CORE)
                else:
                    ort_ips, ort_cores = raw_ort(onnx, 3.0)
                print(
                    f"r{r + 1} {name:>8}: {tp:7.1f} img/s ({tp / ort_ips:.2f}x raw ORT "
                    f"{ort_ips:.0f} @ {ort_cores:.2f} cores), batch {rec.get('avg_batch')}, "
                    f"p50 {(rec.get('p50_us') or 0) / 1000:.1f} ms, server "
                    f"{rec.get('server_cores')} pa {rec.get('client_cores')} busy "
                    f"{rec.get('machine_cores_busy')} | {' '.join(roles)} | us/img "
                    + " ".join(f"{role} {us:.0f}" for role, us in per_image.items())
                    + " | instances "
                    + " ".join(
                        f"run {v['run']:.2f} rq {v['runqueue']:.2f} sleep {v['sleep']:.2f};"
                        for v in rec.get("instance_shares", {}).values()
                    )
                    + (f" ERR {rec.get('error')}" if rec.get("error") else ""),
                    flush=True,
                )
    finally:
        for s in servers.values():
            info = s.stop()
            if not info.get("clean"):
                print(s.stop_line(), flush=True)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
