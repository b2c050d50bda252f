"""Waking a batch's frontends before their answers are written, when the batch is short.

Imported by ``workers.worker``. A frontend blocked in its event loop takes tens of µs to run
again after a worker's FIFO byte (the vCPU's wake-up on this VM, ``bench/wake_cost.py``).
When a batch starts, the worker wakes the frontends whose requests it holds
(``ipc.memory.notify.Waker.wake``: a byte only to a frontend that is blocked and armed,
nothing but a fence and a load for a busy one), so that wake-up overlaps the batch's
``execute``; the woken frontend finds no record yet and polls its rings for the answer
(``frontend.dispatch.polling_loop``, ``PREWAKE_POLL_S``). The answer's own wake then costs
nothing.

Only for batches that end soon: the worker keeps the time its last batch took from its start
to the last answer posted, and wakes early only while that is under ``PREWAKE_MAX_NS``, since
the frontend polls for at most ``PREWAKE_POLL_S``; for a slow model the wake-up is a small
part of the latency and the poll would be CPU spent for nothing.

When: at the batch's start only while the last batch took under ``PREWAKE_START_MAX_NS``
(a lone request: the whole batch is about one wake-up long); a longer batch wakes its
frontends after ``execute`` returned, just before its answers are written, so the frontend's
wake-up still overlaps the answers' writing but its poll does not last the whole batch. The
frontend polls with ``sched_yield`` until the answer comes: on a quiet machine that is a
core's CPU for the poll's length, once per batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from triton_mp.ipc.protocol.messages import ReplyTo, Requester

_FRONTEND = Requester.FRONTEND
"""The member read once at import: from its class it costs ~0.1 µs in Python 3.11 (a
descriptor), ~15x a global's read, once per request otherwise."""

PREWAKE_MAX_NS = 200_000
"""A batch wakes its frontends early only while the last batch took less than this from its
start to its last answer (ns); below the frontend's ``PREWAKE_POLL_S`` (300 µs) with room
for the decode and the wake-up itself."""

PREWAKE_START_MAX_NS = 120_000
"""A batch wakes its frontends at its start only while the last batch took less than this
from its start to its last answer (ns); otherwise after ``execute`` (``batch_executed``).
Measured (add_sub_py, load ~11, instrumented worker): a c=1 batch takes 79-84 µs, so its
early wake keeps overlapping the whole batch (the c=1 p50); a c=16 batch of ~10 requests
takes 163-175 µs, and waking at its start made the native answer thread poll for most of
that on 83% of the batches."""


class Answered(Protocol):
    """A request as ``EarlyWakes`` reads it: where its answer goes (``InferRequest``)."""

    @property
    def reply_to(self) -> ReplyTo: ...


class EarlyWakes:
    """Decides, per batch, whether to wake its frontends before answering (module docstring).

    Args:
        wake: wakes frontend ``frontend_id`` (``channel.Sender.wake`` of its answer ring).
    """

    __slots__ = ("_wake", "last_ns")

    def __init__(self, wake: Callable[[int], None]) -> None:
        self._wake = wake
        self.last_ns: int | None = None
        """How long the last batch took from its start to its last answer (ns); None
        before the first: the first batch wakes nobody early."""

    def batch_starts(self, requests: Sequence[Answered]) -> int:
        """A batch of ``requests`` starts: wake each frontend they answer once when the last
        batch was shorter than ``PREWAKE_START_MAX_NS``. Returns the number woken. After a
        longer batch (the common case under load) nothing is read here."""
        last = self.last_ns
        if last is None or last >= PREWAKE_START_MAX_NS:
            return 0
        return self._wake_all(requests)

    def batch_executed(self, requests: Sequence[Answered]) -> int:
        """The batch's ``execute`` returned and its answers are about to be written: wake
        each frontend they answer once when the last batch took from ``PREWAKE_START_MAX_NS``
        to ``PREWAKE_MAX_NS`` (a shorter one woke them at its start already). Returns the
        number woken."""
        last = self.last_ns
        if last is None or last < PREWAKE_START_MAX_NS or last >= PREWAKE_MAX_NS:
            return 0
        return self._wake_all(requests)

    def _wake_all(self, requests: Sequence[Answered]) -> int:
        """Wake each frontend that ``requests`` answer, once; returns the number woken."""
        if not requests:
            return 0
        # NOTE: the common batch answers one requester through one ``ReplyTo`` object (the
        # record decoder interns them): told by identity alone, ~0.5 µs per batch of 12
        # hot less than the set of ids (``_wake_each``) that any other batch takes.
        first = requests[0].reply_to
        for r in requests:
            if r.reply_to is not first:
                return self._wake_each(requests)
        if first.kind is _FRONTEND:
            self._wake(first.id)
            return 1
        return 0

    def _wake_each(self, requests: Sequence[Answered]) -> int:
        """Wake each frontend that ``requests`` answer, once, by id; returns the number
        woken."""
        woken: set[int] = set()
        for r in requests:
            to = r.reply_to
            if to.kind is _FRONTEND and to.id not in woken:
                woken.add(to.id)
                self._wake(to.id)
        return len(woken)

    def batch_ended(self, took_ns: int) -> None:
        """The batch's answers are posted ``took_ns`` after it started."""
        self.last_ns = took_ns
