"""Per-stage timestamps of a server's processes, for ``bench/c1_timeline.py``; off unless
``C1_PROBE_DIR`` names a directory.

Python imports ``sitecustomize`` at start-up from its path: ``c1_timeline.py`` puts this
directory on the PYTHONPATH of the one server it probes (and sets ``C1_PROBE_DIR``), so every
process of that server, and no other, wraps the methods in ``_STAGES`` with a stamp at entry
and at return. The server's own code is unchanged, and costs nothing when it is not probed.

A stamp is 16 bytes, ``<qq``: the stage's id and ``time.monotonic_ns()`` (CLOCK_MONOTONIC:
one clock for every process of the machine), written into ``<dir>/<pid>.stamps``, a file
mapped in memory (nothing is lost when the process is killed; no system call per stamp). A
record of zeros ends the file. ``<dir>/<pid>.names`` holds one line per stage id,
``id<TAB>label``, written at its first use, and a first line ``#<TAB>command line``. A
label is ``Class.method>`` (entry) or ``Class.method<`` (return); a ``Sender``'s methods add
the ring's name (``Sender.send_bytes[r_w0_f0]>``). A full file (``CAPACITY`` stamps) stops
stamping. The calls of ``_TIMED`` also leave, in ``<dir>/<pid>.cpu``, two ``<qq`` records
each: (stage id of its entry, wall ns) and (that id + ``CPU_ID``, the thread's CPU ns), so
a stage that waits (a lock, a preempted vCPU) is told from one that works.
"""

from __future__ import annotations

import os

CAPACITY = 1 << 21
"""Stamps per process file (32 MiB, allocated as written: /dev/shm or tmpfs pages)."""

_STAGES = (
    ("triton_mp.frontend.native.handoff", "Handoff", ("on_wakeup", "_reply", "_kick")),
    (
        "triton_mp.frontend.dispatch.polling_loop",
        "PollingSelector",
        ("select", "_poll", "_poll_early"),
    ),
    ("triton_mp.frontend.dispatch.direct", "DirectRoutes", ("hand",)),
    ("triton_mp.frontend.dispatch.wakes", "HeldWakes", ("send", "_end_held")),
    ("triton_mp.frontend.dispatch.inbox", "InboxHandler", ("on_wakeup",)),
    ("triton_mp.frontend.dispatch.pending", "PendingTable", ("deliver",)),
    ("triton_mp.ipc.channel", "Inbox", ("wait", "poll", "drain")),
    ("triton_mp.workers.worker", "Worker", ("run_batch", "_execute", "_post")),
    ("triton_mp.workers.prewake", "EarlyWakes", ("batch_starts",)),
    ("triton_mp.ipc.direct", "SelfOffer", ("after_batch",)),
    ("triton_mp.scheduler.main", "Router", ("flush",)),
    ("triton_mp.scheduler.core", "SchedulerCore", ("dispatch", "due_notices", "handle_all")),
)
_DEADLINES = (("triton_mp.scheduler.core", "SchedulerCore", "next_deadline_ns"),)
"""Methods returning a CLOCK_MONOTONIC deadline (ns): each new value they return is stamped
as ``Class.method=`` at that time, so the timeline shows where the deadline falls."""
_TIMED = ("Handoff._kick", "Handoff.on_wakeup", "InboxHandler.on_wakeup", "DirectRoutes.hand")
"""Stages whose calls also record their wall and thread CPU time (module docstring)."""
CPU_ID = 1_000_000
_SENDER = ("send_bytes", "push_bytes", "send_lazy", "push_quiet", "wake")


class _Probe:
    """One process's stamp file and stage ids."""

    def __init__(self, directory: str) -> None:
        self.dir = directory
        self.ids: dict[str, int] = {}
        self.mm: object = None
        self.n = 0
        self.names_fd = -1
        self.pid = -1

    def open(self) -> None:
        import mmap
        import struct

        self.pid = os.getpid()
        path = os.path.join(self.dir, f"{self.pid}.stamps")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        os.ftruncate(fd, CAPACITY * 16)
        self.mm = mmap.mmap(fd, CAPACITY * 16)
        os.close(fd)
        fd = os.open(path[: -len(".stamps")] + ".cpu", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        os.ftruncate(fd, CAPACITY * 16)
        self.cpu = mmap.mmap(fd, CAPACITY * 16)
        os.close(fd)
        self.n = self.n_cpu = 0
        self.pack = struct.Struct("<qq").pack_into
        self.names_fd = os.open(
            os.path.join(self.dir, f"{self.pid}.names"),
            os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND,
            0o600,
        )
        with open(f"/proc/{self.pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").strip()
        os.write(self.names_fd, b"#\t" + cmd + b"\n")
        for label, sid in self.ids.items():
            os.write(self.names_fd, f"{sid}\t{label}\n".encode())

    def sid(self, label: str) -> int:
        sid = self.ids.get(label)
        if sid is None:
            sid = self.ids[label] = len(self.ids) + 1
            if self.names_fd >= 0:
                os.write(self.names_fd, f"{sid}\t{label}\n".encode())
        return sid

    def after_fork(self) -> None:
        self.mm = None
        self.names_fd = -1


def _install(directory: str) -> None:
    import importlib
    import time

    probe = _Probe(directory)
    os.register_at_fork(after_in_child=probe.after_fork)
    clock = time.monotonic_ns

    def stamp(sid: int) -> None:
        if probe.mm is None:
            probe.open()
        n = probe.n
        if n < CAPACITY:
            probe.pack(probe.mm, n * 16, sid, clock())
            probe.n = n + 1

    thread_ns = time.thread_time_ns

    def wrap(cls: type, name: str, label: str) -> None:
        f = getattr(cls, name)
        s_in, s_out = probe.sid(label + ">"), probe.sid(label + "<")
        if label in _TIMED:

            def timed(*a: object, **k: object) -> object:
                stamp(s_in)
                w0, c0 = clock(), thread_ns()
                try:
                    return f(*a, **k)
                finally:
                    c1, w1 = thread_ns(), clock()
                    stamp(s_out)
                    n = probe.n_cpu
                    if n + 1 < CAPACITY:
                        probe.pack(probe.cpu, n * 16, s_in, w1 - w0)
                        probe.pack(probe.cpu, n * 16 + 16, s_in + CPU_ID, c1 - c0)
                        probe.n_cpu = n + 2

            timed.__name__ = f.__name__
            timed.__doc__ = f.__doc__
            setattr(cls, name, timed)
            return

        def stamped(*a: object, **k: object) -> object:
            stamp(s_in)
            try:
                return f(*a, **k)
            finally:
                stamp(s_out)

        stamped.__name__ = f.__name__
        stamped.__doc__ = f.__doc__
        setattr(cls, name, stamped)

    def wrap_sender(cls: type, name: str) -> None:
        f = getattr(cls, name)

        def stamped(self: object, *a: object) -> object:
            sids = getattr(self, "_c1_sids", None)
            if sids is None:
                ring = self._ring.segment.name.lstrip("/")  # type: ignore[attr-defined]
                ring = ring.split("_", 2)[-1] if ring.startswith("triton_mp") else ring
                sids = {}
                for m in _SENDER:
                    label = f"Sender.{m}[{ring}]"
                    sids[m] = (probe.sid(label + ">"), probe.sid(label + "<"))
                self._c1_sids = sids  # type: ignore[attr-defined]
            s_in, s_out = sids[name]
            stamp(s_in)
            try:
                return f(self, *a)
            finally:
                stamp(s_out)

        setattr(cls, name, stamped)

    for module, cls_name, methods in _STAGES:
        try:
            cls = getattr(importlib.import_module(module), cls_name)
        except Exception as e:  # noqa: BLE001 - a commit without the class: probe the rest
            os.write(2, f"c1_probe: {module}.{cls_name}: {e}\n".encode())
            continue
        for m in methods:
            if hasattr(cls, m):
                wrap(cls, m, f"{cls_name}.{m}")

    def wrap_deadline(cls: type, name: str) -> None:
        f = getattr(cls, name)
        sid = probe.sid(f"{cls.__name__}.{name}=")
        last = [None]

        def stamped(*a: object, **k: object) -> object:
            value = f(*a, **k)
            if value is not None and value != last[0]:
                last[0] = value
                if probe.mm is None:
                    probe.open()
                if probe.n < CAPACITY:
                    probe.pack(probe.mm, probe.n * 16, sid, value)
                    probe.n += 1
            return value

        setattr(cls, name, stamped)

    for module, cls_name, method in _DEADLINES:
        try:
            wrap_deadline(getattr(importlib.import_module(module), cls_name), method)
        except Exception as e:  # noqa: BLE001 - a commit without it: probe the rest
            os.write(2, f"c1_probe: {module}.{cls_name}.{method}: {e}\n".encode())
    from triton_mp.ipc.channel import Sender

    for m in _SENDER:
        wrap_sender(Sender, m)


if os.environ.get("C1_PROBE_DIR"):
    _install(os.environ["C1_PROBE_DIR"])
