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

A worker about to answer wakes the frontend early (``workers.prewake``): when the loop
blocked and a FIFO byte woke it with no record in the rings while answers are outstanding,
an answer is on its way, and the selector polls the rings and its descriptors (yielding the
CPU between polls) for up to ``PREWAKE_POLL_S`` instead of returning to block again. The
answer then finds the loop running: the vCPU's wake-up (tens of µs on this VM, measured in
``bench/wake_cost.py``) overlapped the worker's ``execute``. The poll only follows such a
wake, and ends after ``PREWAKE_POLL_S``, or as soon as a yield between two polls let
another task run (the vCPU is wanted: a busy machine): an idle frontend never polls.

After a pass that delivered answers, the loop polls for up to ``linger.LINGER_S`` before
it blocks, while that pays (``frontend.dispatch.linger``): a client's next request then
finds it running. With answers outstanding, it polls for up to ``linger.DUE_POLL_S`` while
answers have been coming that soon and such lingers pay (``linger.AnswerDue``: a request
handed straight to an idle worker, whose answer comes an ``execute`` later, while the early
wake came too soon). A client that pauses between requests (its requests find the pipeline
asleep anyway) makes neither poll: its requests cost no more CPU than before.

``at_pass_end(callback)``: the callback runs at the start of every ``select``, that is once
the loop ran every callback of its last pass and before it polls or waits again (the
native handoff's kick, ``native.handoff.Handoff``: the answers of a pass leave together,
without a pass of their own).
"""

from __future__ import annotations

import logging
import os
import selectors
import time
from collections.abc import Callable
from typing import Protocol

from triton_mp.frontend.dispatch.linger import AnswerDue, Linger

log = logging.getLogger(__name__)

_READ = selectors.EVENT_READ

BUSY_YIELD_S = 15e-6
"""A ``sched_yield`` that took longer ran another task: a poll stops there (``_displaced``).
Alone on its vCPU one takes ~1 µs."""

PREWAKE_POLL_S = 300e-6
"""How long the loop polls after an early wake (module docstring): a worker sends it when
its recent batches took under ``workers.prewake.PREWAKE_MAX_NS`` from start to answers, so
the answer is due well within this."""


class WatchedWaiter(Protocol):
    """A watched inbox's wake-up (``ipc.memory.notify.Waiter``'s FIFO side, or the native
    answer thread's eventfd, ``frontend.native.answer_thread.QueueWaiter``)."""

    def fileno(self) -> int: ...
    def arm(self) -> None: ...
    def disarm(self) -> bool: ...
    def clear(self) -> None: ...


class Watched(Protocol):
    """What the selector polls: the inbox (``ipc.channel.Inbox``), or the native answer
    thread's queue of the records it did not serve (``frontend.native.answer_thread``)."""

    @property
    def waiter(self) -> WatchedWaiter: ...
    def has_pending(self) -> bool: ...


def _displaced(clock: Callable[[], float]) -> bool:
    """Yield the CPU between two polls; True when another task ran meanwhile (the yield
    took over ``BUSY_YIELD_S``): the vCPU is wanted, and the poll stops, since a poll pays
    only on a vCPU that would otherwise sit idle (``bench/wake_cost.py``: under load,
    polling had the worse p90)."""
    t = clock()
    os.sched_yield()
    return clock() - t > BUSY_YIELD_S


class PollingSelector(selectors.EpollSelector):
    """An ``EpollSelector`` that polls ``inbox`` before each wait (module docstring).

    ``watch(inbox, outstanding)`` names the inbox once its FIFO is registered with the loop
    (``loop.add_reader``); until then it is a plain epoll selector. ``outstanding()`` is
    the number of requests and queries waiting for an answer (``len(PendingTable)``).
    """

    def __init__(self) -> None:
        super().__init__()
        self._inbox: Watched | None = None
        self._fd = -1
        self._pass_end: list[Callable[[], None]] = []
        self._outstanding: Callable[[], int] = lambda: 0
        self.early_polls = 0
        """Early wakes that made the loop poll (tests and debugging)."""
        self.linger = Linger()
        """Whether to poll after answers (``frontend.dispatch.linger``)."""
        self.lingers = 0
        """Polls after answers before blocking (``frontend.dispatch.linger``)."""
        self.due = AnswerDue()
        """Whether to poll for an awaited answer (``linger.AnswerDue``)."""
        self.due_polls = 0
        """Polls for an awaited answer before blocking (``linger.AnswerDue``)."""
        self._awaited = False
        """The last ``_select_inbox`` would have blocked with answers outstanding."""
        self._after_early = False
        """The last ``select`` polled after an early wake (``_poll_early``)."""

    def at_pass_end(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` at the start of every ``select`` (module docstring)."""
        self._pass_end.append(callback)

    def _end_pass(self) -> None:
        for callback in self._pass_end:
            try:
                callback()
            except Exception:  # noqa: BLE001 - as the loop's handler of a callback's error
                log.exception("pass-end callback failed")

    def watch(self, inbox: Watched | None, outstanding: Callable[[], int] | None = None) -> None:
        """Poll ``inbox`` (its FIFO registered already), or stop polling (None);
        ``outstanding``: the count of answers awaited (none: early wakes never poll)."""
        self._inbox = inbox
        self._fd = -1 if inbox is None else inbox.waiter.fileno()
        self._outstanding = outstanding or (lambda: 0)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        """``EpollSelector.select``, with the inbox's FIFO reported readable whenever its
        rings hold records, and the FIFO armed only around a blocking wait."""
        if self._pass_end:
            self._end_pass()
        if self._inbox is None:
            return super().select(timeout)
        t0 = time.perf_counter()
        early = self.early_polls
        events = self._select_inbox(self._inbox, timeout)
        gap = time.perf_counter() - t0
        linger = self.linger
        linger.ended(gap, bool(events))
        fifo = self._fd
        answer = False
        for key, _mask in events:
            if key.fd == fifo:
                linger.answered()
                answer = True
                break
        if self._awaited and not self._after_early:
            self.due.ended(gap, answer)
        # NOTE: the wait after an early wake's poll (cut short, or run out) began late in
        # the batch: its short gap says nothing of how soon answers come after a request.
        self._after_early = self.early_polls != early
        return events

    def _select_inbox(
        self, inbox: Watched, timeout: float | None
    ) -> list[tuple[selectors.SelectorKey, int]]:
        waiter = inbox.waiter
        ready = inbox.has_pending()
        blocking = not ready and (timeout is None or timeout > 0)
        polled = None
        self._awaited = awaited = blocking and self._outstanding() > 0
        if blocking:
            budget = self.linger.budget_s()
            if awaited and self.due.pays and self.linger.pays:
                # NOTE: an answer is due soon: poll for it rather than pay a wake-up.
                self.due_polls += 1
                budget = max(budget, self.due.budget_s())
            if budget:
                # NOTE: the client's next request (linger) or an awaited answer is near.
                polled = self._poll(budget if timeout is None else min(budget, timeout))
                if polled is not None:
                    ready, blocking = inbox.has_pending(), False
        if blocking:
            waiter.arm()
            if inbox.has_pending():  # published before the arm: nobody will announce it
                ready, blocking = True, False
        events = polled if polled is not None else super().select(timeout if blocking else 0)
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
            if blocking and len(events) == 1 and not inbox.has_pending() and self._outstanding():
                # NOTE: an early wake (module docstring): the answer is on its way.
                return self._poll_early(events, timeout)
        elif ready or (blocking and inbox.has_pending()):
            fifo_key = self.get_map().get(fifo)
            if fifo_key is not None:
                events.append((fifo_key, _READ))
        return events

    def _poll(self, limit_s: float) -> list[tuple[selectors.SelectorKey, int]] | None:
        """Poll the rings and the descriptors, yielding the CPU between polls, for up to
        ``limit_s``: the events found (empty: a ring record), or None when nothing came."""
        self.lingers += 1
        inbox = self._inbox
        assert inbox is not None
        clock = time.perf_counter
        end = clock() + limit_s
        while True:
            if inbox.has_pending():
                return []
            events = super().select(0)
            if events:
                return events
            if clock() >= end or _displaced(clock):
                return None

    def _poll_early(
        self, events: list[tuple[selectors.SelectorKey, int]], timeout: float | None
    ) -> list[tuple[selectors.SelectorKey, int]]:
        """After an early wake (module docstring): poll the rings and the other descriptors
        until a record or an event arrives, ``PREWAKE_POLL_S`` or ``timeout`` pass; returns
        ``events`` (the FIFO's, already read) plus what arrived."""
        self.early_polls += 1
        inbox = self._inbox
        assert inbox is not None
        fifo = self._fd
        clock = time.perf_counter
        end = clock() + (PREWAKE_POLL_S if timeout is None else min(PREWAKE_POLL_S, timeout))
        while True:
            if inbox.has_pending():
                break  # NOTE: the FIFO's event (in ``events``) makes the loop drain
            more = [e for e in super().select(0) if e[0].fd != fifo]
            if more:
                return events + more
            if clock() >= end or _displaced(clock):
                break
        return events
