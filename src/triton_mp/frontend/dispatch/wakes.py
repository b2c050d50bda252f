"""Sends to the scheduler that wake it once per batch of requests, not once per request.

Imported by ``frontend.main`` (which builds one ``HeldWakes`` over the ring to the
scheduler and hands ``send`` to ``frontend.inference``) and by ``frontend.native.handoff``
(which holds the wakes while it submits every request one wake-up of the native server
brought). Outside ``held`` a send pushes and wakes, as ``ipc.Sender.send_bytes`` does;
inside, it pushes without waking (``Sender.push_quiet``) and the one wake owed is posted
when the outermost ``held`` ends. A waiting scheduler's wake is a ``sem_post`` system call
and a pass of the scheduler: measured at add_sub_py c=16, 13 % of the frontend's event loop
thread was ``sem_post``, one per request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager


class HeldWakes:
    """One producer's sends to the scheduler, with wakes that can be held.

    Args:
        push_quiet: pushes encoded bytes without waking; False when the ring is full now
            (``Sender.push_quiet``; raises ``RecordTooLarge`` for a record that never fits).
        send_bytes: pushes and wakes, waiting for room (``Sender.send_bytes``).
        wake: wakes the scheduler (``ipc.memory.notify.Waker.wake``).
    """

    __slots__ = ("_depth", "_owed", "_push_quiet", "_send_bytes", "_wake")

    def __init__(
        self,
        push_quiet: Callable[[bytes], bool],
        send_bytes: Callable[[bytes], None],
        wake: Callable[[], None],
    ) -> None:
        self._push_quiet = push_quiet
        self._send_bytes = send_bytes
        self._wake = wake
        self._depth = 0
        self._owed = False
        """A record was pushed without its wake since the outermost ``held`` began."""

    def send(self, data: bytes) -> None:
        """Push ``data`` to the scheduler; wake it now, or when ``held`` ends.

        Raises:
            ChannelTimeout: the ring stayed full (as ``Sender.send_bytes``).
            RecordTooLarge: the record can never fit the ring.
        """
        if self._depth and self._push_quiet(data):
            self._owed = True
            return
        # NOTE: a full ring: send_bytes wakes the scheduler while it waits for room, which
        # also reads the records pushed quietly before this one.
        self._send_bytes(data)

    @contextmanager
    def held(self) -> Iterator[None]:
        """Sends inside wake the scheduler once, at the end (also when an exception ends
        it: every record pushed is read)."""
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if not self._depth and self._owed:
                self._owed = False
                self._wake()
