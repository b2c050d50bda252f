"""Linux's process tree as ``/proc`` shows it: who is whose child.

Imported by ``supervisor.processes.start_signal`` (the children a signal before serving
must kill, tracked or not) and ``analyze.probe.procs`` (a server's process tree).
"""

from __future__ import annotations

import os


def children_by_parent() -> dict[int, list[int]]:
    """Parent PID -> PIDs of every process on the machine, from each ``/proc/<pid>/stat``
    (field 4, after the command in parentheses, which may itself hold spaces and ')');
    {} where there is no ``/proc``. A process that exits meanwhile is left out."""
    out: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        out.setdefault(ppid, []).append(int(entry))
    return out


def direct_children(parent: int) -> list[int]:
    """The PIDs whose parent is ``parent`` ([] where there is no ``/proc``)."""
    return children_by_parent().get(parent, [])
