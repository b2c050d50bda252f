#!/usr/bin/env python3
"""triton-mp side by side with the real NVIDIA Triton 2.51, driven by the same perf_analyzer runs.

The servers ("sides"): the real Triton, triton-mp (one frontend process), and, for the
add_sub_py gRPC workloads (the python-backend issue's bench, concurrency 1, 4 and 16), also
triton-mp with ``--frontend-processes 2``, triton-mp with ``--grpc-frontend python``, the
Python floor (``bench/floor_server.py``: one grpc.aio process computing add_sub inline, what
a single Python gRPC process reaches here) and the native floor (``bench/native_floor.py``:
the same in C++ on libgrpc++, what a native gRPC frontend costs per call before any work of
its own; after the CPU table, each triton-mp side's frontend CPU per inference is printed
over the native floor's, per round and median).

One invocation:

1. installs the peers when they are missing (``bench/peers/install-peers.sh .peers``);
2. per round (``--rounds``, default 3), starts every side the chosen workloads need fresh on
   free ports, on the same model repository: the real Triton through
   ``bench/peers/run-triton.sh``, ``triton-mp start`` (twice: one and two frontend
   processes) and the floor, each in its own session;
3. for each workload, runs the same perf_analyzer command (gRPC or HTTP/REST as the workload
   says, 3 s windows, through ``bench/pa_run.py``) against each of its sides, back to
   back; the order alternates from round to round (odd rounds Triton, triton-mp, fp2, floor;
   even rounds the reverse), so each round's ratios compare runs taken seconds apart;
4. stops them all by PID (SIGINT, then SIGKILL) and checks that none of their processes and none of
   their ``/dev/shm`` entries is left behind.

It prints one table: per workload and protocol (``-i grpc`` or ``-i http``), a line per server
with its infer/s, p50 and p99 latency (medians over rounds), the cores used by the server, by
perf_analyzer and by everything else on the machine, its throughput over Triton's and over the
floor's, and (triton-mp) its p50 over Triton's (medians of the per-round ratios, which are
listed too). It writes a PNG of throughput and
p99 latency (``--png``) and, with ``--json``, every record.

Exit status 0 when every measurement ran and every stop was clean; 1 otherwise (for instance
while triton-mp cannot load python models): the table still shows what was measured, and the
error in place of what was not. See bench/README.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import common  # bench/common.py: bench/ is on sys.path when this runs as a script
from common import (
    BENCH,
    DEFAULT_PA_RUN,
    DEFAULT_PEERS_ENV,
    ROOT,
    BenchError,
    Floor,
    ManagedServer,
    Triton,
    TritonMP,
    fmt,
    med,
)
from native_floor import NativeFloor

DEFAULT_REPOSITORY = BENCH / "model_repository"
DEFAULT_PNG = ROOT / "bench" / "results" / "vs_triton.png"
SIDES = (
    "Triton",
    "triton-mp",
    "triton-mp base",
    "triton-mp fp2",
    "triton-mp python",
    "floor",
    "native floor",
    "identity floor",
    "onnxruntime",
)
"""Every server the bench can run: the real Triton, triton-mp (one frontend process),
triton-mp with ``--frontend-processes 2``, the Python floor (``floor_server.py``) and the
large-tensor floor (``bench/floor_identity.py``: identity_py echoed by one grpc.aio process
with triton-mp's wire handling); "triton-mp base" is triton-mp as committed at ``--baseline
REV``, run next to this checkout's on every workload triton-mp runs (an A/B in one run);
"onnxruntime" is no server: raw onnxruntime in this process on ocr_cls's ONNX file, its best
batched images/s (``raw_ort_record``), the bound of the ocr_cls workload."""
SERVERLESS = ("onnxruntime",)
"""Sides measured in this process, with nothing to start or stop."""
FLOORS = ("floor", "native floor", "identity floor", "onnxruntime")
"""The floor sides: the table's "vs floor" column shows a workload's ratio over any of them."""
FLOOR_IDENTITY = ROOT / "bench" / "floor_identity.py"
PAIR = ("Triton", "triton-mp")
"""The two sides every workload runs on."""
ADD_SUB_SIDES = tuple(
    s for s in SIDES if s not in ("identity floor", "triton-mp base", "onnxruntime")
)
"""add_sub_py over gRPC, the system-shared-memory issue's bench, runs on all four sides that
serve add_sub_py (the identity floor serves identity_py only)."""
RATIOS = (
    ("triton-mp", "Triton"),
    ("triton-mp", "triton-mp base"),
    ("triton-mp fp2", "Triton"),
    ("triton-mp", "floor"),
    ("triton-mp fp2", "floor"),
    ("triton-mp", "native floor"),
    ("triton-mp python", "Triton"),
    ("triton-mp", "triton-mp python"),
    ("triton-mp", "identity floor"),
    ("identity floor", "Triton"),
    ("triton-mp", "onnxruntime"),
    ("triton-mp base", "onnxruntime"),
)
"""Throughput ratios reported per workload (numerator, denominator), when both ran."""
FP2_ARGS = ["--frontend-processes", "2"]
PYTHON_ARGS = ["--grpc-frontend", "python"]
"""The "triton-mp python" side: the Python gRPC server owns the port, as before the native
gRPC frontend (issue 33) became the default."""
SIDE_ARGS = {"triton-mp fp2": FP2_ARGS, "triton-mp python": PYTHON_ARGS}
"""The flags a triton-mp side adds to triton-mp's."""
MIB = 1 << 20
PRIVATE_SHM_ENV = "BENCH_VS_TRITON_PRIVATE_SHM"  # set inside the private /dev/shm namespace
MAX_RESTARTS = 2  # per round: a server that died under us is started again this many times
NODELAY_MODEL = "add_sub_py_nodelay"
"""add_sub_py with ``dynamic_batching { }`` (no batching delay), written by
``prepare_repositories`` into the run's repositories (issue 23's second c=1 goal)."""
OCR_MODEL = "ocr_cls"
"""The PP-OCR classifier (onnxruntime backend: triton-mp only; the Triton here has no
onnxruntime backend); ``prepare_repositories`` adds it to triton-mp's repository."""
ORT_BATCHES = (8, 16, 32)
"""Batch sizes of the raw onnxruntime measurement (its best is the ocr_cls bound)."""


@dataclass(frozen=True)
class Workload:
    key: str
    label: str
    model: str
    concurrency: int
    pa_args: tuple[str, ...] = ()
    protocol: str = "grpc"
    """perf_analyzer's -i: ``grpc`` or ``http`` (KServe v2 REST, binary tensor data)."""
    sides: tuple[str, ...] = PAIR
    """The servers it runs on (the floors serve gRPC only: the add_sub floor add_sub_py, the
    identity floor identity_py, also through system shared memory)."""
    floor_model: str | None = None
    """The model the floor serves for this workload when its name differs (the floor has
    one model, add_sub_py, and no batcher: ``add_sub_py_nodelay`` is add_sub_py there)."""

    def model_for(self, side: str) -> str:
        """The model name ``side`` serves this workload under."""
        floor = side in ("floor", "native floor")
        return self.floor_model if floor and self.floor_model else self.model

    def args(self, side: str = "") -> list[str]:
        model = self.model_for(side)
        return ["-m", model, "--concurrency-range", str(self.concurrency), *self.pa_args]


def identity(mib: int, shm: bool, protocol: str = "grpc") -> Workload:
    floats = mib * MIB // 4
    extra: tuple[str, ...] = ("--shape", f"INPUT0:{floats}")
    if shm:
        extra += ("--shared-memory", "system", "--output-shared-memory-size", str(mib * MIB))
    http = protocol == "http"
    sides = PAIR if http else (*PAIR, "identity floor")
    return Workload(
        f"id{mib}m" + ("_shm" if shm else "") + ("_http" if http else ""),
        f"identity_py {mib} MiB c=4" + (" shm" if shm else ""),
        "identity_py",
        4,
        extra,
        protocol,
        sides,
    )


WORKLOADS = [
    Workload("add_sub_c1", "add_sub_py c=1", "add_sub_py", 1, sides=ADD_SUB_SIDES),
    Workload(
        "add_sub_c1_nodelay",
        "add_sub_py c=1 no delay",
        NODELAY_MODEL,
        1,
        sides=ADD_SUB_SIDES,
        floor_model="add_sub_py",
    ),
    Workload("add_sub_c4", "add_sub_py c=4", "add_sub_py", 4, sides=ADD_SUB_SIDES),
    Workload("add_sub_c16", "add_sub_py c=16", "add_sub_py", 16, sides=ADD_SUB_SIDES),
    identity(1, shm=False),
    identity(1, shm=True),
    identity(16, shm=False),
    identity(16, shm=True),
    Workload("add_sub_c1_http", "add_sub_py c=1", "add_sub_py", 1, protocol="http"),
    Workload("add_sub_c16_http", "add_sub_py c=16", "add_sub_py", 16, protocol="http"),
    identity(1, shm=False, protocol="http"),
    identity(1, shm=True, protocol="http"),
    Workload("ocr_cls_c32", "ocr_cls c=32", OCR_MODEL, 32, sides=("triton-mp", "onnxruntime")),
]


def run_pa(
    w: Workload,
    pa_run: Path,
    peers_env: dict[str, str],
    server: ManagedServer,
    label: str,
    pa_args: list[str],
    window_ms: int,
    attempts: int,
    jsonl: Path,
) -> dict[str, Any]:
    """One perf_analyzer measurement over the workload's protocol; common.run_pa's record."""
    return common.run_pa(
        pa_run, peers_env, server, label, pa_args, window_ms, attempts, jsonl, w.protocol
    )


# --------------------------------------------------------------------------- repositories


def nodelay_config(text: str) -> str:
    """add_sub_py's config.pbtxt as ``add_sub_py_nodelay``: the same model with
    ``dynamic_batching { }`` (batches form only from requests already queued)."""
    out = re.sub(r'^name:\s*"add_sub_py"', f'name: "{NODELAY_MODEL}"', text, flags=re.M)
    out = re.sub(r"dynamic_batching\s*\{[^}]*\}", "dynamic_batching { }", out)
    if out == text or f'"{NODELAY_MODEL}"' not in out or "dynamic_batching { }" not in out:
        raise BenchError("add_sub_py's config.pbtxt: no name or dynamic_batching to rewrite")
    return "# bench_vs_triton.py: add_sub_py without its batching delay.\n" + out


def _copy_repository(src: Path, dest: Path, nodelay: bool) -> None:
    shutil.copytree(src, dest, symlinks=False, ignore=shutil.ignore_patterns("__pycache__"))
    if nodelay:
        shutil.copytree(dest / "add_sub_py", dest / NODELAY_MODEL)
        cfg = dest / NODELAY_MODEL / "config.pbtxt"
        cfg.write_text(nodelay_config(cfg.read_text()))


def prepare_repositories(args: argparse.Namespace) -> Path | None:
    """Temporary copies of the repositories when a workload needs a model they lack:
    ``add_sub_py_nodelay`` in both, ``ocr_cls`` (its config from the project's
    model_repository, its ONNX file as bench_ocr_cls finds it) in triton-mp's. Sets
    ``args.repository`` / ``args.mp_repository`` to the copies; returns their folder (None
    when no copy was needed)."""
    models = {w.model for w in args.workloads}
    nodelay, ocr = NODELAY_MODEL in models, OCR_MODEL in models
    if not nodelay and not ocr:
        return None
    import bench_ocr_cls  # bench/: the raw-ORT measurement and the model's location

    tmp = Path(tempfile.mkdtemp(prefix="bench_vs_triton_repo."))
    same = args.mp_repository == args.repository
    _copy_repository(args.repository, tmp / "triton", nodelay)
    if same:
        _copy_repository(args.repository, tmp / "mp", nodelay)
    else:
        _copy_repository(args.mp_repository, tmp / "mp", nodelay)
    if ocr:
        onnx, _where = bench_ocr_cls.locate_model(ROOT / "model_repository", None)
        dest = tmp / "mp" / OCR_MODEL
        (dest / "1").mkdir(parents=True)
        shutil.copy(ROOT / "model_repository" / OCR_MODEL / "config.pbtxt", dest)
        shutil.copy(onnx, dest / "1" / "model.onnx")
        args.ort_model = onnx
    args.repository, args.mp_repository = tmp / "triton", tmp / "mp"
    args.stand_in = not same
    return tmp


def raw_ort_record(args: argparse.Namespace, seconds: float) -> dict[str, Any]:
    """Raw onnxruntime on ocr_cls's ONNX file, in this process (the servers idle): one
    InferenceSession with ORT's default CPU settings and one with ``intra_op_num_threads=1``,
    batch sizes ``ORT_BATCHES``. A pa_run-shaped record: ``throughput`` the best images/s,
    p50/p99 of that configuration's ``session.run`` calls (per batch, µs), CPU per image
    (this process's CPU time / images); ``one_thread_cpu_us``: batch size -> CPU µs per
    image with one intra-op thread, what the model itself costs a worker (one thread)."""
    import bench_ocr_cls
    import numpy as np
    import onnxruntime as ort  # type: ignore[import-untyped]

    rows: list[dict[str, Any]] = []
    for threads in (None, 1):
        so = ort.SessionOptions()
        if threads is not None:
            so.intra_op_num_threads = threads
        sess = ort.InferenceSession(str(args.ort_model), so, providers=["CPUExecutionProvider"])
        name = sess.get_inputs()[0].name
        for b in ORT_BATCHES:
            shape = (b, *bench_ocr_cls.INPUT_SHAPE)
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


# --------------------------------------------------------------------------- one round


def start_server(
    side: str, args: argparse.Namespace, log_dir: Path, i: int, models: list[str], restart: int = 0
) -> tuple[ManagedServer, dict[str, str], str | None]:
    """Start one side; returns (server, {model: why not ready}, start error or None)."""
    server: ManagedServer
    suffix = f"-restart{restart}" if restart else ""
    log = log_dir / f"{side.replace(' ', '-')}-round{i}{suffix}.log"
    if side == "Triton":
        server = Triton(args.repository, log, args.peers_env, args.start_timeout, args.stop_timeout)
    elif side == "floor":
        server = Floor(log, args.start_timeout, args.stop_timeout)
    elif side == "identity floor":
        server = Floor(log, args.start_timeout, args.stop_timeout, FLOOR_IDENTITY)
    elif side == "native floor":
        try:
            server = NativeFloor(log, args.start_timeout, args.stop_timeout)
        except BenchError as e:
            print(f"  {side}: ERROR: {e}", flush=True)
            return Floor(log), {}, str(e)
    else:
        server = TritonMP(
            args.mp_repository,
            log,
            args.server_cmd,
            args.start_timeout,
            args.stop_timeout,
            args.base_src if side == "triton-mp base" else args.mp_src,
            SIDE_ARGS.get(side),
        )
    print(f"  {side}: {server.info['cmd']}", flush=True)
    try:
        failed = server.start(models)
    except BenchError as e:
        print(f"  {side}: ERROR: {e}", flush=True)
        return server, {}, str(e)
    print(
        f"  {side}: up after {server.info['ready_s']} s, "
        f"{server.info['processes_when_ready']} processes"
        + "".join(f"\n  {side}: model {m} NOT READY: {why}" for m, why in failed.items()),
        flush=True,
    )
    return server, failed, None


def run_round(
    i: int, args: argparse.Namespace, peers_env: dict[str, str], log_dir: Path, skip: dict[str, str]
) -> tuple[dict[str, Any], bool]:
    """Start both servers, run every workload on both (paired, alternating order), stop both.
    `skip`: sides whose start failed in an earlier round -> that error (not retried)."""
    used = [
        side
        for side in SIDES
        if any(side in w.sides for w in args.workloads) and side not in SERVERLESS
    ]
    order = used if i % 2 == 1 else list(reversed(used))
    rnd: dict[str, Any] = {"round": i, "order": order, "servers": {}, "runs": [], "restarts": []}
    models_of = {
        side: sorted({w.model_for(side) for w in args.workloads if side in w.sides})
        for side in used
    }
    servers: dict[str, ManagedServer] = {}
    model_errors: dict[str, dict[str, str]] = {}
    start_errors: dict[str, str] = dict(skip)
    ok = True
    jsonl = log_dir / "pa_runs.jsonl"
    print(f"round {i}/{args.rounds}: order {' then '.join(order)}", flush=True)
    try:
        for side in used:
            if side in start_errors:
                continue
            server, failed, err = start_server(side, args, log_dir, i, models_of[side])
            servers[side] = server
            rnd["servers"][side] = server.info
            model_errors[side] = failed
            if err is not None:
                start_errors[side] = err
        for side, server in servers.items():
            if side not in start_errors:
                server.info["idle_cores"] = server.idle_cores(1.0)
        rnd["start_errors"] = start_errors
        print(
            "  idle cores: "
            + ", ".join(
                f"{s} {servers[s].info.get('idle_cores')}"
                for s in used
                if s in servers and s not in start_errors
            ),
            flush=True,
        )
        for w in args.workloads:
            for side in (s for s in [*order, *SERVERLESS] if s in w.sides):
                rec: dict[str, Any]
                if side in SERVERLESS:
                    rec = raw_ort_record(args, args.window_ms / 2000)
                elif (
                    side not in start_errors
                    and not servers[side].running()
                    and len(rnd["restarts"]) < MAX_RESTARTS
                ):
                    # Died under us (on this shared machine, e.g. killed by someone else's
                    # clean-up): record it, collect what it left, and start a fresh one.
                    dead = servers[side]
                    info = dead.stop()
                    ok = False
                    print(
                        f"  {side} DIED during the round (before {w.label}); "
                        f"{dead.stop_line()}; starting a new one",
                        flush=True,
                    )
                    rnd["restarts"].append({"side": side, "before": w.key, "server": info})
                    server, failed, err = start_server(
                        side, args, log_dir, i, models_of[side], len(rnd["restarts"])
                    )
                    servers[side] = server
                    rnd["servers"][side] = server.info
                    model_errors[side] = failed
                    if err is not None:
                        start_errors[side] = err
                if side in SERVERLESS:
                    pass  # measured above
                elif side in start_errors:
                    rec = {"error": f"{side} did not start: {common.last_line(start_errors[side])}"}
                elif w.model_for(side) in model_errors.get(side, {}):
                    m = w.model_for(side)
                    rec = {"error": f"{m} not ready: {model_errors[side][m]}"}
                else:
                    extra = (
                        []
                        if args.stability_percentage is None
                        else ["-s", str(args.stability_percentage)]
                    )
                    rec = run_pa(
                        w,
                        args.pa_run,
                        peers_env,
                        servers[side],
                        f"{side} {w.label} {w.protocol} round {i}",
                        w.args(side) + extra,
                        args.window_ms,
                        args.attempts,
                        jsonl,
                    )
                rec.update(round=i, side=side, workload=w.key)
                rnd["runs"].append(rec)
                if rec.get("throughput") is not None:
                    print(
                        f"  {w.label:28} {w.protocol:4} {side:13}: {rec['throughput']:9.1f} "
                        f"infer/s, p50 "
                        f"{rec['p50_us'] / 1000:7.2f} ms, p99 {rec['p99_us'] / 1000:7.2f} ms; "
                        f"cores: server {rec['server_cores']:.2f}, perf_analyzer "
                        f"{rec['client_cores']:.2f}, others {common.other_cores(rec):.2f}",
                        flush=True,
                    )
                else:
                    ok = False
                    print(
                        f"  {w.label:28} {w.protocol:4} {side:13}: FAILED: "
                        f"{common.last_line(rec['error'])}",
                        flush=True,
                    )
    finally:
        # NOTE: the sides share one /dev/shm; what another side holds is not this one's leftover.
        for server in servers.values():
            server.snapshot()
        for server in servers.values():
            for other in servers.values():
                if other is not server:
                    server.shm_before |= other.shm_seen
        for side, server in servers.items():
            info = server.stop()
            print(f"  {server.stop_line()}", flush=True)
            if not info.get("clean"):
                ok = False
                if side not in start_errors:
                    print(server.log_tail(), flush=True)
    return rnd, ok


# --------------------------------------------------------------------------- summary, table


def ratio_key(num: str, den: str) -> str:
    return f"{num}/{den}"


def summarise(rounds: list[dict[str, Any]], workloads: list[Workload]) -> list[dict[str, Any]]:
    """One row per workload: per side (those the workload ran on) medians over rounds, and the
    throughput ratios of RATIOS per round and their median. ``ratio``/``ratios`` (triton-mp /
    Triton) stay at the top level for the chart and older readers; ``vs`` holds every ratio;
    ``p50_vs_triton`` is each triton-mp side's p50 / Triton's p50, per round and median."""
    rows = []
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
                if b.get("throughput") and a.get("throughput") is not None:
                    per_round.append(round(a["throughput"] / b["throughput"], 3))
            vs[ratio_key(num, den)] = {
                "ratios": per_round,
                "ratio": round(statistics.median(per_round), 3) if per_round else None,
            }
        row["vs"] = vs
        if "onnxruntime" in w.sides:
            row["outside_ort_us"] = outside_ort(by_round, w.sides)
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


# --------------------------------------------------------------------------- chart


def chart(rows: list[dict[str, Any]], path: Path, title: str, note: str, mp_name: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    colors = {
        "Triton": "#76b900",
        "triton-mp": "#1f6fb4",
        "triton-mp base": "#b07aa1",
        "triton-mp fp2": "#7aa6d6",
        "triton-mp python": "#0b3d6b",
        "floor": "#999999",
        "native floor": "#555555",
        "identity floor": "#c8c8c8",
        "onnxruntime": "#e0a040",
    }
    labels = {
        "Triton": "Triton 2.51 (python backend)",
        "triton-mp": mp_name,
        "triton-mp base": "triton-mp base (--baseline)",
        "triton-mp fp2": mp_name + " --frontend-processes 2",
        "triton-mp python": mp_name + " --grpc-frontend python",
        "floor": "Python floor (floor_server.py)",
        "native floor": "native floor (peers/native_floor, C++ libgrpc++)",
        "identity floor": "identity floor (floor_identity.py)",
        "onnxruntime": "raw onnxruntime, best batched (ocr_cls; p99 per batch)",
    }
    present = [side for side in SIDES if any(side in r["sides"] for r in rows)]
    x = list(range(len(rows)))
    width = 0.8 / len(present)
    fig, (ax_t, ax_l) = plt.subplots(2, 1, figsize=(12, 8.5), sharex=True)
    for k, side in enumerate(present):
        here = [
            (xv + (k - (len(present) - 1) / 2) * width, r[side])
            for xv, r in zip(x, rows, strict=True)
            if side in r
        ]
        xs = [xv for xv, _ in here]
        for ax, key, per_round in (
            (ax_t, "throughput", "throughputs"),
            (ax_l, "p99_ms", "p99s_ms"),
        ):
            vals = [s[key] for _, s in here]
            lows = [
                v - min(s[per_round]) if v is not None else 0
                for v, (_, s) in zip(vals, here, strict=True)
            ]
            highs = [
                max(s[per_round]) - v if v is not None else 0
                for v, (_, s) in zip(vals, here, strict=True)
            ]
            ax.bar(
                xs,
                [v or 0 for v in vals],
                width,
                color=colors[side],
                label=labels[side],
                yerr=[lows, highs],
                capsize=3,
                error_kw={"elinewidth": 1, "alpha": 0.7},
            )
            for xv, v, hi in zip(xs, vals, highs, strict=True):
                if v is None:
                    ax.text(
                        xv,
                        0.02,
                        "not\nmeasured",
                        ha="center",
                        va="bottom",
                        fontsize=7,
                        color=colors[side],
                        transform=ax.get_xaxis_transform(),
                    )
                else:
                    ax.text(
                        xv,
                        (v + hi) * 1.04,
                        f"{v:.3g}" if v < 1000 else f"{v:.0f}",
                        ha="center",
                        va="bottom",
                        fontsize=7,
                    )
    for xv, r in zip(x, rows, strict=True):
        if r["ratio"] is not None:
            ax_t.text(
                xv,
                1.0,
                f"{r['ratio']:.2f}x",
                ha="center",
                va="bottom",
                fontsize=9,
                fontweight="bold",
                transform=ax_t.get_xaxis_transform(),
            )
    plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
    for ax, per_round in ((ax_t, "throughputs"), (ax_l, "p99s_ms")):
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        seen = [v for r in rows for side in r["sides"] for v in r[side][per_round]]
        if seen:  # room below the smallest bar and above the tallest for the labels
            ax.set_ylim(min(seen) / 3, max(seen) * 2.5)
    ax_t.set_ylabel("throughput, infer/s (log)")
    ax_t.set_title(title, pad=22, fontsize=11)
    ax_t.legend(loc="upper right", fontsize=8)
    ax_t.grid(axis="y", which="both", alpha=0.25)
    ax_l.set_ylabel("p99 latency, ms (log)")
    ax_l.grid(axis="y", which="both", alpha=0.25)
    ax_l.set_xticks(
        x,
        [
            (r["label"] + ("" if r["protocol"] == "grpc" else " HTTP")).replace(" c=", "\nc=")
            for r in rows
        ],
        fontsize=8,
    )
    fig.text(0.01, 0.005, "\n".join(textwrap.wrap(note, 190)), fontsize=7, va="bottom")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--repository",
        type=Path,
        default=DEFAULT_REPOSITORY,
        help="model repository served by both servers (default: %(default)s)",
    )
    ap.add_argument(
        "--mp-repository",
        type=Path,
        help="serve triton-mp from this repository instead (a stand-in with the same "
        "model names and I/O, e.g. ONNX models; the table says so)",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        help="alternating rounds; the ratio is the median over rounds (default 3, 1 with --quick)",
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: -p 1000, one attempt per run, one round (unless --rounds)",
    )
    ap.add_argument(
        "-p",
        "--window-ms",
        type=int,
        help="perf_analyzer measurement window (default 3000, 1000 with --quick)",
    )
    ap.add_argument(
        "-s",
        "--stability-percentage",
        type=int,
        help="perf_analyzer's -s, the same for both servers (default: "
        "perf_analyzer's 10; 50 with --quick)",
    )
    ap.add_argument(
        "--workloads",
        default=",".join(w.key for w in WORKLOADS),
        help="comma-separated subset of: %(default)s",
    )
    ap.add_argument("--json", type=Path, help="write every record and the summary here")
    ap.add_argument(
        "--png",
        type=Path,
        default=DEFAULT_PNG,
        help="chart of throughput and p99 latency (default: %(default)s)",
    )
    ap.add_argument("--no-png", action="store_true", help="do not write the chart")
    ap.add_argument(
        "--peers-env",
        type=Path,
        default=DEFAULT_PEERS_ENV,
        help="env file written by install-peers.sh; installed there when missing "
        "(default: %(default)s)",
    )
    ap.add_argument(
        "--server-cmd",
        help="command that starts triton-mp, before --model-repository etc. "
        "(default: this checkout's, 'python -m triton_mp start' with src/ "
        "first on PYTHONPATH)",
    )
    ap.add_argument(
        "--mp-commit",
        metavar="REV",
        help="run triton-mp as committed at REV (its src/ exported with git archive "
        "to a temporary folder), not the working tree that others may be "
        "editing; e.g. HEAD",
    )
    ap.add_argument(
        "--baseline",
        metavar="REV",
        help="also run triton-mp as committed at REV ('triton-mp base') next to this one on "
        "every workload triton-mp runs: an A/B of two commits in the same rounds",
    )
    ap.add_argument(
        "--skip-sides",
        default="",
        help="comma-separated servers not to run, e.g. 'triton-mp fp2,identity floor'",
    )
    ap.add_argument(
        "--no-private-shm",
        dest="private_shm",
        action="store_false",
        help="run in the machine's /dev/shm, not in a private one (see README)",
    )
    ap.add_argument("--pa-run", type=Path, default=DEFAULT_PA_RUN, help="default: %(default)s")
    ap.add_argument("--start-timeout", type=float, default=120.0)
    ap.add_argument("--stop-timeout", type=float, default=30.0)
    a = ap.parse_args(argv)
    keys = [k.strip() for k in a.workloads.split(",") if k.strip()]
    known = {w.key: w for w in WORKLOADS}
    unknown = [k for k in keys if k not in known]
    if unknown or not keys:
        ap.error(f"--workloads: unknown {unknown}; choose from {', '.join(known)}")
    skip = {x.strip() for x in a.skip_sides.split(",") if x.strip()}
    if skip - set(SIDES):
        ap.error(f"--skip-sides: unknown {sorted(skip - set(SIDES))}; choose from {SIDES}")
    a.workloads = []
    for k in keys:
        sides = [x for x in known[k].sides if x not in skip]
        if a.baseline and "triton-mp" in sides:
            sides.insert(sides.index("triton-mp") + 1, "triton-mp base")
        a.workloads.append(dataclasses.replace(known[k], sides=tuple(sides)))
    a.rounds = a.rounds if a.rounds is not None else (1 if a.quick else 3)
    a.window_ms = a.window_ms or (1000 if a.quick else 3000)
    a.attempts = 1 if a.quick else 3
    if a.stability_percentage is None and a.quick:
        a.stability_percentage = 50
    a.repository = a.repository.resolve()
    a.mp_repository = (a.mp_repository or a.repository).resolve()
    a.peers_env = a.peers_env.resolve()
    a.mp_src = ROOT / "src"
    a.base_src = None
    a.ort_model = None
    if a.mp_commit and a.server_cmd:
        ap.error("--mp-commit and --server-cmd exclude each other")
    return a


def triton_mp_version(args: argparse.Namespace) -> str:
    """Which triton-mp runs: the commit (exported with --mp-commit, or the checkout's HEAD and
    whether src/ has local changes), or the --server-cmd."""
    if args.server_cmd:
        return f"--server-cmd {args.server_cmd!r}"

    def git(*a: str) -> str:
        return subprocess.run(
            ["git", "-C", str(ROOT), *a], capture_output=True, text=True, check=True
        ).stdout.strip()

    try:
        if args.mp_commit:
            return f"commit {git('rev-parse', '--short', args.mp_commit + '^{commit}')}"
        dirty = git("status", "--porcelain", "--", "src")
        return f"checkout at {git('rev-parse', '--short', 'HEAD')}" + (
            " + uncommitted changes in src/" if dirty else ""
        )
    except (OSError, subprocess.CalledProcessError):
        return "checkout (no git)"


def export_commit(rev: str) -> Path:
    """src/ as committed at rev, in a new temporary folder; returns that src/."""
    dest = Path(tempfile.mkdtemp(prefix="bench_vs_triton_src."))
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "src"], capture_output=True, check=False
    )
    if archive.returncode != 0:
        raise BenchError(f"git archive {rev} src: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest / "src"


def private_shm_command(argv: list[str]) -> list[str] | None:
    """The command that reruns this benchmark in a mount namespace of its own with a fresh
    tmpfs on /dev/shm, or None when that is not possible here (no unshare, no privilege).

    perf_analyzer names its system shared memory regions after the tensors (/INPUT0_0_0,
    /OUTPUT0_0_0, ...), the same in every perf_analyzer process: two shm runs on one machine
    (ours and another engineer's test) truncate each other's regions under the servers, which
    then die of SIGBUS. In a private /dev/shm, the servers and perf_analyzer see only ours."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    ns = [
        unshare,
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        'mount -t tmpfs -o mode=1777 tmpfs /dev/shm && exec "$@"',
        "sh",
    ]
    probe = subprocess.run([*ns, "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        return None
    return [*ns, sys.executable, str(Path(__file__).resolve()), *argv]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.private_shm and not os.environ.get(PRIVATE_SHM_ENV):
        cmd = private_shm_command(argv)
        if cmd is not None:
            sys.stdout.flush()
            os.execve(cmd[0], cmd, dict(os.environ, **{PRIVATE_SHM_ENV: "1"}))
        print(
            "WARNING: cannot give this run a private /dev/shm (needs unshare and mount "
            "privileges): perf_analyzer shm runs may collide with others' on this machine",
            flush=True,
        )
    private = bool(os.environ.get(PRIVATE_SHM_ENV))
    cpus = len(os.sched_getaffinity(0))
    stand_in = args.mp_repository != args.repository
    mp_name = "triton-mp (stand-in repo)" if stand_in else "triton-mp"
    started = datetime.datetime.now(datetime.timezone.utc)
    result: dict[str, Any] = {
        "benchmark": "triton-mp vs Triton 2.51, same perf_analyzer runs",
        "started": started.isoformat(timespec="seconds"),
        "host": {
            "node": platform.node(),
            "cpus_usable": cpus,
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_at_start": os.getloadavg(),
        },
        "method": "servers started fresh each round, all up during the round; per workload "
        "its sides' runs are back to back, in the order Triton, triton-mp, "
        "triton-mp fp2 (--frontend-processes 2), floor in odd rounds and the "
        "reverse in even rounds; ratio = median over rounds of the round's ratio",
        "options": {
            k: (str(v) if isinstance(v, Path) else v)
            for k, v in vars(args).items()
            if k != "workloads"
        },
        "workloads": [
            {"key": w.key, "label": w.label, "args": w.args(), "sides": list(w.sides)}
            for w in args.workloads
        ],
        "private_dev_shm": private,
        "rounds": [],
    }
    ok = True
    skip: dict[str, str] = {}
    repo_tmp: Path | None = None
    try:
        repo_tmp = prepare_repositories(args)
        result["repositories"] = {"triton": str(args.repository), "mp": str(args.mp_repository)}
        result["triton_mp"] = mp_version = triton_mp_version(args)
        if args.mp_commit:
            args.mp_src = export_commit(args.mp_commit)
        if args.baseline:
            args.base_src = export_commit(args.baseline)
            result["triton_mp_base"] = f"commit {args.baseline}"
        common.ensure_peers(args.peers_env)
        peers_env = common.load_peers_env(args.peers_env)
        if not args.pa_run.is_file():
            raise BenchError(f"{args.pa_run} not found (--pa-run)")
        log_dir = Path(tempfile.mkdtemp(prefix="bench_vs_triton."))
        result["log_dir"] = str(log_dir)
        print(
            f"Triton on {args.repository}; triton-mp ({mp_version}) on {args.mp_repository}"
            + (" (STAND-IN)" if stand_in else "")
            + f"; {cpus} CPUs; logs in {log_dir}"
            + ("; private /dev/shm (own mount namespace)" if private else ""),
            flush=True,
        )
        for i in range(1, args.rounds + 1):
            rnd, round_ok = run_round(i, args, peers_env, log_dir, skip)
            result["rounds"].append(rnd)
            ok = ok and round_ok
            for side, err in rnd.get("start_errors", {}).items():
                skip.setdefault(side, err)  # a server that did not start will not next round
    except BenchError as e:
        ok = False
        result["error"] = str(e)
        print(f"ERROR: {e}", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        ok = False
        result["error"] = "interrupted"
        print("interrupted: the table shows the rounds finished so far", flush=True)

    if args.mp_commit and args.mp_src != ROOT / "src":
        shutil.rmtree(args.mp_src.parent, ignore_errors=True)
    if args.base_src is not None:
        shutil.rmtree(args.base_src.parent, ignore_errors=True)
    if repo_tmp is not None:
        shutil.rmtree(repo_tmp, ignore_errors=True)
    rows = summarise(result["rounds"], args.workloads)
    result["summary"] = rows
    result["ok"] = ok
    result["host"]["loadavg_at_end"] = os.getloadavg()
    n = len(result["rounds"])
    if n:
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
                )
        for r in result["rounds"]:
            for side, info in r["servers"].items():
                if "clean" in info and not info["clean"] and side not in r.get("start_errors", {}):
                    print(
                        f"round {r['round']}: {side} stop NOT clean: {info.get('stop')}, exit "
                        f"{info.get('exit_code')}, leftover processes "
                        f"{[p['cmdline'][:60] for p in info.get('leftover_processes', [])]},"
                        f" /dev/shm left {info.get('shm_left')}"
                    )
        if not args.no_png:
            bg = med(
                [
                    common.other_cores(rec)
                    for r in result["rounds"]
                    for rec in r["runs"]
                    if rec.get("throughput") is not None
                ]
            )
            note = (
                f"{started:%Y-%m-%d %H:%M} UTC, {platform.node()}, {cpus} CPUs shared by "
                f"server and perf_analyzer; triton-mp {result.get('triton_mp', '?')}; "
                f"perf_analyzer -i grpc (HTTP: -i http) -p {args.window_ms}; "
                f"{n} alternating round(s): "
                f"bars = median, whiskers = min-max; label = median ratio "
                f"triton-mp/Triton; background load (other processes) during the runs: "
                f"median {fmt(bg, '.2f')} cores"
            )
            if stand_in:
                note += f"; triton-mp served a STAND-IN repository ({args.mp_repository.name})"
            title = f"triton-mp vs Triton 2.51: the same perf_analyzer runs on the same {cpus} CPUs"
            chart(rows, args.png, title, note, mp_name)
            result["png"] = str(args.png)
            print(f"\nwrote {args.png}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2, default=str) + "\n")
        print(f"wrote {args.json}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
