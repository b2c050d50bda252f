"""What a worker hears while its model executes: the inbox watched from a second thread.

The worker's loop (``workers.main.serve``) reads its inbox between batches only. A python
model may run for a long time, and Triton lets it see, during ``execute``, that a client
went away (``request.is_cancelled()``, python_backend's request cancellation). So while a
batch executes, ``ExecutionWatch`` polls the inbox from a thread of its own: a
``CancelRequest`` is applied at once (the worker's cancelled set, which the model's
``is_cancelled()`` reads); every other message is kept, in order, for the loop to handle
after the batch (``take``).

Cost: nothing between batches (the thread sleeps on a condition), one condition notify
per batch, and during a batch one ring poll (no syscall, nothing decoded) every
``POLL_S`` once it has run for ``POLL_S``. The thread never waits on the inbox's
semaphore, so it never takes a wake-up the loop needs: a post for a record it drained
does not even end the loop's next wait (``ipc.channel.Inbox.wait`` returns only when a
ring holds a record), and the loop takes what the watch kept before it waits. Only one thread reads
the rings at a time: the watch only while the loop is inside a batch (``begin`` ..
``end``), the loop only outside one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

T = TypeVar("T")

POLL_S = 0.002
"""Seconds between two polls of the inbox while a batch executes (and before the first):
the latency of a cancellation reaching a running model, at 500 polls a second."""


class Drainable(Protocol[T]):  # type: ignore[misc]
    """The part of ``ipc.channel.Inbox`` the watch uses."""

    def has_pending(self) -> bool: ...
    def drain(self) -> list[T]: ...


class ExecutionWatch(Generic[T]):
    """Polls an inbox while a batch executes (see the module docstring).

    Args:
        inbox: the worker's inbox.
        apply_now: called (on the watch thread) with each message drained during a batch;
            returns True when it handled it, False to keep it for the loop.
        poll_s: seconds between polls.
    """

    def __init__(
        self, inbox: Drainable[T], apply_now: Callable[[T], bool], poll_s: float = POLL_S
    ) -> None:
        self._inbox = inbox
        self._apply_now = apply_now
        self._poll_s = poll_s
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._active = False
        self._stopped = False
        self._kept: list[T] = []
        self._thread: threading.Thread | None = None

    def begin(self) -> None:
        """A batch starts executing: the watch may read the inbox until ``end``."""
        with self._lock:
            self._active = True
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="execution-watch", daemon=True
                )
                self._thread.start()
            self._wake.notify()

    def end(self) -> None:
        """The batch finished: the inbox is the loop's again."""
        with self._lock:
            self._active = False

    def take(self) -> list[T]:
        """The messages kept during batches (in arrival order), then what is pending."""
        with self._lock:
            kept, self._kept = self._kept, []
            return kept + self._inbox.drain() if kept else self._inbox.drain()

    def stop(self) -> None:
        """End the thread (the worker is stopping)."""
        with self._lock:
            self._stopped = True
            self._wake.notify()

    def poll(self) -> None:
        """One look at the inbox if a batch is executing (the thread's step; tests)."""
        with self._lock:
            if not self._active or not self._inbox.has_pending():
                return
            for msg in self._inbox.drain():
                if not self._apply_now(msg):
                    self._kept.append(msg)

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._active and not self._stopped:
                    self._wake.wait()
                if self._stopped:
                    return
            time.sleep(self._poll_s)
            self.poll()
