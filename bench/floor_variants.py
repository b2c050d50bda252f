#!/usr/bin/env python3
"""Variants of the native floor side by side: gRPC's completion-queue API as the floor runs
it, with AsyncNotifyWhenDone (three completion-queue events per call, as triton-mp's native
frontend and Triton 2.51), on two polling threads, and on gRPC's callback API.

    python bench/floor_variants.py -c 16 --pairs 6 --window 5
    python bench/floor_variants.py -c 1 --sides cq,cq_notify,callback

Every variant is ``bench/peers/native_floor`` (built on first use into
``.peers/native-floor-variants/``, apart from the floor ``native_floor.py`` runs) with other
flags, each its own process, all up at once; perf_analyzer windows run in rotating order
(``ab_frontends.one_window``: infer/s, CPU µs per inference of the whole process, p50). Per
window it adds voluntary and involuntary context switches per inference (all threads, over
the window) and the thread count. Prints each window, then per variant the medians and the
per-round ratios to the first variant.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

from ab_frontends import one_window  # bench/ is on sys.path when this runs as a script
from ab_interleaved import add_run_arguments
from common import ROOT, load_peers_env
from native_floor import NativeFloor, ensure_built

BINARY = ROOT / ".peers" / "native-floor-variants" / "native_floor"
VARIANTS = {
    "cq": ["--cqs", "1"],  # the floor as native_floor.py runs it: 2 events per call
    "cq_notify": ["--cqs", "1", "--notify", "1"],  # + AsyncNotifyWhenDone: 3 events
    "callback": ["--api", "callback"],  # CallbackService, gRPC's own threads
    "cq_tpc2": ["--cqs", "1", "--tpc", "2"],  # two threads on one queue (callback's count)
}


class Variant(NativeFloor):
    """The native floor with a variant's flags."""

    def __init__(self, log_path: Path, flags: list[str]) -> None:
        super().__init__(log_path)
        self.cmd = [str(ensure_built(BINARY)), "--port", str(self.grpc), *flags]
        self.info["cmd"] = " ".join(self.cmd)


def switches(pid: int) -> tuple[int, int, int]:
    """(voluntary, involuntary) context switches of all of `pid`'s threads, and their count."""
    vol = invol = threads = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        threads += 1
        with open(f"/proc/{pid}/task/{tid}/status") as f:
            for line in f:
                if line.startswith("voluntary_ctxt_switches"):
                    vol += int(line.split()[1])
                elif line.startswith("nonvoluntary_ctxt_switches"):
                    invol += int(line.split()[1])
    return vol, invol, threads


def summary(runs: dict[str, list[dict[str, Any]]], base: str) -> None:
    """Per variant: medians, and the per-round ratios of CPU and infer/s to `base`'s."""
    for side, recs in runs.items():
        cpu = [r["frontend"] / b["frontend"] for r, b in zip(recs, runs[base], strict=True)]
        ips = [r["infer_per_s"] / b["infer_per_s"] for r, b in zip(recs, runs[base], strict=True)]
        p50 = [r["p50_us"] for r in recs if r["p50_us"]]
        print(
            f"{side}: CPU {statistics.median(r['frontend'] for r in recs):.1f} µs/inf, "
            f"{statistics.median(r['infer_per_s'] for r in recs):.0f} infer/s, "
            f"p50 {statistics.median(p50) if p50 else 0:.0f} µs, "
            f"voluntary switches {statistics.median(r['vol_per_inf'] for r in recs):.2f}/inf; "
            f"per round / {base}: CPU {statistics.median(cpu):.3f} "
            f"({sum(x < 1 for x in cpu)}/{len(cpu)} lower), infer/s {statistics.median(ips):.3f}"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_arguments(ap, pairs=6, window_s=5.0)
    ap.add_argument("--sides", default="cq,cq_notify,callback", help=f"of {', '.join(VARIANTS)}")
    args = ap.parse_args()
    env = load_peers_env(args.peers_env)
    sides = args.sides.split(",")
    logs = Path(os.environ.get("TMPDIR", "/tmp"))
    servers = {
        s: Variant(logs / f"floor_variants_{os.getpid()}_{s}.log", VARIANTS[s]) for s in sides
    }
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in sides}
    try:
        for server in servers.values():
            server.start([args.model])
        for i in range(args.pairs):
            order = sides[i % len(sides) :] + sides[: i % len(sides)]
            for side in order[::-1] if i % 2 else order:
                pid = servers[side].pid or 0
                before = switches(pid)
                rec = one_window(servers[side], args, env)
                after = switches(pid)
                n = max(rec["infer_per_s"] * (args.window + 0.5), 1.0)  # NOTE: perf_analyzer's span
                rec["vol_per_inf"] = round((after[0] - before[0]) / n, 3)
                rec["invol_per_inf"] = round((after[1] - before[1]) / n, 3)
                rec["threads"] = after[2]
                rec["load"] = round(os.getloadavg()[0], 1)
                runs[side].append(rec)
                print(i, side, rec, flush=True)
    finally:
        for server in servers.values():
            server.stop()
    summary(runs, sides[0])
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
