"""bench_vs_triton.py's pinned ocr_cls sides: the server and raw onnxruntime on core 0 alone,
perf_analyzer on core 1 (issue 33's ocr_cls goal measured as the server's, not its client's).

On the 2-core workloads perf_analyzer shares the cores with the server: at 0.8x raw
onnxruntime's best it alone takes 70-140 µs of the ~620 µs per image the two cores give, so
0.8x leaves the workers less than raw onnxruntime itself spends (``vs_triton_ort.goal_budget``).
Here the server (supervisor, frontends, scheduler, workers: every thread inherits the pin from
the process started pinned) and the raw onnxruntime it is compared with get the same one core;
the client and its sampler get the other.

- ``SERVER_CPUS`` / ``CLIENT_CPUS`` / ``PINNED_SIDES``: which side runs where.
- ``pinned``: the calling thread's affinity for a ``with`` block (what it forks inherits).
- ``tree_affinities`` / ``off_pin``: every thread of a server's tree and its CPUs; those
  outside the pin.
- ``cpu_ticks`` / ``core_shares``: per-CPU busy / idle / steal shares from /proc/stat.
- ``pinned_lines``: the printed summary of a pinned workload (ratio, core shares, CPU per
  image per role, what the goal leaves the workers on the one core).

Standard library only at import time.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from common import fmt, med
from procs import descendants

SERVER_CPUS = frozenset({0})
"""The core the pinned server and the pinned raw onnxruntime run on."""
CLIENT_CPUS = frozenset({1})
"""The core perf_analyzer (and pa_run.py's sampler) runs on against a pinned server."""
PINNED_SERVER = "triton-mp core0"
PINNED_ORT = "onnxruntime core0"
PINNED_SIDES = {PINNED_SERVER: SERVER_CPUS, PINNED_ORT: SERVER_CPUS}
"""Side -> the CPUs it is pinned to."""
PINNED_ORT_CONFIGS: tuple[tuple[int, int | None], ...] = ((1, 1),)
"""Raw onnxruntime on one core: one session with one intra-op thread. ORT's default pool
(``None``) would pin its own threads to every core of the machine (its auto affinity), out of
the measurement's core; two sessions on one core only take turns."""


def autogroup_nice(pid: int, proc: Path = Path("/proc")) -> int | None:
    """The nice value of ``pid``'s scheduler autogroup (``/proc/PID/autogroup``: ``/autogroup-N
    nice V``), or None without autogroups. With ``kernel.sched_autogroup_enabled`` the
    scheduler shares a CPU between sessions first and a thread's own nice value weighs only
    within its session: a nice value for the pinned sides needs its session's too."""
    try:
        return int((proc / str(pid) / "autogroup").read_text().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def set_autogroup_nice(pid: int, nice: int, proc: Path = Path("/proc")) -> bool:
    """Sets ``pid``'s autogroup (its whole session) to ``nice``; False without autogroups."""
    if autogroup_nice(pid, proc) is None:
        return False
    (proc / str(pid) / "autogroup").write_text(str(nice))
    return True


@contextlib.contextmanager
def pinned(cpus: frozenset[int], nice: int | None = None) -> Iterator[None]:
    """Runs the ``with`` block with the calling thread on ``cpus`` (and at ``nice``, when not
    None: the thread's and this session's autogroup's, ``autogroup_nice``) and restores them
    after. Linux's ``sched_setaffinity(0, ...)`` and ``setpriority(PRIO_PROCESS, 0, ...)`` set
    the calling thread's mask and nice value only; a process or thread started inside the
    block inherits them (and keeps them after it; one that starts a session of its own gets an
    autogroup at nice 0: ``set_autogroup_nice`` it). A nice value below the current one needs
    privilege (``PermissionError``), and so does the way back from a higher one."""
    before = os.sched_getaffinity(0)
    nice_before = os.getpriority(os.PRIO_PROCESS, 0)
    group_before = autogroup_nice(os.getpid())
    os.sched_setaffinity(0, cpus)
    try:
        if nice is not None:
            os.setpriority(os.PRIO_PROCESS, 0, nice)
            set_autogroup_nice(os.getpid(), nice)
        yield
    finally:
        if group_before is not None and nice is not None:
            set_autogroup_nice(os.getpid(), group_before)
        os.setpriority(os.PRIO_PROCESS, 0, nice_before)
        os.sched_setaffinity(0, before)


def parse_cpu_list(text: str) -> frozenset[int]:
    """``Cpus_allowed_list``'s form (``0``, ``0-1,3``) as the set of CPU ids."""
    out: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return frozenset(out)


def thread_affinities(root: int, proc: Path = Path("/proc")) -> dict[tuple[int, int], Any]:
    """(pid, tid) -> (process title, CPUs the thread may run on) for every thread of ``root``
    and its live descendants (``/proc/PID/task/TID/status``'s ``Cpus_allowed_list``); threads
    that ended meanwhile are left out."""
    out: dict[tuple[int, int], Any] = {}
    for pid in [root, *(p for p, _ in descendants(root))]:
        try:
            title = (proc / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            tids = os.listdir(proc / str(pid) / "task")
        except OSError:
            continue
        for tid in tids:
            try:
                status = (proc / str(pid) / "task" / tid / "status").read_text()
            except OSError:
                continue
            for line in status.splitlines():
                if line.startswith("Cpus_allowed_list:"):
                    out[(pid, int(tid))] = (title.strip()[:60], parse_cpu_list(line.split(":")[1]))
    return out


def off_pin(affinities: dict[tuple[int, int], Any], cpus: frozenset[int]) -> list[str]:
    """One line per thread of ``thread_affinities`` that may run outside ``cpus``; an empty
    tree is one line too (nothing was checked)."""
    if not affinities:
        return ["no thread found"]
    return [
        f"pid {pid} tid {tid} ({title}): cpus {sorted(allowed)}"
        for (pid, tid), (title, allowed) in sorted(affinities.items())
        if not allowed <= cpus
    ]


def cpu_ticks(stat: Path = Path("/proc/stat")) -> dict[int, tuple[int, int, int]]:
    """CPU id -> (busy, idle, steal) clock ticks since boot: busy is user + nice + system +
    irq + softirq, idle is idle + iowait, steal the hypervisor's (neither ours nor idle)."""
    out = {}
    for line in stat.read_text().splitlines():
        name, *vals = line.split()
        if not name.startswith("cpu") or name == "cpu":
            continue
        v = [int(x) for x in vals[:8]]
        out[int(name[3:])] = (v[0] + v[1] + v[2] + v[5] + v[6], v[3] + v[4], v[7])
    return out


def core_shares(
    before: dict[int, tuple[int, int, int]], after: dict[int, tuple[int, int, int]]
) -> dict[str, dict[str, float]]:
    """Per CPU (its id as a string, as JSON keeps it), the busy / idle / steal shares of the
    ticks between two ``cpu_ticks`` readings (they sum to 1)."""
    out = {}
    for cpu in sorted(set(before) & set(after)):
        d = [a - b for a, b in zip(after[cpu], before[cpu], strict=True)]
        total = sum(d)
        if total > 0:
            out[str(cpu)] = {
                k: round(x / total, 3) for k, x in zip(("busy", "idle", "steal"), d, strict=True)
            }
    return out


def core_split(rec: dict[str, Any], ort: bool = False) -> dict[str, float | None]:
    """One pinned record's cores: the server core's busy share less the server tree's (or, for
    raw onnxruntime, this process's ``own_cores``) = background there, its idle share; the client
    core's busy share less perf_analyzer's = background there."""
    cores = rec.get("core_shares") or {}
    srv = cores.get(str(min(SERVER_CPUS)), {})
    cli = cores.get(str(min(CLIENT_CPUS)), {})
    own = rec.get("own_cores" if ort else "server_cores")
    out: dict[str, float | None] = {
        "server_core_idle": srv.get("idle"),
        "server_core_background": None,
        "client_core_background": None,
        "client_core_busy": cli.get("busy"),
    }
    if srv.get("busy") is not None and own is not None:
        out["server_core_background"] = round(max(0.0, srv["busy"] - own), 3)
    if cli.get("busy") is not None and rec.get("client_cores") is not None:
        out["client_core_background"] = round(max(0.0, cli["busy"] - rec["client_cores"]), 3)
    return out


def pinned_rounds(by_round: dict[int, dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per round of a pinned workload: the server's images/s, raw onnxruntime's, perf_analyzer's
    cores, the server's average batch and ``core_split`` of both records (the raw one's
    server-core background as ``ort_core_background``); ``cpu_ratio``, raw onnxruntime's CPU
    µs per image over the server tree's, is the throughput ratio the two would reach with the
    core theirs alone (no background, no idle): the figure that other helpers' load on the
    shared core does not move as much as images/s."""
    out = []
    for i in sorted(by_round):
        srv, ort = by_round[i].get(PINNED_SERVER, {}), by_round[i].get(PINNED_ORT, {})
        row: dict[str, Any] = {
            "round": i,
            "throughput": srv.get("throughput"),
            "ort": ort.get("throughput"),
            "client_cores": srv.get("client_cores"),
            "avg_batch": srv.get("avg_batch"),
            **core_split(srv),
            "ort_core_background": core_split(ort, ort=True)["server_core_background"],
            "cpu_ratio": None,
        }
        if srv.get("cpu_us_per_infer") and ort.get("cpu_us_per_infer"):
            row["cpu_ratio"] = round(ort["cpu_us_per_infer"] / srv["cpu_us_per_infer"], 3)
        out.append(row)
    return out


def pinned_lines(row: dict[str, Any], goal: float, nice: int | None = None) -> list[str]:
    """The printed summary of one pinned workload's row (``vs_triton_report.summarise``): per
    round the ratio, images/s of both, core 0's idle share and background, core 1's
    perf_analyzer and background; the medians of the server's CPU per image per role and
    perf_analyzer's; the goal's budget on the one core."""
    lines = []
    v = row["vs"].get(f"{PINNED_SERVER}/{PINNED_ORT}") or {}
    srv, ort = row.get(PINNED_SERVER) or {}, row.get(PINNED_ORT) or {}
    lines.append(
        f"{row['label']}: server on cpu {sorted(SERVER_CPUS)}, perf_analyzer on cpu "
        f"{sorted(CLIENT_CPUS)}"
        + ("" if nice is None else f", all at nice {nice}")
        + f": {fmt(srv.get('throughput'), '.0f')} img/s = "
        f"{fmt(v.get('ratio'), '.2f')}x raw onnxruntime's best on cpu {sorted(SERVER_CPUS)} "
        f"({fmt(row.get('pinned_ort_best'), '.0f')} img/s; per round {v.get('ratios')}; goal "
        f"{goal}x); raw ORT's CPU per image over the server's: "
        f"{fmt(med([r.get('cpu_ratio') for r in row.get('pinned_rounds', [])]), '.2f')}x "
        f"(per round {[r.get('cpu_ratio') for r in row.get('pinned_rounds', [])]}: the ratio "
        "with the core the server's alone)"
    )
    for r in row.get("pinned_rounds", []):
        lines.append(
            f"  round {r['round']}: {fmt(r.get('throughput'), '.0f')} img/s, raw ORT "
            f"{fmt(r.get('ort'), '.0f')}; core {min(SERVER_CPUS)} idle "
            f"{fmt(r.get('server_core_idle'), '.3f')}, background "
            f"{fmt(r.get('server_core_background'), '.2f')} (during raw ORT "
            f"{fmt(r.get('ort_core_background'), '.2f')}); core {min(CLIENT_CPUS)} busy "
            f"{fmt(r.get('client_core_busy'), '.2f')}: perf_analyzer "
            f"{fmt(r.get('client_cores'), '.2f')}, background "
            f"{fmt(r.get('client_core_background'), '.2f')}; avg batch "
            f"{fmt(r.get('avg_batch'), '.1f')}"
        )
    roles = srv.get("roles") or {}
    per_role = " / ".join(
        f"{k} {fmt((roles.get(k) or {}).get('cpu_us'), '.0f')}"
        for k in ("frontend", "scheduler", "worker", "supervisor")
    )
    pa = med(
        [
            r["client_cores"] * 1e6 / r["throughput"]
            for r in row.get("pinned_rounds", [])
            if r.get("client_cores") is not None and r.get("throughput")
        ]
    )
    lines.append(
        f"  CPU us per image on core {min(SERVER_CPUS)}: {per_role} (whole tree "
        f"{fmt(srv.get('cpu_us'), '.0f')}); raw ORT {fmt(ort.get('cpu_us'), '.0f')}; "
        f"perf_analyzer on core {min(CLIENT_CPUS)}: {fmt(pa, '.0f')}"
    )
    return lines
