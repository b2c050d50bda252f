#!/usr/bin/env python3
"""This checkout's server twice, ``--grpc-frontend native`` against ``--grpc-frontend
python``, both up at once, short perf_analyzer runs interleaved (``ab_interleaved.py``'s
method and records: infer/s, batch size, CPU µs per inference per role from /proc).

    python bench/ab_frontends.py --pairs 4 --window 8 --pa-args=--streaming
    python bench/ab_frontends.py -c 16

Both servers run this checkout's ``src/`` as it is on disk, with the native extension built
in place (``python setup.py build_ext --inplace``): a committed tree (``git archive``) has
no extension. Prints each run, then the medians per side and their ratios (native / python).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

from ab_interleaved import (  # bench/ is on sys.path when this runs as a script
    add_run_arguments,
    one_run,
)
from common import TritonMP, load_peers_env

SIDES = ("native", "python")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_arguments(ap, pairs=4, window_s=8.0)
    args = ap.parse_args()
    env = load_peers_env(args.peers_env)
    logs = Path(os.environ.get("TMPDIR", "/tmp"))
    servers: dict[str, TritonMP] = {}
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    try:
        for side in SIDES:
            log = logs / f"ab_frontends_{os.getpid()}_{side}.log"
            servers[side] = TritonMP(args.repository, log, extra_args=["--grpc-frontend", side])
            servers[side].start([args.model])
        for i in range(args.pairs):
            for side in SIDES if i % 2 == 0 else SIDES[::-1]:
                rec = one_run(servers[side], args, env)
                runs[side].append(rec)
                print(side, rec, flush=True)
    finally:
        for s in servers.values():
            s.stop()
            print(s.stop_line(), flush=True)
    meds = {
        side: {k: statistics.median(r[k] for r in runs[side]) for k in runs[side][0]}
        for side in SIDES
    }
    for side in SIDES:
        print(f"{side} medians: {meds[side]}")
    ratios = {
        k: round(meds["native"][k] / meds["python"][k], 2)
        for k in meds["native"]
        if meds["python"][k]
    }
    print(f"native / python: {ratios}")
    if args.json:
        args.json.write_text(json.dumps({"pa_args": args.pa_args, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
