#!/usr/bin/env python3
"""Where a c=1 request's time goes: per-stage timestamps of every process of a running server.

    python bench/c1_timeline.py --rounds 3 --window-ms 3000            # this checkout
    python bench/c1_timeline.py --commit main --model add_sub_py       # main, 500 µs delay

Two servers of the same source serve ``add_sub_py_nodelay`` (``dynamic_batching { }``) and
``add_sub_py`` (its 500 µs delay): one *probed* (``bench/c1_probe/sitecustomize.py`` on its
PYTHONPATH: every process stamps the entry and return of the methods on a request's path,
CLOCK_MONOTONIC, into files mapped in memory), one plain. Each round runs one perf_analyzer
window (c=1, ``pa_run.py``) on each, alternating. The plain server gives the figures the
probe would disturb: p50, CPU µs and wake-ups (voluntary context switches) per inference per
role. The probed one gives the timeline:

- its stamps, from all processes, sorted by time, are cut into requests at each
  ``Handoff.on_wakeup>`` (the frontend's Python thread takes a call from the native server's
  queue; at c=1 the next one comes after the answer left);
- within a request every stamp is named ``role:label#k`` (its k-th occurrence there);
- stamps present in at least half the requests are ordered by their median offset from the
  request's start; the table gives, per stamp, that median offset, and the median gap from
  the stamp before it (over the requests that have both), in µs.

The last row, ``next take``, is the gap from the last stamp to the next request's take: the
reply's way out through gRPC to perf_analyzer, its next request's way in, and the frontend's
wake-up (a native floor's whole c=1 round trip is ~160 µs on this machine, bench/README.md).
The probe's own cost (~0.6 µs per stamp in process, a few dozen stamps per request) shows
as the probed p50 over the plain one (50-190 µs under load).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import struct
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from common import ROOT, TritonMP, load_peers_env, run_pa
from exports import export_commit
from vs_triton_workloads import NODELAY_MODEL, _copy_repository

PROBE_DIR = ROOT / "bench" / "c1_probe"
START = "frontend:Handoff.on_wakeup>#1"
"""The stamp that starts a request (module docstring)."""
_REC = struct.Struct("<qq")
CPU_ID = 1_000_000
"""``c1_probe``'s offset of a timed stage's CPU records."""


def load_stamps(directory: Path) -> tuple[list[tuple[int, str]], dict[int, str]]:
    """Every stamp of every process, sorted: [(t_ns, 'role:label')], and {pid: role}."""
    out: list[tuple[int, str]] = []
    roles: dict[int, str] = {}
    for names in directory.glob("*.names"):
        pid = int(names.stem)
        table: dict[int, str] = {}
        role = "?"
        for line in names.read_text().splitlines():
            key, _, val = line.partition("\t")
            if key == "#":
                role = _role(val)
            else:
                table[int(key)] = val
        roles[pid] = role
        data = (directory / f"{pid}.stamps").read_bytes()
        for sid, t in _REC.iter_unpack(data):
            if t == 0:
                break
            out.append((t, f"{role}:{table.get(sid, sid)}"))
    out.sort()
    return out, roles


def load_cpu(directory: Path) -> dict[str, tuple[float, float, int]]:
    """Per timed stage (``c1_probe``'s ``_TIMED``): median wall and thread-CPU µs per call,
    and the number of calls, over the whole run."""
    wall: dict[str, list[int]] = defaultdict(list)
    cpu: dict[str, list[int]] = defaultdict(list)
    for names in directory.glob("*.names"):
        pid = int(names.stem)
        table = {}
        for line in names.read_text().splitlines():
            key, _, val = line.partition("\t")
            if key != "#":
                table[int(key)] = val.rstrip(">")
        path = directory / f"{pid}.cpu"
        if not path.exists():
            continue
        for sid, ns in _REC.iter_unpack(path.read_bytes()):
            if sid == 0:
                break
            if sid >= CPU_ID:
                cpu[table.get(sid - CPU_ID, str(sid))].append(ns)
            else:
                wall[table.get(sid, str(sid))].append(ns)
    return {
        k: (statistics.median(wall[k]) / 1e3, statistics.median(cpu[k]) / 1e3, len(wall[k]))
        for k in wall
        if cpu.get(k)
    }


def _role(cmdline: str) -> str:
    """A process's role from its command line (``pa_run.role_of``'s names)."""
    if cmdline.startswith("triton-mp: "):
        return cmdline.split()[1]
    for role in ("frontend", "scheduler", "worker"):
        if role in cmdline:
            return role
    return "supervisor"


def requests(
    stamps: list[tuple[int, str]], t_from: int, t_to: int, first: str = START
) -> list[dict[str, int]]:
    """The stamps between ``t_from`` and ``t_to`` cut into requests (module docstring) at
    each ``first`` stage: per request, {'role:label#k': ns after its start}, plus
    'next take' (the gap to the next request's start)."""
    cut = first.rsplit("#", 1)[0]
    out: list[dict[str, int]] = []
    cur: dict[str, int] | None = None
    seen: dict[str, int] = defaultdict(int)
    start = 0
    for t, name in stamps:
        if t < t_from or t > t_to:
            continue
        if name == cut:
            if cur is not None:
                cur["next take"] = t - start
                out.append(cur)
            cur, start, seen = {}, t, defaultdict(int)
        if cur is None:
            continue
        seen[name] += 1
        cur[f"{name}#{seen[name]}"] = t - start
    return out


def timeline(reqs: list[dict[str, int]]) -> list[dict[str, Any]]:
    """Rows of the table (module docstring): stamps in at least half of ``reqs``, in order of
    their median offset; each with that offset and the median gap from the row before, µs."""
    counts: dict[str, int] = defaultdict(int)
    for r in reqs:
        for k in r:
            counts[k] += 1
    common_keys = [k for k, n in counts.items() if n * 2 >= len(reqs) and k != "next take"]
    med = {k: statistics.median(r[k] for r in reqs if k in r) for k in common_keys}
    order = sorted(common_keys, key=lambda k: med[k])
    order.append("next take")
    med["next take"] = statistics.median(r["next take"] for r in reqs)
    rows: list[dict[str, Any]] = []
    prev: str | None = None
    for k in order:
        if prev is None:
            gap = 0.0
        else:
            gaps = [r[k] - r[prev] for r in reqs if k in r and prev in r]
            gap = statistics.median(gaps) if gaps else float("nan")
        rows.append(
            {
                "stage": k,
                "share": round(counts[k] / len(reqs), 2),
                "at_us": round(med[k] / 1e3, 1),
                "gap_us": round(gap / 1e3, 1),
            }
        )
        prev = k
    return rows


def from_anchor(reqs: list[dict[str, int]], rows: list[dict[str, Any]], anchor: str) -> None:
    """Add ``from_us`` to each row: the median over the requests that have both of the
    stage's offset from ``anchor`` (a stage name, e.g. the deadline's
    ``scheduler:SchedulerCore.next_deadline_ns=#1``), µs; each request's own difference,
    so it does not mix the spread of the two medians as ``at`` minus ``at`` would."""
    for row in rows:
        k = row["stage"]
        diffs = [r[k] - r[anchor] for r in reqs if k in r and anchor in r]
        row["from_us"] = round(statistics.median(diffs) / 1e3, 1) if diffs else None


def print_table(model: str, rows: list[dict[str, Any]], n: int, anchor: str | None) -> None:
    print(f"\n{model}: {n} requests; median µs after the take, and from the row before")
    if anchor:
        print(f"(from: median µs after {anchor} in the same request)")
    print(
        f"{'stage':58s} {'share':>5s} {'at':>8s} {'gap':>8s}" + (f" {'from':>8s}" if anchor else "")
    )
    for row in rows:
        line = f"{row['stage']:58s} {row['share']:5.2f} {row['at_us']:8.1f} {row['gap_us']:8.1f}"
        if anchor:
            f = row.get("from_us")
            line += f" {f:8.1f}" if f is not None else f" {'-':>8s}"
        print(line)


def _servers(args: argparse.Namespace, repo: Path, tmp: Path, stamps: Path) -> list[TritonMP]:
    src = ROOT / "src" if args.commit is None else export_commit(args.commit)
    plain = TritonMP(repo, tmp / "plain.log", src=src)
    probed = TritonMP(repo, tmp / "probed.log", src=src)
    probed.env["PYTHONPATH"] = os.pathsep.join([str(PROBE_DIR), probed.env["PYTHONPATH"]])
    probed.env["C1_PROBE_DIR"] = str(stamps)
    return [plain, probed]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--commit", help="a revision to export (default: this checkout's src)")
    ap.add_argument("--model", action="append", help=f"default: {NODELAY_MODEL}")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--window-ms", type=int, default=3000)
    ap.add_argument("--peers-env", type=Path, default=ROOT / ".peers" / "peers.env")
    ap.add_argument("--pa-run", type=Path, default=ROOT / "bench" / "pa_run.py")
    ap.add_argument("--json", type=Path)
    ap.add_argument(
        "--anchor",
        help="a stage; each row also gives its median µs after it, per request (e.g. "
        "'scheduler:SchedulerCore.next_deadline_ns=#1': the batching deadline)",
    )
    ap.add_argument("--keep", type=Path, help="copy the raw stamp files into this directory")
    ap.add_argument(
        "--start",
        default=START,
        help="the stage that starts a request (default: the Python frontend's take; a call "
        "the native frontend serves end to end never reaches it: give e.g. "
        "'scheduler:SchedulerCore.next_deadline_ns=#1' to cut at each batching deadline)",
    )
    args = ap.parse_args()
    models = args.model or [NODELAY_MODEL]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    env = load_peers_env(args.peers_env)
    tmp = Path(tempfile.mkdtemp(prefix="c1_timeline."))
    stamps = tmp / "stamps"
    stamps.mkdir()
    repo = tmp / "repo"
    _copy_repository(ROOT / "bench" / "model_repository", repo, nodelay=True)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        m: {"plain": [], "probed": []} for m in models
    }
    spans: dict[str, list[tuple[int, int]]] = {m: [] for m in models}
    servers = _servers(args, repo, tmp, stamps)
    try:
        for s in servers:
            errors = s.start(["add_sub_py", NODELAY_MODEL])
            if errors:
                raise SystemExit(f"models not ready: {errors} ({s.log_tail()})")
        for i in range(args.rounds):
            for model in models:
                order = list(zip(("plain", "probed"), servers, strict=True))
                for name, server in order[::-1] if i % 2 else order:
                    pa = ["-m", model, "--concurrency-range", "1", "-s", "100", "--max-trials", "3"]
                    t0 = time.monotonic_ns()
                    rec = run_pa(
                        args.pa_run,
                        env,
                        server,
                        f"{name} {model}",
                        pa,
                        args.window_ms,
                        1,
                        tmp / "pa.jsonl",
                    )
                    t1 = time.monotonic_ns()
                    rec["load"] = os.getloadavg()[0]
                    runs[model][name].append(rec)
                    if name == "probed":
                        spans[model].append((t0 + 1_000_000_000, t1))
                    roles = {
                        k: (v.get("cpu_us"), v.get("wakeups"))
                        for k, v in rec.get("roles", {}).items()
                    }
                    print(
                        f"round {i + 1} {model} {name:6s} p50 {rec.get('p50_us')} µs "
                        f"p99 {rec.get('p99_us')} cpu/inf {rec.get('cpu_us_per_infer')} "
                        f"wakes/inf {rec.get('wakeups_per_infer')} roles {roles} "
                        f"load {rec['load']:.2f}",
                        flush=True,
                    )
    finally:
        for s in servers:
            s.stop()
    all_stamps, _roles = load_stamps(stamps)
    report: dict[str, Any] = {"commit": args.commit or "working tree", "models": {}}
    for model in models:
        reqs = [r for a, b in spans[model] for r in requests(all_stamps, a, b, args.start)]
        rows = timeline(reqs) if reqs else []
        if args.anchor:
            from_anchor(reqs, rows, args.anchor)
        print_table(model, rows, len(reqs), args.anchor)
        plain, probed = runs[model]["plain"], runs[model]["probed"]
        summary = {
            "p50_us plain": _median([r.get("p50_us") for r in plain]),
            "p50_us probed": _median([r.get("p50_us") for r in probed]),
            "roles plain": _median_roles(plain),
            "load": [r["load"] for r in plain + probed],
        }
        print(json.dumps(summary))
        report["models"][model] = {"timeline": rows, "requests": len(reqs), **summary}
    timed = load_cpu(stamps)
    print("\nper call, median µs (whole run): stage, wall, thread CPU, calls")
    for k, (w, c, n) in sorted(timed.items()):
        print(f"  {k:40s} {w:8.1f} {c:8.1f} {n:8d}")
    report["timed"] = {k: {"wall_us": w, "cpu_us": c, "calls": n} for k, (w, c, n) in timed.items()}
    if args.json:
        args.json.write_text(json.dumps({"report": report, "runs": runs}, indent=1))
    if args.keep:
        shutil.copytree(stamps, args.keep, dirs_exist_ok=True)
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


def _median(values: list[Any]) -> float | None:
    """The median of the values perf_analyzer gave (None: a run without a result)."""
    got = [v for v in values if v]
    return statistics.median(got) if got else None


def _median_roles(recs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per role: the median CPU µs and wake-ups per inference over ``recs``."""
    out: dict[str, dict[str, float]] = {}
    roles = {k for r in recs for k in r.get("roles", {})}
    for role in sorted(roles):
        vals = [r["roles"][role] for r in recs if role in r.get("roles", {})]
        out[role] = {
            "cpu_us": statistics.median(v["cpu_us"] for v in vals),
            "wakeups": statistics.median(v["wakeups"] for v in vals),
        }
    return out


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
