#!/usr/bin/env python3
"""c=1 latency of triton-mp commits and the real Triton 2.51, all up at once, short
perf_analyzer windows interleaved (issue 34's c=1 goals).

    python bench/ab_c1.py --commits HEAD,main --rounds 6 --window-ms 2000

On this 2-vCPU machine shared with other sessions the load moves from one minute to the next
by more than the differences sought (tens of µs at c=1), and ``bench_vs_triton.py`` runs each
side minutes apart. Here Triton, commit A and commit B (each's src/ exported with
``git archive``, the built extensions copied in when the native sources match) serve the
same repository (``add_sub_py`` with its 500 µs delay and ``add_sub_py_nodelay`` with
``dynamic_batching { }``) from three servers started once; each round runs one
perf_analyzer window (``pa_run.py``: c=1, one window) per side and model, the sides'
order rotating from round to round. Prints each run (p50, p99, server CPU µs per
inference per role, wake-ups per inference), then per model and side the median p50, CPU
per inference and each role's CPU µs and wake-ups per inference, and the medians of the
per-round ratios of each commit to Triton and to the last commit given (the base). A
commit whose native gRPC frontend is unavailable (its extension missing or stale) is
refused before any server starts (``native_check``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench_vs_triton import export_commit  # bench/ is on sys.path when this runs as a script
from common import ROOT, ManagedServer, Triton, TritonMP, load_peers_env, run_pa
from native_check import NativeUnavailable, require_native
from vs_triton_workloads import NODELAY_MODEL, _copy_repository

MODELS = ("add_sub_py", NODELAY_MODEL)


def _start(args: argparse.Namespace, repo: Path, logs: Path) -> dict[str, ManagedServer]:
    servers: dict[str, ManagedServer] = {}
    srcs = {rev: export_commit(rev) for rev in args.commits}
    for rev, src in srcs.items():
        require_native(src, rev)  # NOTE: before any server starts
    servers["Triton"] = Triton(repo, logs / "triton.log", args.peers_env)
    for i, (rev, src) in enumerate(srcs.items()):
        servers[rev] = TritonMP(repo, logs / f"mp{i}.log", src=src)
    started: list[ManagedServer] = []
    try:
        for name, server in servers.items():
            started.append(server)
            errors = server.start(list(MODELS))
            if errors:
                raise SystemExit(f"{name}: models not ready: {errors}")
    except BaseException:
        # NOTE: the caller never gets the servers to stop: a Triton started before a side
        # that failed to start was left running (found 30 minutes later, its stubs with it).
        for server in started:
            server.stop()
        raise
    return servers


def _summary(runs: dict[str, dict[str, list[dict[str, Any]]]], sides: list[str]) -> dict[str, Any]:
    """Per model: median p50 and CPU per inference per side, medians of the per-round
    ratios of each commit to Triton and to the base (the last side)."""
    out: dict[str, Any] = {}
    base = sides[-1]
    for model in MODELS:
        per = runs[model]
        p50 = {s: [r.get("p50_us") for r in per[s]] for s in sides}
        ok = [i for i in range(len(p50[base])) if all(p50[s][i] for s in sides)]
        if not ok:
            continue

        def ratio(x: str, y: str, ok: list[int] = ok, p50: dict[str, list[Any]] = p50) -> float:
            return round(statistics.median(p50[x][i] / p50[y][i] for i in ok), 3)

        out[model] = {
            "p50_us": {s: statistics.median(p50[s][i] for i in ok) for s in sides},
            "cpu_us": {
                s: statistics.median(per[s][i].get("cpu_us_per_infer") or 0 for i in ok)
                for s in sides
            },
            "roles": {s: _roles([per[s][i] for i in ok]) for s in sides[1:]},
            "to Triton": {s: ratio(s, "Triton") for s in sides[1:]},
            "to base": {s: ratio(s, base) for s in sides[1:-1]},
            "rounds": len(ok),
        }
    return out


def _roles(recs: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Per role of a triton-mp side: median [CPU µs, wake-ups] per inference over its runs."""
    names = sorted({k for r in recs for k in r.get("roles", {})})
    out = {}
    for name in names:
        got = [r["roles"][name] for r in recs if name in r.get("roles", {})]
        out[name] = [
            round(statistics.median(g.get(key) or 0 for g in got), 2)
            for key in ("cpu_us", "wakeups")
        ]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--commits", required=True, help="comma-separated revisions, the base last (HEAD,main)"
    )
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument(
        "--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}"
    )
    ap.add_argument("--window-ms", type=int, default=2000)
    ap.add_argument(
        "--max-trials",
        type=int,
        default=3,
        help="perf_analyzer windows per run before it gives up on a stable one (raise it "
        "under load: at load 10 most c=1 runs found no 3 stable windows)",
    )
    ap.add_argument(
        "--rate",
        type=int,
        help="requests per second (perf_analyzer --request-rate-range) instead of c=1: "
        "the slow c=1 case, e.g. 200 (one request every 5 ms)",
    )
    ap.add_argument("--peers-env", type=Path, default=ROOT / ".peers" / "peers.env")
    ap.add_argument("--pa-run", type=Path, default=ROOT / "bench" / "pa_run.py")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    args.commits = [c.strip() for c in args.commits.split(",") if c.strip()]
    models = [m for m in MODELS if m in args.models.split(",")]
    sides = ["Triton", *args.commits]
    # NOTE: a background run ignores SIGINT: SIGTERM stops the servers too (finally).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    tmp = Path(tempfile.mkdtemp(prefix="ab_c1."))
    repo = tmp / "repo"
    _copy_repository(ROOT / "bench" / "model_repository", repo, nodelay=True)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {m: {s: [] for s in sides} for m in MODELS}
    servers: dict[str, ManagedServer] = {}
    try:
        servers = _start(args, repo, tmp)  # NOTE: refuses a stale build before any peer is read
        env = load_peers_env(args.peers_env)
        for i in range(args.rounds):
            k = i % len(sides)
            order = sides[k:] + sides[:k]
            for model in models:
                for side in order:
                    load = (
                        ["--concurrency-range", "1"]
                        if args.rate is None
                        else ["--request-rate-range", str(args.rate)]
                    )
                    pa = ["-m", model, *load, "-s", "100", "--max-trials", str(args.max_trials)]
                    rec = run_pa(
                        args.pa_run,
                        env,
                        servers[side],
                        f"{side} {model}",
                        pa,
                        args.window_ms,
                        1,
                        tmp / "pa.jsonl",
                    )
                    runs[model][side].append(rec)
                    roles = {
                        k: (v.get("cpu_us"), v.get("wakeups"))
                        for k, v in rec.get("roles", {}).items()
                    }
                    print(
                        f"round {i + 1} {model:20s} {side:6s} p50 {rec.get('p50_us')} µs "
                        f"p99 {rec.get('p99_us')} cpu/inf {rec.get('cpu_us_per_infer')} "
                        f"wakes/inf {rec.get('wakeups_per_infer')} roles {roles}"
                        f"{' ERROR ' + str(rec.get('error')) if rec.get('error') else ''}",
                        flush=True,
                    )
    except NativeUnavailable as e:
        print(e, file=sys.stderr, flush=True)
        return 2
    finally:
        for s in servers.values():
            s.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    summary = _summary(runs, sides)
    for model, s in summary.items():
        print(f"{model}: {json.dumps(s)}")
    if args.json:
        args.json.write_text(
            json.dumps({"commits": args.commits, "runs": runs, "summary": summary})
        )
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
