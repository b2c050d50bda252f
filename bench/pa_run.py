#!/usr/bin/env python3
"""Run one perf_analyzer measurement and record it as a JSON line.

Usage: pa_run.py --label NAME --server-pid PID --out results.jsonl -- PERF_ANALYZER ARGS...

On this noisy 2-core machine perf_analyzer sometimes fails to get 3 windows
within 10% of each other; such a run is repeated, up to --attempts times.

Besides perf_analyzer's own numbers (throughput, p50/p99 latency, from its -f CSV)
it records how many CPU cores the client (perf_analyzer) and the server (PID and
all its descendants, e.g. Triton's python stub processes) used on average while
it ran, and how busy the whole machine was. Standard library only.
"""

import argparse
import csv
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time

TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(root):
    """user+system CPU seconds of process `root` and all its live descendants."""
    stats = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                stats[int(d)] = (
                    int(fields[1]),
                    int(fields[11]) + int(fields[12]),
                )  # ppid, utime+stime
            except (OSError, IndexError):
                pass
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            total += stats[pid][1]
            todo += [p for p, (pp, _) in stats.items() if pp == pid]
    return total / TICK


def machine_busy_seconds():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]
    return (sum(v[:8]) - idle) / TICK


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--label", required=True)
    ap.add_argument("--server-pid", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--attempts", type=int, default=3)
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    csv_path = tempfile.mktemp(suffix=".csv")
    full = cmd + ["-f", csv_path]

    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    s0, m0, t0 = tree_cpu_seconds(a.server_pid), machine_busy_seconds(), time.monotonic()
    for attempt in range(1, a.attempts + 1):  # noqa: B007 - recorded after the loop
        p = subprocess.run(full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if p.returncode == 0 or "stable measurement" not in p.stdout:
            break
    wall = time.monotonic() - t0
    s1, m1 = tree_cpu_seconds(a.server_pid), machine_busy_seconds()
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    client = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)

    rec = {
        "label": a.label,
        "cmd": " ".join(cmd),
        "rc": p.returncode,
        "attempts": attempt,
        "wall_s": round(wall, 1),
        "client_cores": round(client / wall, 2),
        "server_cores": round((s1 - s0) / wall, 2),
        "machine_cores_busy": round((m1 - m0) / wall, 2),
    }
    if p.returncode == 0 and os.path.exists(csv_path):
        with open(csv_path) as f:
            row = list(csv.DictReader(f))[-1]
        rec.update(
            throughput=float(row["Inferences/Second"]),
            p50_us=int(row["p50 latency"]),
            p99_us=int(row["p99 latency"]),
        )
        # Server-side batching: inferences per model execution, from the text report.
        counts = re.findall(r"Inference count: (\d+)\s+Execution count: (\d+)", p.stdout)
        if counts and int(counts[-1][1]):
            rec["avg_batch"] = round(int(counts[-1][0]) / int(counts[-1][1]), 2)
        if "Server Queue" in row:  # only when the server reports statistics
            rec.update(
                server_queue_us=int(row["Server Queue"]),
                server_compute_us=sum(
                    int(row[k])
                    for k in (
                        "Server Compute Input",
                        "Server Compute Infer",
                        "Server Compute Output",
                    )
                ),
            )
        os.unlink(csv_path)
    else:
        rec["error"] = p.stdout.strip()[-400:]
    with open(a.out, "a") as f:
        f.write(json.dumps(rec) + "\n")
    print(json.dumps(rec))
    return 0 if p.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
