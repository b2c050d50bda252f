#!/usr/bin/env python3
"""This checkout's server twice, ``--grpc-frontend native`` against ``--grpc-frontend
python``, both up at once, short perf_analyzer runs interleaved (``ab_interleaved.py``'s
method and records: infer/s, batch size, CPU µs per inference per role from /proc, and
perf_analyzer's p50 latency in µs); optionally the native floor as a third peer and
another checkout's native frontend as a fourth, in the same rounds.

    python bench/ab_frontends.py --pairs 4 --window 8 --pa-args=--streaming
    python bench/ab_frontends.py -c 16 --floor --base-src /tmp/main/src
    python bench/ab_frontends.py -c 16 --floor --base-src /tmp/main/src --no-python

Both servers run this checkout's ``src/`` as it is on disk, with the native extension built
in place (``python setup.py build_ext --inplace``): a committed tree (``git archive``) has
no extension (for ``--base-src``, copy the built ``.so`` files into it). The native floor
(``native_floor.py``, built on first use) counts its inferences in ModelStatistics; its
"frontend" is its whole process. Prints each run, then the medians per side and their
ratios (native / python, and native / floor). It refuses to start when the native side
would not serve natively (``native_check``: an extension missing or older than its sources).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ab_interleaved import (  # bench/ is on sys.path when this runs as a script
    ROLES,
    TICK_US,
    add_run_arguments,
    counts,
    role_ticks,
)
from common import ROOT, ManagedServer, TritonMP, descendants, load_peers_env
from native_check import NativeUnavailable, require_native
from native_floor import NativeFloor

SIDES = ("native", "python")


def _floor_ticks(server: ManagedServer) -> int:
    with open(f"/proc/{server.pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def _floor_count(server: ManagedServer, model: str) -> float:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.url)
    try:
        stats = client.get_inference_statistics(model, as_json=True)
    finally:
        client.close()
    return float(sum(int(m.get("inference_count", 0)) for m in stats["model_stats"]))


def _snapshot(server: ManagedServer, model: str) -> tuple[float, dict[str, int], float]:
    """(now, role -> CPU ticks, inferences so far); the floor's whole process is its
    frontend."""
    now = time.monotonic()
    if isinstance(server, NativeFloor):
        ticks = dict.fromkeys(ROLES, 0)
        ticks["frontend"] = _floor_ticks(server)
        return now, ticks, _floor_count(server, model)
    pids = [p for p, _ in descendants(server.pid or 0)]
    return now, role_ticks(pids), counts(server, model)[0]


def one_window(
    server: ManagedServer, args: argparse.Namespace, env: dict[str, str]
) -> dict[str, Any]:
    """One perf_analyzer window: infer/s, CPU µs per inference per role, p50 µs."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "pa.csv"
        pa = [env["PERF_ANALYZER"], "-m", args.model, "-u", server.url, "-i", "grpc"]
        # NOTE: three trials at -s 100 always pass the stability check, so perf_analyzer
        # writes its report (with one trial it never does: it needs three to compare).
        pa += ["--concurrency-range", str(args.c), "-p", str(int(args.window * 1000 / 3))]
        pa += ["-s", "100", "--max-trials", "3", "-f", str(report), *args.pa_args]
        proc = subprocess.Popen(pa, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(1.0)
            t0, c0, n0 = _snapshot(server, args.model)
            time.sleep(args.window - 0.5)
            t1, c1, n1 = _snapshot(server, args.model)
        finally:
            proc.wait()
        p50 = 0.0
        if report.is_file():
            with report.open() as f:
                rows = list(csv.DictReader(f))
            if rows:
                p50 = float(rows[0].get("p50 latency", 0) or 0)
    inferences = n1 - n0
    rec: dict[str, Any] = {"infer_per_s": round(inferences / (t1 - t0), 1), "p50_us": p50}
    for role in ROLES:
        rec[role] = round((c1[role] - c0[role]) * TICK_US / max(inferences, 1), 1)
    return rec


def _servers(args: argparse.Namespace, logs: Path) -> dict[str, ManagedServer]:
    servers: dict[str, ManagedServer] = {}
    for side in SIDES[:1] if args.no_python else SIDES:
        log = logs / f"ab_frontends_{os.getpid()}_{side}.log"
        servers[side] = TritonMP(args.repository, log, extra_args=["--grpc-frontend", side])
    if args.base_src is not None:
        log = logs / f"ab_frontends_{os.getpid()}_base.log"
        servers["base"] = TritonMP(
            args.repository, log, src=args.base_src, extra_args=["--grpc-frontend", "native"]
        )
    if args.floor:
        servers["floor"] = NativeFloor(logs / f"ab_frontends_{os.getpid()}_floor.log")
    return servers


def _medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Each field's median over the runs; p50 over the runs that have one (0: perf_analyzer
    wrote no report, e.g. its run failed)."""
    out = {}
    for k in runs[0]:
        values = [r[k] for r in runs if k != "p50_us" or r[k]]
        out[k] = statistics.median(values) if values else 0.0
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_arguments(ap, pairs=4, window_s=8.0)
    ap.add_argument("--floor", action="store_true", help="the native floor as a peer")
    ap.add_argument("--base-src", type=Path, help="another checkout's src/ (native frontend)")
    ap.add_argument(
        "--no-python", action="store_true", help="no --grpc-frontend python side (fewer servers)"
    )
    args = ap.parse_args()
    try:
        require_native(ROOT / "src", "--grpc-frontend native")
        if args.base_src is not None:
            require_native(args.base_src, "--base-src")
    except NativeUnavailable as e:
        print(e, file=sys.stderr, flush=True)
        return 2
    env = load_peers_env(args.peers_env)
    logs = Path(os.environ.get("TMPDIR", "/tmp"))
    servers = _servers(args, logs)
    sides = list(servers)
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    try:
        for server in servers.values():
            server.start([args.model])
        for i in range(args.pairs):
            for side in sides if i % 2 == 0 else sides[::-1]:
                rec = one_window(servers[side], args, env)
                runs[side].append(rec)
                print(side, rec, flush=True)
    finally:
        for s in servers.values():
            s.stop()
            print(s.stop_line(), flush=True)
    meds = {side: _medians(runs[side]) for side in sides}
    for side in sides:
        print(f"{side} medians: {meds[side]}")
    for peer in ("python", "floor", "base"):
        if peer in meds:
            ratios = {
                k: round(v / meds[peer][k], 2) for k, v in meds["native"].items() if meds[peer][k]
            }
            print(f"native / {peer}: {ratios}")
    if args.json:
        args.json.write_text(json.dumps({"pa_args": args.pa_args, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
