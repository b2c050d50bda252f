#!/usr/bin/env python3
"""Throughput on a repeated-input workload with the response cache on and off, in one run.

    python bench/bench_response_cache.py --rounds 3 --concurrency 8

One triton-mp server (``--cache-config local,size=16 MiB``, two frontend processes) serves
two copies of ``bench/model_repository/add_sub_py``: ``add_sub_cached`` with
``response_cache { enable: true }`` and ``add_sub_plain`` without it. perf_analyzer sends
the same input tensors with every request (it generates its data once), so after the first
request every request to the cached copy is a hit answered by the frontend, while the plain
copy queues, batches and executes each one. Per round perf_analyzer (through
bench/pa_run.py) runs against each model in turn, the order reversed every other round,
and the round's ratio is cached / plain throughput; the table gives every round and the
median ratio, and the server's own ModelStatistics confirm the hits. Results go to
``bench/results/response_cache.json``. Exit status 0 when every run measured.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

import common  # bench/common.py: bench/ is on sys.path when this runs as a script
from common import BENCH, ROOT, TritonMP

MODELS = ("add_sub_cached", "add_sub_plain")
CACHE_BYTES = 16 << 20


def repository(root: Path) -> Path:
    """The two copies of add_sub_py, one with the response cache enabled."""
    repo = root / "repo"
    for name in MODELS:
        shutil.copytree(BENCH / "model_repository" / "add_sub_py", repo / name)
        cfg = (repo / name / "config.pbtxt").read_text().replace("add_sub_py", name)
        if name == "add_sub_cached":
            cfg += "response_cache { enable: true }\n"
        (repo / name / "config.pbtxt").write_text(cfg)
    return repo


def cache_counts(server: TritonMP, model: str) -> dict[str, int]:
    """The model's ModelStatistics: executions, hits and misses (HTTP/REST)."""
    url = f"http://127.0.0.1:{server.http}/v2/models/{model}/stats"
    with urllib.request.urlopen(url, timeout=10) as r:
        st = json.load(r)["model_stats"][0]
    inf = st["inference_stats"]
    return {
        "executions": int(st["execution_count"]),
        "hits": int(inf["cache_hit"]["count"]),
        "misses": int(inf["cache_miss"]["count"]),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--window-ms", type=int, default=3000)
    ap.add_argument("--attempts", type=int, default=2)
    ap.add_argument(
        "--stability-percentage",
        type=int,
        default=30,
        help="perf_analyzer -s (its default 10 rarely holds on a shared machine)",
    )
    ap.add_argument("--peers-env", type=Path, default=common.DEFAULT_PEERS_ENV)
    ap.add_argument("--out", type=Path, default=BENCH / "results" / "response_cache.json")
    args = ap.parse_args()
    common.ensure_peers(args.peers_env)
    peers = common.load_peers_env(args.peers_env)
    work = Path(tempfile.mkdtemp(prefix="bench_cache_"))
    server = TritonMP(
        repository(work),
        work / "server.log",
        extra_args=[f"--cache-config=local,size={CACHE_BYTES}", "--frontend-processes=2"],
    )
    rounds: list[dict[str, Any]] = []
    try:
        errors = server.start(list(MODELS))
        if errors:
            print(f"models failed to load: {errors}", file=sys.stderr)
            return 1
        for r in range(args.rounds):
            order = MODELS if r % 2 == 0 else MODELS[::-1]
            row: dict[str, Any] = {"round": r + 1}
            for model in order:
                rec = common.run_pa(
                    common.DEFAULT_PA_RUN,
                    peers,
                    server,
                    f"{model} r{r + 1}",
                    [
                        "-m",
                        model,
                        "--concurrency-range",
                        str(args.concurrency),
                        "-s",
                        str(args.stability_percentage),
                    ],
                    args.window_ms,
                    args.attempts,
                    work / "pa.jsonl",
                )
                row[model] = rec.get("throughput")
                row[f"{model}_p50_us"] = rec.get("p50_us")
                if rec.get("error"):
                    row[f"{model}_error"] = common.last_line(str(rec["error"]))
            if row["add_sub_cached"] and row["add_sub_plain"]:
                row["ratio"] = row["add_sub_cached"] / row["add_sub_plain"]
            rounds.append(row)
            print(
                f"round {r + 1}: cached {common.fmt(row['add_sub_cached'], '.0f')}/s, "
                f"plain {common.fmt(row['add_sub_plain'], '.0f')}/s, "
                f"ratio {common.fmt(row.get('ratio'), '.2f')}",
                flush=True,
            )
        counts = {m: cache_counts(server, m) for m in MODELS}
    finally:
        stop = server.stop()
        shutil.rmtree(work, ignore_errors=True)
    ratios = [row["ratio"] for row in rounds if row.get("ratio")]
    result = {
        "concurrency": args.concurrency,
        "cache_bytes": CACHE_BYTES,
        "rounds": rounds,
        "median_ratio": statistics.median(ratios) if ratios else None,
        "server_stats": counts,
        "stop": stop,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"\nmedian cached/plain throughput ratio over {len(ratios)} rounds: "
        f"{common.fmt(result['median_ratio'], '.2f')}x\nserver stats: {counts}"
    )
    return 0 if len(ratios) == args.rounds else 1


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "bench"))
    raise SystemExit(main())
