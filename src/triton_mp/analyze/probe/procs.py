"""The server's processes as ``/proc`` shows them: CPU time and resident memory per role.

A triton-mp server is a tree: the supervisor and its children, each titled
``triton-mp: <role> <name>`` (``triton-mp: worker ocr_cls_0_1``). ``snapshot(root)``
reads every process of the tree once: its role and name from the title, its CPU time
(``utime + stime`` of ``/proc/<pid>/stat``, in clock ticks) and its resident memory
(``VmRSS`` of ``/proc/<pid>/status``). For a remote server, ``remote_memory`` reads the
same figures from ``triton_mp_process_resident_memory_bytes`` on ``/metrics`` instead.
Linux only; a process that exits while being read is left out.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence

import msgspec

from triton_mp.analyze.sweep.results import ProcessMemory
from triton_mp.common.process.proc_tree import children_by_parent

CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
TITLE_PREFIX = "triton-mp: "


class ProcessSample(msgspec.Struct, frozen=True, kw_only=True):
    """One process read once.

    Attributes:
        pid / ppid: ids. role / name: from the title (``other`` and the pid otherwise).
        cpu_ticks: ``utime + stime`` in clock ticks. rss_bytes: ``VmRSS``.
    """

    pid: int
    ppid: int
    role: str
    name: str
    cpu_ticks: int
    rss_bytes: int


def classify(cmdline: Sequence[str], pid: int) -> tuple[str, str]:
    """``(role, name)`` of a process from its argv (the title triton-mp sets is argv[0])."""
    title = cmdline[0] if cmdline else ""
    if title.startswith(TITLE_PREFIX):
        role, _, name = title.removeprefix(TITLE_PREFIX).partition(" ")
        return role, name.strip()
    if any("resource_tracker" in arg for arg in cmdline):
        return "resource_tracker", ""
    return "other", str(pid)


def _read(pid: int) -> tuple[int, int, list[str], int] | None:
    """``(ppid, cpu_ticks, argv, rss_bytes)`` of ``pid``, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        with open(f"/proc/{pid}/status") as f:
            status = f.read()
    except (OSError, IndexError):
        return None
    m = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
    rss = int(m.group(1)) * 1024 if m else 0
    return int(fields[1]), int(fields[11]) + int(fields[12]), argv, rss


def snapshot(root: int) -> list[ProcessSample]:
    """Every live process of the tree under ``root`` (``root`` first), read once."""
    children = children_by_parent()
    out: list[ProcessSample] = []
    todo = [root]
    while todo:
        pid = todo.pop(0)
        read = _read(pid)
        if read is None:
            continue
        ppid, ticks, argv, rss = read
        role, name = ("supervisor", "") if pid == root else classify(argv, pid)
        out.append(
            ProcessSample(pid=pid, ppid=ppid, role=role, name=name, cpu_ticks=ticks, rss_bytes=rss)
        )
        todo.extend(sorted(children.get(pid, [])))
    return out


def cpu_ms_by_role(
    before: Iterable[ProcessSample], after: Iterable[ProcessSample]
) -> dict[str, float]:
    """CPU milliseconds each role spent between two snapshots of the same tree.

    A process in ``after`` only (started in between) counts all its CPU time; one in
    ``before`` only (exited in between) counts nothing more, as its last ticks are lost.
    """
    old = {p.pid: p.cpu_ticks for p in before}
    out: dict[str, float] = {}
    for p in after:
        ticks = max(0, p.cpu_ticks - old.get(p.pid, 0))
        out[p.role] = out.get(p.role, 0.0) + ticks * 1000 / CLOCK_TICKS_PER_S
    return out


def memory(samples: Iterable[ProcessSample]) -> tuple[ProcessMemory, ...]:
    """The snapshot's resident memory per process."""
    return tuple(
        ProcessMemory(role=p.role, name=p.name, pid=p.pid, rss_bytes=p.rss_bytes) for p in samples
    )


def instances_of(
    processes: Iterable[ProcessMemory], group_names: Sequence[str]
) -> tuple[ProcessMemory, ...]:
    """The worker processes of a model's instances: triton-mp names a worker
    ``<instance_group name>_<index>``, so those whose name starts with a group's name."""
    prefixes = tuple(f"{g}_" for g in group_names)
    return tuple(
        p for p in processes if p.role == "worker" and prefixes and p.name.startswith(prefixes)
    )


_RSS_LINE = re.compile(
    r"^triton_mp_process_resident_memory_bytes\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)", re.M
)


def remote_memory(metrics_text: str) -> tuple[ProcessMemory, ...]:
    """Per-process memory from triton-mp's ``/metrics`` (pids unknown there: 0)."""
    out = []
    for m in _RSS_LINE.finditer(metrics_text):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group("labels")))
        out.append(
            ProcessMemory(
                role=labels.get("role", "other"),
                name=labels.get("instance", ""),
                pid=0,
                rss_bytes=int(float(m.group("value"))),
            )
        )
    return tuple(out)


def listening_pid(port: int) -> int | None:
    """The pid listening on TCP ``port`` on this machine, if it can be seen (psutil)."""
    import psutil

    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return None
    for c in conns:
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
            return int(c.pid)
    return None


def server_root(pid: int) -> int:
    """The supervisor of the triton-mp process ``pid`` (its parent when ``pid`` is one of
    its titled children, else ``pid`` itself: e.g. a tritonserver)."""
    read = _read(pid)
    if read is None:
        return pid
    ppid, _, argv, _ = read
    if argv and argv[0].startswith(TITLE_PREFIX) and ppid > 1:
        return ppid
    return pid
