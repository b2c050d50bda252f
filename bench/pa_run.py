#!/usr/bin/env python3
"""Run one perf_analyzer measurement and record it as a JSON line.

Usage: pa_run.py --label NAME --server-pid PID --out results.jsonl -- PERF_ANALYZER ARGS...

On this noisy 2-core machine perf_analyzer sometimes fails to get 3 windows
within 10% of each other; such a run is repeated, up to --attempts times.

Besides perf_analyzer's own numbers (throughput, p50/p99 latency, from its -f CSV)
it records how many CPU cores the client (perf_analyzer) and the server (PID and
all its descendants, e.g. Triton's python stub processes) used on average while
it ran, and how busy the whole machine was. Standard library only.

Per process role it also records CPU microseconds and voluntary context switches (wake-ups:
every thread of every process, from ``/proc/PID/task/TID/status``) per inference, sampled
every 100 ms (the tree every second) while perf_analyzer runs and taken over the steady part
of the run only (from 1 s after perf_analyzer started until the last sample before it exited),
divided by perf_analyzer's throughput. The role of a process is read from its title: ``triton-mp:
frontend ...`` -> ``frontend`` (likewise scheduler, worker; the root is ``supervisor``),
tritonserver's python stubs are ``stub``, any other process of the tree ``main``.
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
import threading
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


def role_of(pid, root):
    """The role name of one process of the server's tree (module docstring)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            title = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "main"
    if title.startswith("triton-mp: "):
        return title.split()[1]
    if "triton_python_backend_stub" in title:
        return "stub"
    return "supervisor" if pid == root and "triton_mp" in title else "main"


def tree_pids(root):
    """root and its live descendants."""
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        if pid in parent:
            found.append(pid)
            todo += [p for p, pp in parent.items() if pp == pid]
    return found


def process_counters(pid):
    """(CPU ticks, voluntary context switches of all threads) of one process, or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks = int(fields[11]) + int(fields[12])
        switches = 0
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches"):
                        switches += int(line.split()[1])
                        break
        return ticks, switches
    except (OSError, IndexError, ValueError):
        return None


class RoleSampler(threading.Thread):
    """Samples (time, {pid: (role, ticks, switches)}) of the server's tree every `period_s`."""

    def __init__(self, root, period_s=0.1):
        super().__init__(daemon=True)
        self.root, self.period_s = root, period_s
        self.samples = []
        self.roles = {}
        self.stop = threading.Event()

    def run(self):
        pids, n = [], 0
        while not self.stop.is_set():
            if n % 10 == 0:  # NOTE: walking all of /proc costs more than the samples
                pids = tree_pids(self.root)
            n += 1
            t = time.monotonic()
            snap = {}
            for pid in pids:
                c = process_counters(pid)
                if c is not None:
                    if pid not in self.roles:
                        self.roles[pid] = role_of(pid, self.root)
                    snap[pid] = c
            self.samples.append((t, snap))
            self.stop.wait(self.period_s)

    def per_role(self, t_from, t_to, throughput):
        """{role: {"cpu_us": per inference, "wakeups": per inference, "cores": ...}} over the
        samples between t_from and t_to (None when too few samples or no throughput)."""
        window = [s for s in self.samples if t_from <= s[0] <= t_to]
        if len(window) < 2 or not throughput:
            return None
        (ta, a), (tb, b) = window[0], window[-1]
        dt = tb - ta
        out = {}
        for pid, (ticks, sw) in b.items():
            t0, sw0 = a.get(pid, (ticks, sw))  # a process born in the window: from its start
            role = self.roles.get(pid, "main")
            r = out.setdefault(role, {"ticks": 0, "switches": 0, "processes": 0})
            r["ticks"] += ticks - t0
            r["switches"] += sw - sw0
            r["processes"] += 1
        inferences = throughput * dt
        return {
            role: {
                "cpu_us": round(r["ticks"] / TICK / inferences * 1e6, 1),
                "wakeups": round(r["switches"] / inferences, 2),
                "cores": round(r["ticks"] / TICK / dt, 3),
                "processes": r["processes"],
            }
            for role, r in sorted(out.items())
        }


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
    sampler = RoleSampler(a.server_pid)
    sampler.start()
    for attempt in range(1, a.attempts + 1):  # noqa: B007 - recorded after the loop
        t_run = time.monotonic()
        p = subprocess.run(full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        t_end = time.monotonic()
        if p.returncode == 0 or "stable measurement" not in p.stdout:
            break
    sampler.stop.set()
    sampler.join()
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
        roles = sampler.per_role(t_run + 1.0, t_end, rec["throughput"])
        if roles:
            rec["roles"] = roles
            rec["cpu_us_per_infer"] = round(sum(r["cpu_us"] for r in roles.values()), 1)
            rec["wakeups_per_infer"] = round(sum(r["wakeups"] for r in roles.values()), 2)
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
