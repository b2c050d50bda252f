"""A frontend-to-scheduler channel for process-free tests: a shared-memory ring and its
semaphore wakeup (``ipc.memory.ring``, ``ipc.memory.notify``), both unlinked at the end."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from triton_mp.ipc.memory.notify import Wakeup, create_wakeup
from triton_mp.ipc.memory.ring import Ring
from triton_mp.ipc.memory.shm import unlink_quietly


@contextmanager
def ring_channel(tag: str, ring_bytes: int) -> Iterator[tuple[str, Wakeup]]:
    """A new ring of ``ring_bytes`` and a semaphore wakeup, named after this process and
    ``tag``; yields (the ring's name, the wakeup)."""
    base = f"/triton_mp_{os.getpid()}_test_{tag}"
    Ring.create(base + "_r", ring_bytes).close()
    wakeup = create_wakeup("semaphore", base + "_sem")
    try:
        yield base + "_r", wakeup
    finally:
        unlink_quietly(base + "_r")
        unlink_quietly(base + "_sem")
