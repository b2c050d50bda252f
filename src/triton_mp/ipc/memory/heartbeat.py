"""Heartbeats: how the supervisor tells a hung child from a busy one.

Imported by the supervisor (creates the board, judges it) and by every child (a beating
thread, started in ``supervisor.processes.child_entry`` before the role runs). It imports no numpy:
a child that does not need numpy (the scheduler) never loads it.

One shared-memory segment per server, ``/triton_mp_<server_id>_heartbeat``, holds one slot
per child::

    slot i: u64 in the machine's byte order, CLOCK_MONOTONIC nanoseconds of child i's
            last beat (0 = never beat since the slot was reset)

Only the child writes its slot (from a daemon thread, every ``interval_s``); the supervisor
resets a slot when it (re)spawns the child and otherwise only reads. CLOCK_MONOTONIC is one
clock for every process of the machine on Linux, so the values compare across processes.
Slots are naturally aligned and written with one 8-byte store (a ``memoryview`` of format
``Q``), so a read never sees half a write.

What a missing beat means: the beating thread needs the GIL for a moment every interval,
so beats stop when the process is stopped (SIGSTOP, a debugger), swapped to a standstill,
or when its main thread holds the GIL without ever releasing it (C code stuck in a call
made with the GIL held: a deadlocked extension, ``ctypes.PyDLL`` calls, a pathological
regular expression). A model that sleeps or loops in Python, or waits in C code that
released the GIL (ONNX Runtime's run, ``time.sleep``), keeps beating: it is busy, not hung,
and Triton has no execution timeout for it either; clients bound such waits with deadlines.
"""

from __future__ import annotations

import threading
import time

from triton_mp.ipc.memory.shm import Segment

SLOT_BYTES = 8
"""One u64 per child."""


class HeartbeatBoard:
    """The heartbeat segment (see the module docstring for its layout).

    Attributes:
        segment: the mapped segment.
        slots: how many children it has room for.
    """

    def __init__(self, segment: Segment) -> None:
        self.segment = segment
        self.slots = segment.size_bytes // SLOT_BYTES
        self._beats = memoryview(segment.buf)[: self.slots * SLOT_BYTES].cast("Q")

    @classmethod
    def create(cls, name: str, slots: int) -> HeartbeatBoard:
        """Create the segment with ``slots`` zeroed slots (supervisor only)."""
        return cls(Segment.create(name, max(1, slots) * SLOT_BYTES))

    @classmethod
    def attach(cls, name: str) -> HeartbeatBoard:
        """Map an existing board (children)."""
        return cls(Segment.attach(name))

    def beat(self, slot: int, now_ns: int | None = None) -> None:
        """Record that the child of ``slot`` is alive at ``now_ns`` (default: now)."""
        self._beats[slot] = time.monotonic_ns() if now_ns is None else now_ns

    def reset(self, slot: int) -> None:
        """Forget the slot's beats (the supervisor, before it (re)spawns the child)."""
        self._beats[slot] = 0

    def last_ns(self, slot: int) -> int:
        """CLOCK_MONOTONIC ns of the slot's last beat; 0 when none since the reset."""
        return int(self._beats[slot])

    def silent_for_s(self, slot: int, since_ns: int, now_ns: int | None = None) -> float:
        """Seconds since the slot's last beat, or since ``since_ns`` when it never beat
        (the moment the supervisor started judging the child)."""
        now = time.monotonic_ns() if now_ns is None else now_ns
        return (now - max(self.last_ns(slot), since_ns)) / 1e9

    def close(self) -> None:
        """Unmap (the view is released first)."""
        self._beats.release()
        self.segment.close()

    def unlink(self) -> None:
        """Remove the name (supervisor only)."""
        self.segment.unlink()


def start_beating(board_name: str, slot: int, interval_s: float) -> threading.Thread:
    """Start the daemon thread that beats ``slot`` of ``board_name`` every ``interval_s``.

    Called first thing in every child process. The thread lives as long as the process.
    """
    board = HeartbeatBoard.attach(board_name)

    def beat_forever() -> None:
        while True:
            board.beat(slot)
            time.sleep(interval_s)

    thread = threading.Thread(target=beat_forever, name="triton-mp heartbeat", daemon=True)
    thread.start()
    return thread
