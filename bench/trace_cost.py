"""What request tracing costs: add_sub_py at concurrency 16, tracing off / rate=1000 / rate=1.

Starts three ``triton-mp start`` servers of this checkout on one copy of ``add_sub_py``:
one without trace flags, one with ``--trace-config level=TIMESTAMPS rate=1000`` and one with
``rate=1`` (each writing its own trace file, ``log-frequency=10000``), and measures each with
perf_analyzer (gRPC, ``--concurrency-range 16``) in interleaved rounds (the order flips every
round), so the machine's drift hits all three alike. Prints per round and the median
throughput ratios to tracing off, in the same run; writes every record to ``--json``::

    flock /tmp/bench.lock python bench/trace_cost.py --rounds 3

Needs the peers (perf_analyzer): ``bash bench/peers/install-peers.sh .peers``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import common
from common import ROOT, BenchError, TritonMP

MODEL = "add_sub_py"


def _variants(work: Path) -> list[tuple[str, list[str]]]:
    def traced(rate: int) -> list[str]:
        return [
            "--trace-config",
            f"triton,file={work / f'trace_rate{rate}.json'}",
            "--trace-config",
            "triton,log-frequency=10000",
            "--trace-config",
            "level=TIMESTAMPS",
            "--trace-config",
            f"rate={rate}",
        ]

    return [("off", []), ("rate=1000", traced(1000)), ("rate=1", traced(1))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--window-ms", type=int, default=3000)
    parser.add_argument(
        "--stability",
        type=int,
        default=50,
        help="perf_analyzer -s: windows within this %% of each other (the 2-core machine is "
        "shared and noisy)",
    )
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--peers-env", type=Path, default=ROOT / ".peers" / "peers.env")
    args = parser.parse_args()
    peers_env = common.load_peers_env(args.peers_env)
    work = Path(tempfile.mkdtemp(prefix="trace_cost."))
    repo = work / "repo"
    shutil.copytree(ROOT / "bench" / "model_repository" / MODEL, repo / MODEL)
    servers: dict[str, TritonMP] = {}
    records: list[dict[str, Any]] = []
    try:
        for name, flags in _variants(work):
            server = TritonMP(repo, work / f"{name}.log", extra_args=flags)
            servers[name] = server
            failed = server.start([MODEL])
            if failed:
                raise BenchError(f"{name}: {MODEL} not ready: {failed[MODEL]}")
        names = list(servers)
        for r in range(args.rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                rec = common.run_pa(
                    ROOT / "bench" / "pa_run.py",
                    peers_env,
                    servers[name],
                    name,
                    [
                        "-m",
                        MODEL,
                        "--concurrency-range",
                        str(args.concurrency),
                        "-s",
                        str(args.stability),
                    ],
                    args.window_ms,
                    2,
                    work / "pa_runs.jsonl",
                )
                rec.update(variant=name, round=r + 1)
                records.append(rec)
                print(
                    f"round {r + 1} {name:>10}: {common.fmt(rec.get('throughput'), '8.1f')} "
                    f"infer/s, p50 {common.fmt((rec.get('p50_us') or 0) / 1000, '6.2f')} ms, "
                    f"p99 {common.fmt((rec.get('p99_us') or 0) / 1000, '6.2f')} ms",
                    flush=True,
                )
    finally:
        for server in servers.values():
            server.stop()
    med = {
        n: statistics.median(
            [r["throughput"] for r in records if r["variant"] == n and r.get("throughput")] or [0.0]
        )
        for n in servers
    }
    cpu = {
        n: statistics.median(
            [
                r["cpu_us_per_infer"]
                for r in records
                if r["variant"] == n and r.get("cpu_us_per_infer")
            ]
            or [float("nan")]
        )
        for n in servers
    }
    base, cpu_base = med.get("off") or float("nan"), cpu.get("off") or float("nan")
    print(f"\nmedian of {args.rounds} rounds, add_sub_py c={args.concurrency} (gRPC):")
    for n, v in med.items():
        print(
            f"  {n:>10}: {v:8.1f} infer/s  ratio to off {v / base:5.3f}   "
            f"server CPU {cpu[n]:6.1f} us/infer  ratio to off {cpu[n] / cpu_base:5.3f}"
        )
    traced = sorted(work.glob("trace_rate1.json*"))
    print(f"  rate=1 wrote {len(traced)} trace files ({work})")
    if args.json:
        args.json.write_text(
            json.dumps({"records": records, "median": med, "cpu_us_per_infer": cpu}, indent=1)
        )
    return 0 if all(r.get("throughput") for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
