#!/usr/bin/env python3
"""Two triton-mp commits on one model, both servers up at once, short runs interleaved.

    python bench/ab_interleaved.py --a HEAD --b main --pairs 8 --window 5
    python bench/ab_interleaved.py --a HEAD --b main --model add_sub_py -c 1

On this 2-vCPU machine shared with other sessions, the load around a server changes from one
minute to the next, more than a change of 10% in one role moves that role's CPU per
inference; ``bench_vs_triton.py``'s rounds (each side minutes apart) then cross. Here each
commit's src/ (git archive) serves from its own server, both started once; perf_analyzer
(``--concurrency-range C``, one window) drives them in turn, in A B B A ... order, for
``--pairs`` pairs of ``--window`` seconds, so each pair sees nearly the same load. Per run:
inferences and executions from the server's metrics endpoint (``nv_inference_count``,
``nv_inference_exec_count``), CPU per role from ``/proc/<pid>/stat`` (user + system ticks of
every process whose title names the role), both over the same interval, after a 1 s warm-up.

Prints each run, then the medians per commit and, per pair, the worker's A - B. The average
batch size moves from window to window and the worker's CPU per inference with it (a batch's
fixed cost is shared by fewer requests), so a least-squares fit of per-request + per-batch
cost per commit is printed too, with both evaluated at 3 requests per batch. Both commits
serve gRPC natively: a commit whose native frontend is unavailable (its extension missing or
stale) is refused before any server starts (``native_check``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench_vs_triton import export_commit  # bench/ is on sys.path when this runs as a script
from common import ROOT, TritonMP, descendants, load_peers_env
from native_check import NativeUnavailable, require_native

ROLES = ("worker", "scheduler", "frontend")
TICK_US = 1e6 / os.sysconf("SC_CLK_TCK")


def role_ticks(pids: list[int]) -> dict[str, int]:
    """Role -> user + system ticks of the server's processes (their titles name the role)."""
    out = dict.fromkeys(ROLES, 0)
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline") as f:
                title = f.read()
        except OSError:
            continue
        for role in ROLES:
            if title.startswith(f"triton-mp: {role}"):
                out[role] += int(fields[11]) + int(fields[12])
    return out


def role_wakes(pids: list[int], field: str = "voluntary") -> dict[str, int]:
    """Role -> voluntary context switches of the server's processes (each one a sleep the
    process was woken from: a wake-up), every thread of every process; ``field``
    "nonvoluntary": the switches away from a runnable thread instead (a preemption, or a
    ``sched_yield`` that ran another task)."""
    out = dict.fromkeys(ROLES, 0)
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline") as f:
                title = f.read()
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        role = next((r for r in ROLES if title.startswith(f"triton-mp: {r}")), None)
        if role is None:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/status") as f:
                    text = f.read()
            except OSError:
                continue
            m = re.search(rf"^{field}_ctxt_switches:\s+(\d+)", text, re.M)
            out[role] += int(m.group(1)) if m else 0
    return out


def counts(server: TritonMP, model: str) -> tuple[float, float]:
    """(inferences, executions) of ``model`` so far, from the metrics endpoint."""
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics}/metrics") as r:
        text = r.read().decode()

    def total(metric: str) -> float:
        pattern = rf'^{metric}{{model="{re.escape(model)}"[^}}]*}} (\S+)'
        return sum(float(v) for v in re.findall(pattern, text, re.M))

    return total("nv_inference_count"), total("nv_inference_exec_count")


class RunFailed(RuntimeError):
    """A perf_analyzer window measured nothing: the server counted no inference of the
    model over it (perf_analyzer could not start, reach the server or the model)."""


def one_run(server: TritonMP, args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    """One perf_analyzer window against ``server``; CPU per inference per role over it.

    Raises:
        RunFailed: no inference was counted (with perf_analyzer's exit status and the
            tail of what it wrote)."""
    pa = [env["PERF_ANALYZER"], "-m", args.model, "-u", server.url, "-i", "grpc"]
    pa += ["--concurrency-range", str(args.c), "-p", str(int(args.window * 1000))]
    pa += ["-s", "100", "--max-trials", "1", *args.pa_args]
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(pa, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            time.sleep(1.0)
            pids = [p for p, _ in descendants(server.pid or 0)]
            t0, c0, n0 = time.monotonic(), role_ticks(pids), counts(server, args.model)
            w0, s0 = role_wakes(pids), role_wakes(pids, "nonvoluntary")
            time.sleep(args.window - 0.5)
            t1, c1, n1 = time.monotonic(), role_ticks(pids), counts(server, args.model)
            w1, s1 = role_wakes(pids), role_wakes(pids, "nonvoluntary")
        finally:
            code = proc.wait()
        inferences, executions = n1[0] - n0[0], n1[1] - n0[1]
        # NOTE: a non-zero exit alone is no failure: with --max-trials 1 perf_analyzer exits
        # 2 on "Failed to obtain stable measurement", and the server's counts still hold
        if inferences <= 0 or executions <= 0:
            out.seek(0)
            tail = out.read().decode(errors="replace").strip().splitlines()[-8:]
            raise RunFailed(
                f"perf_analyzer exit status {code}, {inferences:.0f} inferences in "
                f"{executions:.0f} executions of {args.model} counted: " + " | ".join(tail)
            )
    rec: dict[str, Any] = {
        "infer_per_s": round(inferences / (t1 - t0), 1),
        "batch": round(inferences / max(executions, 1), 2),
    }
    for role in ROLES:
        rec[role] = round((c1[role] - c0[role]) * TICK_US / max(inferences, 1), 1)
    for role in ROLES:
        rec[f"{role}_wakes"] = round((w1[role] - w0[role]) / max(inferences, 1), 3)
    rec["worker_preempts"] = round((s1["worker"] - s0["worker"]) / max(inferences, 1), 3)
    rec["load1"] = round(os.getloadavg()[0], 2)
    return rec


def fit(runs: list[dict[str, Any]]) -> tuple[float, float]:
    """Least squares of worker µs per inference = a + b / batch: (a, b)."""
    xs = [1 / r["batch"] for r in runs]
    ys = [r["worker"] for r in runs]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    return my - b * mx, b


def add_run_arguments(ap: argparse.ArgumentParser, *, pairs: int, window_s: float) -> None:
    """The options of an interleaved A/B run (``one_run`` reads them): the model and its
    repository, perf_analyzer's concurrency and flags, ``pairs`` of windows of ``window_s``
    seconds, the peers' env file and the JSON output."""
    ap.add_argument("--model", default="add_sub_py")
    ap.add_argument("--repository", type=Path, default=ROOT / "bench" / "model_repository")
    ap.add_argument("-c", type=int, default=16, help="perf_analyzer concurrency")
    ap.add_argument("--pairs", type=int, default=pairs)
    ap.add_argument("--window", type=float, default=window_s, help="seconds per run")
    ap.add_argument(
        "--pa-args",
        action="extend",
        nargs="*",
        default=[],
        help="more perf_analyzer flags, one per --pa-args=FLAG (they add up)",
    )
    ap.add_argument("--peers-env", type=Path, default=ROOT / ".peers" / "peers.env")
    ap.add_argument("--json", type=Path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", required=True, help="commit A (e.g. HEAD)")
    ap.add_argument("--b", required=True, help="commit B (e.g. main)")
    add_run_arguments(ap, pairs=8, window_s=5.0)
    args = ap.parse_args()
    logs = Path(os.environ.get("TMPDIR", "/tmp"))
    servers: dict[str, TritonMP] = {}
    runs: dict[str, list[dict[str, Any]]] = {"A": [], "B": []}
    try:
        srcs = {side: export_commit(rev) for side, rev in (("A", args.a), ("B", args.b))}
        for side, src in srcs.items():
            require_native(src, f"{side} ({args.a if side == 'A' else args.b})")
        env = load_peers_env(args.peers_env)  # NOTE: after the native check, which needs no peer
        for side, src in srcs.items():
            log = logs / f"ab_interleaved_{os.getpid()}_{side}.log"
            servers[side] = TritonMP(args.repository, log, src=src)
            servers[side].start([args.model])
        for i in range(args.pairs):
            for side in ("A", "B") if i % 2 == 0 else ("B", "A"):
                rec = one_run(servers[side], args, env)
                runs[side].append(rec)
                print(side, rec, flush=True)
    except NativeUnavailable as e:
        print(e, file=sys.stderr, flush=True)
        return 2
    except RunFailed as e:
        print(f"{side} ({args.a if side == 'A' else args.b}): {e}", file=sys.stderr, flush=True)
        return 1
    finally:
        for s in servers.values():
            s.stop()
            print(s.stop_line(), flush=True)
    for side, rev in (("A", args.a), ("B", args.b)):
        med = {k: statistics.median(r[k] for r in runs[side]) for k in runs[side][0]}
        a, b = fit(runs[side])
        print(
            f"{side} ({rev}) medians: {med}; worker fit {a:.1f} + {b:.1f}/batch µs per inference "
            f"= {a + b / 3:.1f} at 3 per batch"
        )
    diffs = [a["worker"] - b["worker"] for a, b in zip(runs["A"], runs["B"], strict=True)]
    print(f"worker A - B per pair: {diffs}; A lower in {sum(d < 0 for d in diffs)} of {len(diffs)}")
    if args.json:
        args.json.write_text(json.dumps({"a": args.a, "b": args.b, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
