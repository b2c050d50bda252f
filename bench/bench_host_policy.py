#!/usr/bin/env python3
"""ocr_cls throughput with host-policy pinning off and on, measured side by side in one run.

    python bench/bench_host_policy.py --rounds 3 --cores 1-1

Two triton-mp servers of this checkout serve ocr_cls (the repository's config, dynamic
batching) at once, each on free ports: ``off`` without ``--host-policy``, ``pinned`` with
``--host-policy cpu,cpu-cores=<--cores>`` (ocr_cls's group names no policy, so Triton's
default name ``cpu`` applies): its worker process is pinned to those cores and onnxruntime's
intra-op pool gets one thread per core. The pinning is checked in ``/proc/<pid>/status``
before measuring. Per round perf_analyzer (through bench/pa_run.py) runs against each server
in turn, the order reversed every other round, so load from other users of the machine falls
on both alike; the ratio pinned / off is taken per round and its median printed. Exit status
0 when every run measured and both servers stopped clean. See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import common  # bench/common.py: bench/ is on sys.path when this runs as a script
from bench_ocr_cls import INPUT_NAME, INPUT_SHAPE, MODEL, locate_model
from common import ROOT, BenchError, TritonMP, descendants


def worker_affinity(server: TritonMP) -> str:
    """``Cpus_allowed_list`` of the server's ocr_cls worker process."""
    assert server.pid is not None
    for pid, _ in descendants(server.pid):
        if common.cmdline(pid).startswith(f"triton-mp: worker {MODEL}_"):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("Cpus_allowed_list:"):
                    return line.split(":", 1)[1].strip()
    raise BenchError("no ocr_cls worker process found")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    last = max(os.sched_getaffinity(0))
    ap.add_argument("--cores", default=f"{last}-{last}", help="cpu-cores of the pinned server")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--window-ms", type=int, default=2000, help="perf_analyzer -p")
    ap.add_argument(
        "--stability", type=int, default=30, help="perf_analyzer -s (percent; a busy machine)"
    )
    ap.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    ap.add_argument("--peers-env", type=Path, default=ROOT / ".peers" / "peers.env")
    ap.add_argument("--pa-run", type=Path, default=common.DEFAULT_PA_RUN)
    ap.add_argument("--json", type=Path, help="write every record here")
    args = ap.parse_args(argv)

    peers_env = common.load_peers_env(args.peers_env)
    variants = {"off": [], "pinned": ["--host-policy", f"cpu,cpu-cores={args.cores}"]}
    servers: dict[str, TritonMP] = {}
    records: list[dict[str, Any]] = []
    affinity: dict[str, str] = {}
    ok = True
    repo = Path(tempfile.mkdtemp(prefix="bench_host_policy_repo."))
    log_dir = Path(tempfile.mkdtemp(prefix="bench_host_policy."))
    try:
        onnx, _ = locate_model(args.repository.resolve(), None)
        (repo / MODEL / "1").mkdir(parents=True)
        shutil.copyfile(args.repository / MODEL / "config.pbtxt", repo / MODEL / "config.pbtxt")
        shutil.copyfile(onnx, repo / MODEL / "1" / "model.onnx")
        for name, flags in variants.items():
            server = TritonMP(repo, log_dir / f"{name}.log", None, 120.0, 30.0, extra_args=flags)
            servers[name] = server
            failed = server.start([MODEL])
            if failed:
                raise BenchError(f"{name}: {MODEL} not ready: {failed[MODEL]}")
            affinity[name] = worker_affinity(server)
        print(f"worker Cpus_allowed_list: {affinity}", flush=True)
        names = list(variants)
        for r in range(args.rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                rec = common.run_pa(
                    args.pa_run,
                    peers_env,
                    servers[name],
                    name,
                    [
                        "-m",
                        MODEL,
                        "--concurrency-range",
                        str(args.concurrency),
                        "--shape",
                        f"{INPUT_NAME}:{','.join(map(str, INPUT_SHAPE))}",
                        "-s",
                        str(args.stability),
                    ],
                    args.window_ms,
                    2,
                    log_dir / "pa_runs.jsonl",
                )
                rec.update(variant=name, round=r + 1)
                records.append(rec)
                ok = ok and rec.get("throughput") is not None
                print(
                    f"round {r + 1} {name:>7}: {common.fmt(rec.get('throughput'), '7.1f')} "
                    f"infer/s, p50 {common.fmt((rec.get('p50_us') or 0) / 1000, '6.2f')} ms, "
                    f"server {rec.get('server_cores')} cores, other {common.other_cores(rec)}",
                    flush=True,
                )
    except BenchError as e:
        ok = False
        print(f"ERROR: {e}", file=sys.stderr, flush=True)
    finally:
        for server in servers.values():
            if not server.stop().get("clean"):
                ok = False
                print(server.stop_line(), flush=True)
        shutil.rmtree(repo, ignore_errors=True)

    by = {
        n: {r["round"]: r for r in records if r["variant"] == n and r.get("throughput")}
        for n in variants
    }
    ratios = [
        by["pinned"][k]["throughput"] / by["off"][k]["throughput"]
        for k in sorted(by["pinned"])
        if k in by["off"]
    ]
    summary = {
        "affinity": affinity,
        "throughput": {n: common.med([r["throughput"] for r in by[n].values()]) for n in variants},
        "ratio_pinned_over_off": round(statistics.median(ratios), 3) if ratios else None,
        "ratio_per_round": [round(x, 3) for x in ratios],
    }
    print(
        f"\nocr_cls, perf_analyzer c={args.concurrency}, {args.rounds} rounds: "
        f"off {summary['throughput']['off']} infer/s, pinned ({args.cores}) "
        f"{summary['throughput']['pinned']} infer/s, pinned/off "
        f"{summary['ratio_pinned_over_off']} {summary['ratio_per_round']}"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "options": {k: str(v) for k, v in vars(args).items()},
                    "records": records,
                    "summary": summary,
                    "ok": ok,
                },
                indent=2,
            )
            + "\n"
        )
        print(f"wrote {args.json}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
