"""The machine and its processes, as the benchmarks observe them through /proc and /dev/shm.

- ``machine_busy_seconds`` / ``tree_cpu_seconds``: CPU seconds (as pa_run.py counts them).
- ``descendants`` / ``alive`` / ``kill_tree_leftovers``: process trees, by PID and start time
  (the start time guards against PID reuse).
- ``shm_names`` / ``shm_in_use``: /dev/shm entries a server owns or still maps.
- ``free_ports``: ports for a server to listen on.
- ``main_thread_ns`` / ``sleep_shares``: how a process's main thread spent a stretch of wall
  time (on a CPU, runnable but waiting for one, asleep), from /proc/PID/schedstat.

Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from typing import Any

TICK = os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> float:
    """Non-idle CPU seconds of the whole machine since boot (as pa_run.py counts them)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v[:8]) - v[3] - v[4]) / TICK


def proc_table() -> dict[int, tuple[int, int, int]]:
    """pid -> (ppid, start time in ticks, utime+stime in ticks) for every live process."""
    table = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                table[int(d)] = (int(fields[1]), int(fields[19]), int(fields[11]) + int(fields[12]))
            except (OSError, IndexError, ValueError):
                pass
    return table


def descendants(root: int) -> list[tuple[int, int]]:
    """(pid, start time) of every live descendant of root; the start time guards PID reuse."""
    table = proc_table()
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        kids = [p for p, (pp, _, _) in table.items() if pp == pid]
        found += [(p, table[p][1]) for p in kids]
        todo += kids
    return found


def tree_cpu_seconds(root: int) -> float:
    """user+system CPU seconds of root and its live descendants (as pa_run.py counts them)."""
    table = proc_table()
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        if pid in table:
            total += table[pid][2]
            todo += [p for p, (pp, _, _) in table.items() if pp == pid]
    return total / TICK


def start_ticks(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def alive(pid: int, start: int) -> bool:
    """pid still runs and is the process that started at `start` (not a reused PID)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return int(fields[19]) == start and fields[0] != "Z"


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def main_thread_ns(pids: list[int]) -> dict[int, tuple[int, int]]:
    """pid -> (ns on a CPU, ns runnable but waiting for one) of the process's main thread so
    far (``/proc/PID/schedstat``, kept per thread); processes gone or unreadable are left
    out."""
    out = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/schedstat") as f:
                run, wait, _ = f.read().split()
        except (OSError, ValueError):
            continue
        out[pid] = (int(run), int(wait))
    return out


def sleep_shares(
    before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]], seconds: float
) -> dict[int, dict[str, float]]:
    """pid -> shares of ``seconds`` of wall time between two ``main_thread_ns`` readings:
    ``run`` (on a CPU), ``runqueue`` (runnable, waiting for a CPU), ``sleep`` (the rest). A
    triton-mp worker's main thread runs every batch, so its sleep is time spent waiting for
    a batch."""
    out = {}
    for pid in before.keys() & after.keys():
        run, wait = ((after[pid][k] - before[pid][k]) / 1e9 / seconds for k in (0, 1))
        out[pid] = {
            "run": round(run, 3),
            "runqueue": round(wait, 3),
            "sleep": round(max(0.0, 1.0 - run - wait), 3),
        }
    return out


def shm_names(marker: str) -> set[str]:
    """/dev/shm entries whose name contains `marker` (segments, and sem.* semaphores)."""
    try:
        return {n for n in os.listdir("/dev/shm") if marker in n}
    except FileNotFoundError:
        return set()


def shm_in_use(pids: list[int], marker: str) -> set[str]:
    """Names under /dev/shm containing `marker` that these processes map or hold open."""
    used = set()
    for pid in pids:
        paths = []
        try:
            with open(f"/proc/{pid}/maps") as f:
                paths += [ln.split(None, 5)[-1].strip() for ln in f if "/dev/shm/" in ln]
        except OSError:
            pass
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    paths.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass
        for p in paths:
            if p.startswith("/dev/shm/"):
                name = p[len("/dev/shm/") :].split(" ")[0]
                if marker in name:
                    used.add(name)
    return used


def free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def kill_tree_leftovers(tree: list[tuple[int, int]], grace: float) -> list[dict[str, Any]]:
    """Wait up to `grace` s for these processes to end; SIGKILL (by PID) and report the rest."""
    end = time.monotonic() + grace
    left = [(p, s) for p, s in tree if alive(p, s)]
    while left and time.monotonic() < end:
        time.sleep(0.1)
        left = [(p, s) for p, s in left if alive(p, s)]
    report = []
    for pid, start in left:
        report.append({"pid": pid, "cmdline": cmdline(pid)})
        try:
            if alive(pid, start):
                os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return report
