"""What a worker hears while its model executes: the inbox read by ``is_cancelled()``.

The worker's loop (``workers.main.serve``) reads its inbox between batches only. A python
model may run for a long time, and Triton lets it see, during ``execute``, that a client
went away (``request.is_cancelled()``, python_backend's request cancellation). So while a
batch executes, every ``is_cancelled()`` first looks at the inbox (``poll``): a
``CancelRequest`` found there is applied at once (the worker's cancelled set, which
``is_cancelled()`` then reads); every other message is kept, in order, for the loop to
handle after the batch (``take``).

Cost: ``begin`` and ``end`` set a flag (no thread, no wake-up, nothing per batch beyond an
uncontended lock in ``end``); each ``is_cancelled()`` inside a batch is one ring poll (no
syscall, nothing decoded unless a record is there). A model that never asks pays nothing,
and the cancellation is seen by the first ``is_cancelled()`` after it reached the inbox
(no polling period). An idle worker does nothing. The watch never waits on the inbox's
semaphore, so it never takes a wake-up the loop needs: a post for a record it drained does
not even end the loop's next wait (``ipc.channel.Inbox.wait`` returns only when a ring
holds a record), and the loop takes what the watch kept before it waits. Only one thread
reads the rings at a time: ``poll`` (any thread of the model, under the lock) only while
the loop is inside a batch (``begin`` .. ``end``), the loop only outside one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

T = TypeVar("T")


class Drainable(Protocol[T]):
    """The part of ``ipc.channel.Inbox`` the watch uses."""

    def has_pending(self) -> bool: ...
    def drain(self) -> list[T]: ...


class ExecutionWatch(Generic[T]):
    """The inbox read on a model's ``is_cancelled()`` while a batch executes (see the
    module docstring).

    Args:
        inbox: the worker's inbox.
        apply_now: called (on the thread that polls) with each message drained during a
            batch; returns True when it handled it, False to keep it for the loop.
    """

    def __init__(self, inbox: Drainable[T], apply_now: Callable[[T], bool]) -> None:
        self._inbox = inbox
        self._apply_now = apply_now
        self._lock = threading.Lock()
        self._active = False
        self._kept: list[T] = []

    def begin(self) -> None:
        """A batch starts executing (the loop's thread): ``poll`` may read the inbox until
        ``end``. A plain store: the loop is not reading the rings from here on."""
        self._active = True

    def end(self) -> None:
        """The batch finished: the inbox is the loop's again (once no ``poll`` is inside)."""
        with self._lock:
            self._active = False

    def take(self, pending: bool = False) -> list[T]:
        """The messages kept during batches (in arrival order), then what is pending (the
        loop's thread, between batches). ``pending``: the caller has just seen a record in
        the inbox (its wait returned), so it is not looked for first."""
        kept = self._kept
        if not kept:
            # NOTE: no lock needed: outside a batch nothing appends to _kept or reads the
            # rings (``poll`` acts only while active, and ``end`` cleared that under the lock).
            return self._inbox.drain() if pending or self._inbox.has_pending() else []
        with self._lock:
            kept, self._kept = self._kept, []
            return kept + self._inbox.drain()

    def poll(self) -> None:
        """One look at the inbox if a batch is executing (``is_cancelled()``; any thread)."""
        if not self._active:
            return
        with self._lock:
            if not self._active or not self._inbox.has_pending():
                return
            for msg in self._inbox.drain():
                if not self._apply_now(msg):
                    self._kept.append(msg)
