"""The frontend's event loop: it polls the inbox rings between events and asks for a FIFO
wake-up only before it blocks.

Imported by ``frontend.main``. ``PollingSelector`` is the loop's epoll selector with one
change in ``select``: before every wait it checks whether an inbox ring holds a record
(``Inbox.has_pending``: two loads per ring, no syscall). When one does, the wait does not
block and the inbox FIFO is reported readable, so the loop runs the inbox's reader callback
in this very iteration. Only when the loop is about to block (nothing ready, nothing in the
rings) does it arm the FIFO (``ipc.memory.notify.Waiter.arm``), recheck the rings, and wait; after
the wait it disarms. While the frontend is busy, workers and the scheduler therefore answer
it without a syscall and without waking it; one wake-up serves a whole burst of answers.

``at_pass_end(callback)``: the callback runs at the start of every ``select``, that is once
the loop ran every callback of its last pass and before it polls or waits again (the
native handoff's kick, ``native.handoff.Handoff``: the answers of a pass leave together,
without a pass of their own).
"""

from __future__ import annotations

import logging
import selectors
from collections.abc import Callable
from typing import Any

from triton_mp.ipc import Inbox

log = logging.getLogger(__name__)

_READ = selectors.EVENT_READ


class PollingSelector(selectors.EpollSelector):
    """An ``EpollSelector`` that polls ``inbox`` before each wait (module docstring).

    ``watch(inbox)`` names the inbox once its FIFO is registered with the loop
    (``loop.add_reader``); until then it is a plain epoll selector.
    """

    def __init__(self) -> None:
        super().__init__()
        self._inbox: Inbox[Any] | None = None
        self._fd = -1
        self._pass_end: list[Callable[[], None]] = []

    def at_pass_end(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` at the start of every ``select`` (module docstring)."""
        self._pass_end.append(callback)

    def _end_pass(self) -> None:
        for callback in self._pass_end:
            try:
                callback()
            except Exception:  # noqa: BLE001 - as the loop's handler of a callback's error
                log.exception("pass-end callback failed")

    def watch(self, inbox: Inbox[Any] | None) -> None:
        """Poll ``inbox`` (its FIFO registered already), or stop polling (None)."""
        self._inbox = inbox
        self._fd = -1 if inbox is None else inbox.waiter.fileno()

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        """``EpollSelector.select``, with the inbox's FIFO reported readable whenever its
        rings hold records, and the FIFO armed only around a blocking wait."""
        if self._pass_end:
            self._end_pass()
        inbox = self._inbox
        if inbox is None:
            return super().select(timeout)
        waiter = inbox.waiter
        ready = inbox.has_pending()
        blocking = not ready and (timeout is None or timeout > 0)
        if blocking:
            waiter.arm()
            if inbox.has_pending():  # published before the arm: nobody will announce it
                ready, blocking = True, False
        events = super().select(timeout if blocking else 0)
        if blocking:
            waiter.disarm()
        fifo = self._fd
        woken = False
        for key, _mask in events:
            if key.fd == fifo:
                woken = True
                break
        if woken:
            waiter.clear()
        elif ready or (blocking and inbox.has_pending()):
            key = self.get_map().get(fifo)
            if key is not None:
                events.append((key, _READ))
        return events
