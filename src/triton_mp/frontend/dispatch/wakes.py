"""Sends to the scheduler that wake it once per batch of requests, not once per request.

Imported by ``frontend.main`` (which builds one ``HeldWakes`` over the ring to the
scheduler and hands ``send`` to ``frontend.inference``) and by ``frontend.native.handoff``
(which holds the wakes while it submits every request one wake-up of the native server
brought). Outside ``held`` a send pushes and wakes, as ``ipc.Sender.send_bytes`` does;
inside, it pushes without waking (``Sender.push_quiet``) and the one wake owed is posted
when the outermost ``held`` ends. A waiting scheduler's wake is a ``sem_post`` system call
and a pass of the scheduler: measured at add_sub_py c=16, 13 % of the frontend's event loop
thread was ``sem_post``, one per request.

With ``quiet_word`` given, a request whose model's bit is set in the ring's quiet word (the
scheduler sets it while every instance of the model is busy: ``scheduler.request_wakeups``;
the bits: ``ipc.recordio.quiet_requests``) is pushed with no wake at all: the scheduler
reads it when a ``BatchDone`` wakes it. The word is read after the push, behind a fence
(``Sender.quiet_word``), so a scheduler that clears the bit later rechecks its rings and
finds the record (Dekker's protocol, ``ipc.memory.notify``).

With ``forming`` given too, a request whose model's bit is set in the ring's forming mask (a
batch waiting for its delay that more rows cannot complete: ``scheduler.forming``), stamped
no earlier than the floor, goes without a wake while the rows pushed so since the
allowance's epoch changed stay within it (``Allowance``); the words are read after the quiet
word, behind its fence.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol

from triton_mp.ipc.channel import Sender
from triton_mp.ipc.recordio.quiet_requests import (
    EPOCH_SHIFT,
    ROWS_MASK,
    request_bit,
    request_rows_arrival,
)


class Allowance:
    """A producer's count of the rows it pushed into a forming batch without a wake-up
    (``scheduler.forming``; pure: the caller reads the words).

    C++ twin: ``FormingAllowance`` in ``frontend/native/known_wake.h``, where the native
    frontend's gRPC thread counts; ``tests/unit/test_known_wake.py`` replays the same drawn
    cases through both."""

    __slots__ = ("epoch", "used")

    def __init__(self) -> None:
        self.epoch = -1
        """The epoch the count is for (the allowance word's high half; -1: none seen)."""
        self.used = 0
        """Rows pushed quietly in that epoch."""

    def join(self, bits: int, rows: int, first_ns: int, words: tuple[int, int, int]) -> bool:
        """Whether requests of model buckets ``bits``, ``rows`` rows in all, the earliest
        stamped ``first_ns``, may go without a wake-up under the forming words ``words``
        (mask, allowance word, floor ns); counts their rows when they may."""
        mask, allowance, floor = words
        if not bits or bits & ~mask or first_ns < floor:
            return False
        epoch = allowance >> EPOCH_SHIFT
        if epoch != self.epoch:
            if self.epoch >= 0 and (self.epoch - epoch) & ROWS_MASK < 1 << 31:
                # NOTE: older than the epoch counted (u32 serial order): two threads that
                # share one count (SharedAllowance) read the words in either order.
                return False
            # NOTE: the first epoch this producer sees counts as spent: a frontend that
            # replaced a dead one on this ring cannot know what that one pushed under it.
            self.used = 0 if self.epoch >= 0 else allowance & ROWS_MASK
            self.epoch = epoch
        used = self.used + rows
        if used > allowance & ROWS_MASK:
            return False
        self.used = used
        return True


class Joins(Protocol):
    """``Allowance.join``: what ``HeldWakes`` counts forming rows with."""

    def join(self, bits: int, rows: int, first_ns: int, words: tuple[int, int, int]) -> bool: ...


class SharedAllowance:
    """``Allowance`` counted elsewhere: on the native frontend, in the C++ allowance the gRPC
    thread counts its known calls in (``frontend/native/known_wake.h``, ``KnownWake::Join``,
    under its lock), since the two push into one ring whose allowance is for both together.

    Args:
        join: ``_native.known_wake_join(bits, rows, first_ns, mask, allowance, floor_ns)``.
    """

    __slots__ = ("_join",)

    def __init__(self, join: Callable[[int, int, int, int, int, int], bool]) -> None:
        self._join = join

    def join(self, bits: int, rows: int, first_ns: int, words: tuple[int, int, int]) -> bool:
        """``Allowance.join`` (its arguments: buckets, rows, earliest stamp in
        CLOCK_MONOTONIC ns, and the forming words mask, allowance word, floor ns)."""
        mask, allowance, floor = words
        return self._join(bits, rows, first_ns, mask, allowance, floor)


class HeldWakes:
    """One producer's sends to the scheduler, with wakes that can be held or spared.

    Args:
        push_quiet: pushes encoded bytes without waking; False when the ring is full now
            (``Sender.push_quiet``; raises ``RecordTooLarge`` for a record that never fits).
        send_bytes: pushes and wakes, waiting for room (``Sender.send_bytes``).
        wake: wakes the scheduler (``ipc.memory.notify.Waker.wake``).
        quiet_word: fences and reads the ring's quiet word (``Sender.quiet_word``); None:
            every request wakes (or owes a wake).
        forming: reads the ring's forming words (``Sender.forming``) right after
            ``quiet_word``; None: no request joins a forming batch unread.
        allowance: counts the rows pushed into forming batches (``Allowance.join``'s
            signature); None: this producer's own ``Allowance``. The native frontend passes
            the count its gRPC thread shares (``SharedAllowance``).
    """

    __slots__ = (
        "_allowance",
        "_bits",
        "_depth",
        "_first_ns",
        "_forming",
        "_owed",
        "_push_quiet",
        "_quiet_word",
        "_rows",
        "_send_bytes",
        "_wake",
    )

    def __init__(
        self,
        push_quiet: Callable[[bytes], bool],
        send_bytes: Callable[[bytes], None],
        wake: Callable[[], None],
        quiet_word: Callable[[], int] | None = None,
        forming: Callable[[], tuple[int, int, int]] | None = None,
        allowance: Joins | None = None,
    ) -> None:
        self._push_quiet = push_quiet
        self._send_bytes = send_bytes
        self._wake = wake
        self._quiet_word = quiet_word
        self._depth = 0
        self._owed = False
        """A record that needs its wake was pushed without it since the outermost ``held``
        began."""
        self._bits = 0
        """The quiet-word bits of the requests pushed without a wake since the outermost
        ``held`` began: a wake is owed unless the scheduler set them all."""
        self._forming = forming if quiet_word is not None else None
        self._allowance: Joins = Allowance() if allowance is None else allowance
        self._rows = 0
        """The rows of those requests (``scheduler.forming``)."""
        self._first_ns = 0
        """The earliest arrival stamp of those requests (0: none yet)."""

    @classmethod
    def over(
        cls, sender: Sender, wake: Callable[[], None], allowance: Joins | None = None
    ) -> HeldWakes:
        """Sends over ``sender`` (the frontend's ring to the scheduler) that read its quiet
        word (``allowance``: as ``HeldWakes``')."""
        return cls(
            sender.push_quiet, sender.send_bytes, wake, sender.quiet_word, sender.forming, allowance
        )

    def send(self, data: bytes, bit: int | None = None) -> None:
        """Push ``data`` to the scheduler; wake it now, when ``held`` ends, or not at all
        (a request whose model's bit the scheduler set).

        Args:
            bit: ``request_bit(data)`` when the caller knows it already (a known request's
                record patched from a template: ``frontend.dispatch.known_records``); None
                computes it here.

        Raises:
            ChannelTimeout: the ring stayed full (as ``Sender.send_bytes``).
            RecordTooLarge: the record can never fit the ring.
        """
        word = self._quiet_word
        if word is None:
            bit = 0
        elif bit is None:
            bit = request_bit(data)
        if (self._depth or bit) and self._push_quiet(data):
            if self._depth:
                if not bit:
                    self._owed = True
                    return
                self._bits |= bit
                if self._forming is not None:
                    rows, at = request_rows_arrival(data)
                    self._rows += rows
                    if not self._first_ns or at < self._first_ns:
                        self._first_ns = at
            elif word is None or not (bit & word() or self._joins(bit, data)):
                self._wake()
            return
        # NOTE: a full ring: send_bytes wakes the scheduler while it waits for room, which
        # also reads the records pushed quietly before this one.
        self._send_bytes(data)

    @contextmanager
    def held(self) -> Iterator[None]:
        """Sends inside wake the scheduler once, at the end, unless each was a request
        whose model's bit is set then (also when an exception ends it: every record pushed
        is read)."""
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if not self._depth:
                self._end_held()

    def _joins(self, bit: int, data: bytes) -> bool:
        """Whether one request pushed outside ``held`` joins a forming batch unread."""
        forming = self._forming
        if forming is None:
            return False
        rows, at = request_rows_arrival(data)
        return self._allowance.join(bit, rows, at, forming())

    def _end_held(self) -> None:
        owed, bits, word = self._owed, self._bits, self._quiet_word
        rows, first, forming = self._rows, self._first_ns, self._forming
        self._owed = False
        self._bits = 0
        self._rows = self._first_ns = 0
        if not (owed or bits):
            return
        if owed or word is None:
            self._wake()
            return
        rest = bits & ~word()
        if not rest:
            return
        # NOTE: the rows of requests the busy bits spared count too: an over-count only
        # costs a wake-up.
        if forming is None or not self._allowance.join(rest, rows, first, forming()):
            self._wake()
