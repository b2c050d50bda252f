#!/usr/bin/env python3
"""The ocr_cls worker's thread CPU per phase, the server on cpu 0 and perf_analyzer on cpu 1.

    python bench/ocr_worker_phases.py --commits main HEAD --rounds 2 --seconds 10 --nice -10
    unshare --mount sh -c 'mount -t tmpfs -o mode=1777 tmpfs /dev/shm && \
        exec python bench/ocr_worker_phases.py --commits main HEAD --shm'

``bench_vs_triton.py``'s ``ocr_cls_c32_core0`` workloads give the worker's CPU per image as one
figure, ~30-60 µs above raw onnxruntime's; this splits it. Each commit's src/ is exported and
patched as ``worker_phases.py`` patches it (the worker's loop and batch path add
``time.thread_time_ns`` per phase), and the onnxruntime backend's ``execute`` adds two marks:
``input`` (the requests' inputs gathered into the batch tensor: ``np.concatenate`` of 8 views
of 110,592 bytes) and ``session.run`` (onnxruntime itself, with its Python wrapper). The other
phases are ``worker_phases.py``'s (``pb_requests`` and ``execute`` there are these two here;
``results`` holds the backend's scatter of the outputs).

Per round each commit's server is started pinned to cpu 0 (``vs_triton_pinned.pinned``: the
``ocr_cls_1core`` config, one instance, one intra-op thread, batches of 8; every thread of the
tree checked), perf_analyzer drives it from cpu 1 (gRPC, c=32, ``--shape x:3,48,192``;
``--shm``: the images in system shared memory) for ``--warmup`` + ``--seconds``, and the server
is stopped so that its worker writes its sums. Printed per commit and round: images/s, the
batch, the worker's ``/proc`` CPU per image, core 0's background share, then each phase in µs
per batch and per image (the first instance's thread, warm-up included). ``--nice N``: the
server and perf_analyzer at nice N and their sessions' autogroups too (root; see
``bench_vs_triton.py --pinned-nice``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ocr_cls_ort
from ab_interleaved import TICK_US, counts, role_ticks
from common import BENCH, descendants, load_peers_env
from exports import export_commit, patch_source
from pa_window import PA_MARGIN_S, alternating
from servers import TritonMP
from vs_triton_pinned import (
    CLIENT_CPUS,
    SERVER_CPUS,
    cpu_ticks,
    off_pin,
    pinned,
    set_autogroup_nice,
    thread_affinities,
)
from vs_triton_workloads import OCR_1CORE_MODEL, ocr_1core_config
from worker_phases import PHASES, instrument

ROOT = BENCH.parent
OCR_PHASES = tuple({"pb_requests": "input", "execute": "session.run"}.get(p, p) for p in PHASES)
"""``worker_phases.PHASES`` as an onnxruntime model fills them."""

_ORT = "backends/onnxruntime/backend.py"
_ORT_PATCHES = (
    (
        "log = logging.getLogger(__name__)\n",
        "from triton_mp import _wp\n\nlog = logging.getLogger(__name__)\n",
    ),
    (
        "        t_input = watch.lap()\n",
        f"        t_input = watch.lap()\n        _wp.mark({PHASES.index('pb_requests')})\n",
    ),
    (
        "        t_infer = watch.lap()\n",
        f"        t_infer = watch.lap()\n        _wp.mark({PHASES.index('execute')})\n",
    ),
)


def instrument_ort(src: Path, out: Path) -> None:
    """``worker_phases.instrument`` plus the onnxruntime backend's two marks."""
    instrument(src, out)
    patch_source(src / "triton_mp" / _ORT, list(_ORT_PATCHES), "ocr_worker_phases")


def repository(dest: Path) -> Path:
    """A repository holding ``ocr_cls_1core`` only (its ONNX file as ``bench_vs_triton.py``
    finds it)."""
    onnx, _where = ocr_cls_ort.locate_model(ROOT / "model_repository", None)
    model = dest / OCR_1CORE_MODEL
    (model / "1").mkdir(parents=True)
    shipped = (ROOT / "model_repository" / "ocr_cls" / "config.pbtxt").read_text()
    (model / "config.pbtxt").write_text(ocr_1core_config(shipped))
    shutil.copy(onnx, model / "1" / "model.onnx")
    return dest


def phase_lines(sums: str) -> list[str]:
    """The phases of one worker's sums file (``batches requests waits acc...``), µs per
    batch and per image."""
    batches, requests, waits, *acc = (int(v) for v in sums.split())
    b, r = max(batches, 1), max(requests, 1)
    head = f"    first instance: {batches} batches of {requests / b:.2f}, {waits / b:.2f} sleeps"
    head += f" per batch, {sum(acc) / 1000 / b:.1f} µs/batch in all"
    rows = [
        f"    {p:12s} {a / 1000 / b:8.1f} µs/batch {a / 1000 / r:7.2f} µs/image"
        for p, a in zip(OCR_PHASES, acc, strict=True)
    ]
    outside = sum(acc) - acc[PHASES.index("execute")]
    name = "outside run"
    rows.append(
        f"    {name:12s} {outside / 1000 / b:8.1f} µs/batch {outside / 1000 / r:7.2f} µs/image"
    )
    return [head, *rows]


def one_run(
    src: Path, out: Path, label: str, args: argparse.Namespace, peers: dict[str, str]
) -> str:
    """One pinned server of ``src`` under perf_analyzer on cpu 1; its lines of figures."""
    for old in out.glob("phases_*.txt"):
        old.unlink()
    server = TritonMP(args.repository, out / "server.log", src=src)
    with pinned(SERVER_CPUS, args.nice):
        failed = server.start([OCR_1CORE_MODEL])
    try:
        if failed:
            return f"{label}: NOT READY: {failed}"
        stray = off_pin(thread_affinities(server.pid or 0), SERVER_CPUS)
        if stray:
            return f"{label}: threads outside cpu 0: {stray[:3]}"
        if args.nice is not None and server.pid is not None:
            set_autogroup_nice(server.pid, args.nice)
        pa = [peers["PERF_ANALYZER"], "-i", "grpc", "-u", server.url, "-m", OCR_1CORE_MODEL]
        pa += ["--concurrency-range", "32", "--shape", "x:3,48,192", "--max-trials", "1"]
        pa += ["-p", str(int((args.warmup + args.seconds + PA_MARGIN_S) * 1000))]
        pa += ["--shared-memory", "system"] if args.shm else []
        with pinned(CLIENT_CPUS, args.nice):
            proc = subprocess.Popen(
                pa,
                env={**os.environ, **peers},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        try:
            time.sleep(args.warmup)
            pids = [p for p, _ in descendants(server.pid or 0)]
            c0, n0, k0 = role_ticks(pids), counts(server, OCR_1CORE_MODEL), cpu_ticks()
            time.sleep(args.seconds)
            c1, n1, k1 = role_ticks(pids), counts(server, OCR_1CORE_MODEL), cpu_ticks()
        finally:
            proc.kill()
            proc.wait()
    finally:
        server.stop()
    images, batches = n1[0] - n0[0], max(n1[1] - n0[1], 1)
    per = max(images, 1)
    tree = sum(c1.values()) - sum(c0.values())
    d0 = [a - b for a, b in zip(k1[0], k0[0], strict=True)]  # cpu 0: busy, idle, steal ticks
    background = (d0[0] - tree) / max(sum(d0), 1)
    head = f"{label}: {images / args.seconds:,.0f} img/s, batch {images / batches:.2f}, worker "
    head += f"{(c1['worker'] - c0['worker']) * TICK_US / per:.1f} / tree {tree * TICK_US / per:.1f}"
    head += f" CPU µs/image, core 0 background {background:.2f}, load {os.getloadavg()[0]:.1f}"
    files = sorted(out.glob("phases_*.txt"))
    if not files:
        return f"{head}; no phases written"
    return "\n".join([head, *phase_lines(files[0].read_text())])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--commits", nargs="+", required=True, help="revs, e.g. main HEAD")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--shm", action="store_true", help="images in system shared memory")
    ap.add_argument("--nice", type=int, default=None, help="nice value of the pinned sides")
    args = ap.parse_args()
    peers = load_peers_env(ROOT / ".peers" / "peers.env")
    tmp = Path(tempfile.mkdtemp(prefix="ocr_worker_phases."))
    try:
        args.repository = repository(tmp / "repo")
        trees: dict[str, tuple[Path, Path]] = {}
        for rev in args.commits:
            src = export_commit(rev)
            out = src.parent / "worker_phases"
            out.mkdir(exist_ok=True)
            instrument_ort(src, out)
            trees[rev] = (src, out)
        for rnd, rev, (src, out) in alternating(trees, args.rounds):
            print(one_run(src, out, f"round {rnd} {rev}", args, peers), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
