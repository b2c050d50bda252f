"""Channels: a ring plus the consumer's wake-up (``ipc.memory.notify``) plus a typed codec.

A ring carries msgpack messages (``ipc.protocol.messages``) and binary records
(``ipc.recordio.records``:
requests and answers, told apart by their first byte); ``codec.Decoder`` decodes both.

Imported by the role ``main`` modules. Each consumer process has ONE wake-up object that all
of its producers post (``Inbox``), and one SPSC ring per producer; a consumer woken once
drains every ring, so under load one wake-up (one syscall) serves many messages.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from triton_mp.common.errors import ErrorCode, TritonMPError
from triton_mp.ipc.memory.notify import Waiter, Waker, Wakeup, fence
from triton_mp.ipc.memory.ring import Ring, RingFull
from triton_mp.ipc.recordio.codec import Decoder, encode

try:
    # NOTE: mypy sees the extension only where it is built: either ignore may be unused.
    # Imported after codec, whose request_records configures the classes it builds.
    from triton_mp.ipc import _request_decoder as native_decoder  # type: ignore[attr-defined,unused-ignore]
except ImportError:  # NOTE: not built (setup.py): the rings are read in Python
    native_decoder = None  # type: ignore[assignment,unused-ignore]

T = TypeVar("T")

_POP_RECORDS: Any = getattr(native_decoder, "pop_records", None)
"""``ring_records.cc``'s ``pop_records`` (None where the extension is not built, or built
before it)."""

SPIN_STEP_S = 5e-6
"""The smallest spin budget ``Inbox.wait`` keeps; below it, it does not spin at all."""


class ChannelTimeout(TritonMPError):
    """A ring stayed full past the send deadline: its consumer is stuck or dead."""

    code = ErrorCode.UNAVAILABLE


class Sender:
    """Producer end: push an encoded message into one ring and wake the consumer.

    Args:
        ring_name: the POSIX name of a ring created by the supervisor.
        wakeup: the consumer's wake-up object.
        full_timeout_s: how long ``send`` waits for room in a full ring.
        attach: maps the ring by name (``Ring.attach``; a frontend's ring to the scheduler:
            ``frontend.native.shared_ring``, whose pushes the gRPC thread shares).
    """

    def __init__(
        self,
        ring_name: str,
        wakeup: Wakeup,
        full_timeout_s: float = 10.0,
        attach: Callable[[str], Ring] = Ring.attach,
    ) -> None:
        self._ring = attach(ring_name)
        self._waker = Waker(wakeup)
        self._full_timeout_s = full_timeout_s

    @property
    def ring(self) -> Ring:
        """The ring pushed to (a frontend's ``SharedRing``: its producer is shared)."""
        return self._ring

    def send(self, msg: Any) -> None:
        """Encode and push ``msg``, then wake the consumer.

        Raises:
            ChannelTimeout: the ring stayed full for ``full_timeout_s``.
        """
        self.send_bytes(encode(msg))

    def send_bytes(self, data: bytes) -> None:
        """Push already-encoded bytes (see ``send``)."""
        self._push(data)
        self._waker.wake()

    def push_bytes(self, data: bytes) -> None:
        """Push already-encoded bytes without waking the consumer; the caller calls ``wake``
        before it waits itself (a producer that posts once at the end of its pass,
        ``scheduler.main.Router.flush``).

        Raises:
            ChannelTimeout: the ring stayed full for ``full_timeout_s``.
        """
        self._push(data)

    def send_lazy(self, data: bytes) -> bool:
        """Push already-encoded bytes and wake the consumer only when it asked for wake-ups
        on this ring (``Ring.set_quiet``: the scheduler, for a ``BatchDone`` that changes no
        decision now); returns whether it posted. The record is published before the flag
        is read, with a full barrier between (``notify.fence``): a consumer that asked
        again after this read rechecks its rings before it sleeps and finds the record.

        Raises:
            ChannelTimeout: the ring stayed full for ``full_timeout_s``.
        """
        self._push(data)
        fence()
        if self._ring.quiet():
            return False
        self._waker.wake()
        return True

    def consumer_quiet(self) -> bool:
        """Whether the consumer lets lazy pushes on this ring go without a wake-up now
        (``Ring.set_quiet``; one load: ``send_lazy`` fences before its own read)."""
        return self._ring.quiet()

    def consumer_woken(self) -> bool:
        """Whether a post of the consumer's wake-up is pending (a semaphore consumer: it
        will drain its rings; ``Waker.posted``, no system call)."""
        return self._waker.posted()

    def wake(self) -> None:
        """Post the consumer's wake-up: one post announces every record pushed before it
        (``Waker.wake``: on a FIFO, only when it is blocked and armed). The scheduler's
        ``Router.flush`` posts after its pass's pushes; ``workers.prewake`` with nothing
        new pushed, as an early wake."""
        self._waker.wake()

    def _push(self, data: bytes) -> None:
        """Push, waiting for room in a full ring (waking the consumer meanwhile)."""
        try:
            self._ring.push(data)
        except RingFull:
            deadline = time.monotonic() + self._full_timeout_s
            pause_s = 20e-6
            while True:
                # NOTE: the consumer drains every ring when woken; a post makes sure it is.
                self._waker.wake()
                time.sleep(pause_s)
                pause_s = min(pause_s * 2, 5e-3)
                try:
                    self._ring.push(data)
                    break
                except RingFull:
                    if time.monotonic() > deadline:
                        raise self.full_error() from None

    @property
    def full_timeout_s(self) -> float:
        """How long a send waits for room in a full ring (seconds)."""
        return self._full_timeout_s

    def full_error(self) -> ChannelTimeout:
        """The error of a send whose ring stayed full for ``full_timeout_s`` (UNAVAILABLE;
        the native gRPC thread's lost direct handoffs fail with it too)."""
        return ChannelTimeout(f"ring {self._ring.segment.name} full for {self._full_timeout_s}s")

    def quiet_word(self) -> int:
        """Fence, then read the ring's quiet word (a frontend's ring to the scheduler: the
        mask of model buckets whose requests need no wake-up, ``ipc.recordio.quiet_requests``).
        Call it after pushing: the record is published before the word is read, with a full
        barrier between (Dekker's protocol, ``ipc.memory.notify``)."""
        fence()
        return self._ring.quiet_word()

    def forming(self) -> tuple[int, int, int]:
        """The ring's forming words (mask, allowance, floor_ns: ``Ring.forming``); call it
        right after ``quiet_word``, whose fence it relies on."""
        return self._ring.forming()

    def push_quiet(self, data: bytes) -> bool:
        """Push already-encoded bytes without waking the consumer, which reads them on its
        next pass (a note that may wait: ``ipc.direct``'s ``DirectSent``); False when the
        ring is full now.

        Raises:
            RecordTooLarge: the record can never fit the ring.
        """
        try:
            self._ring.push(data)
        except RingFull:
            return False
        return True

    def fits(self, n: int) -> bool:
        """Whether a record of ``n`` bytes can ever be pushed onto the ring."""
        return self._ring.fits(n)

    def close(self) -> None:
        """Unmap the ring and close the wake-up handle."""
        self._ring.close()
        self._waker.close()


class Inbox(Generic[T]):
    """Consumer end: one wake-up, several rings, one decoder for the direction's union.

    A semaphore inbox is waited on with ``wait``; a fifo inbox is watched through
    ``waiter.fileno()`` by an event loop, which calls ``waiter.clear()`` then ``drain()``, or
    polls ``has_pending`` between events and arms the wake-up only before it blocks
    (``frontend.dispatch.polling_loop``).
    """

    def __init__(
        self,
        wakeup: Wakeup,
        ring_names: Sequence[str],
        msg_type: Any,
        spin_max_s: float = 0.0,
        spin_on_posts: bool = False,
        native_records: bool = False,
    ) -> None:
        self.waiter = Waiter(wakeup)
        self.wakeup = wakeup
        """The wake-up's name and kind (the native answer thread opens a FIFO one,
        ``frontend.native.answer_thread``)."""
        self._pop = _POP_RECORDS if native_records else None
        """The compiled drain of one ring (``Ring.pop_native``), where built and asked for:
        the scheduler's inbox, which reads every request of every batch."""
        self.spin_on_posts = spin_on_posts
        """The spin watches the wake-up's posts, not the rings: a record pushed without a
        post (a quiet ``BatchDone``, a request for a busy model, a ``DirectSent`` note)
        waits for the next pass that a post starts, as it would have had the consumer
        been asleep; the scheduler's (``scheduler.request_wakeups``)."""
        self._rings = [Ring.attach(n) for n in ring_names]
        self._by_name = {n.lstrip("/"): r for n, r in zip(ring_names, self._rings, strict=True)}
        """Each ring by its name (no leading slash)."""
        self._decoder: Decoder[T] = Decoder(msg_type)
        self.spin_max_s = spin_max_s
        """Longest poll of the rings before ``wait`` sleeps (0: never poll; see ``wait``)."""
        self._spin_s = spin_max_s
        self._woken = False
        """``wake`` was called: the next ``wait`` returns True with no record."""

    def add_ring(self, ring_name: str) -> None:
        """Attach one more producer's ring (a model instance started at run time); a ring
        attached already stays as it is.

        Raises:
            posix_ipc.ExistentialError: no ring has that name (it was unlinked).
        """
        if not self.has_ring(ring_name):
            ring = Ring.attach(ring_name)
            self._rings.append(ring)
            self._by_name[ring_name.lstrip("/")] = ring

    def ring_names(self) -> tuple[str, ...]:
        """The names of the rings attached, in drain order."""
        return tuple(r.segment.name for r in self._rings)

    def has_ring(self, ring_name: str) -> bool:
        """Whether ``ring_name`` is one of this inbox's rings."""
        return ring_name.lstrip("/") in self._by_name

    def remove_ring(self, ring_name: str) -> list[T]:
        """Detach a ring whose producer is gone; returns what was still pending in it."""
        for i, ring in enumerate(self._rings):
            if ring.segment.name.lstrip("/") == ring_name.lstrip("/"):
                dec = self._decoder.decode
                left = [dec(rec) for rec in ring.pop_all()]
                ring.close()
                del self._rings[i]
                self._by_name.pop(ring_name.lstrip("/"), None)
                return left
        return []

    def wait(self, timeout_s: float | None) -> bool:
        """Block until a ring holds a record or ``timeout_s`` passes (None = forever). True
        when there is something to drain (or ``wake`` was called).

        With ``spin_max_s`` set, first poll the rings for up to the adaptive spin budget
        (yielding the CPU between polls, never longer than ``timeout_s``): a record that
        arrives meanwhile is taken without sleeping, so its producer's ``sem_post`` makes no
        syscall and this process no context switch. The budget doubles (up to
        ``spin_max_s``) when a spin or a short sleep found work, and halves when a spin
        ran out and the sleep after it was long, so a consumer whose work comes seldom soon
        does not spin at all, and an idle one sleeps after one spin at most.

        Before it returns True it takes every pending post (``Waiter.consume_all``), and a
        post whose record an earlier drain took already (its producer posts after it
        pushes) does not end the wait: each drain is one pass of the consumer's loop, and
        an empty one would cost a pass, and a spin, for nothing.
        """
        if timeout_s is None and self.spin_max_s <= 0.0:
            # NOTE: no spin and no deadline (a worker's loop): no clock to read.
            return self._sleep(None, 0.0)
        budget = self._spin_s
        clock = time.perf_counter
        t0 = clock()
        if budget > 0.0 and self.spin_max_s > 0.0:
            end = t0 + (budget if timeout_s is None else min(budget, timeout_s))
            while True:
                if self._spin_found():
                    self._spin_s = min(self.spin_max_s, 2 * budget)
                    return True
                if clock() >= end:
                    break
                os.sched_yield()
        t_sleep = clock()
        woken = self._sleep(timeout_s, t0)
        if self.spin_max_s > 0.0:
            slept = clock() - t_sleep
            if woken and slept < self.spin_max_s:
                # NOTE: a longer spin would have caught it without the sleep.
                self._spin_s = min(self.spin_max_s, max(2 * budget, SPIN_STEP_S))
            elif budget > 0.0:
                self._spin_s = budget / 2 if budget / 2 >= SPIN_STEP_S else 0.0
        return woken

    def _spin_found(self) -> bool:
        """One poll of the spin: a record (or, ``spin_on_posts``, a post whose record is
        pending) was found; its posts are taken (``Waiter.consume_all``)."""
        if self.spin_on_posts:
            if not self.waiter.posted():
                return False
            self.waiter.consume_all()
            # NOTE: a stale post (its record was drained already) does not end the spin.
            return self._woken or self.has_pending()
        if not self.has_pending():
            return False
        self.waiter.consume_all()
        return True

    def poll(self, timeout_s: float) -> bool:
        """Poll the rings, yielding the CPU between polls, until one holds a record (True,
        its posts taken as in ``wait``) or ``timeout_s`` passes (False); never sleeps.

        For a consumer that knows work is due within ``timeout_s`` (a batching deadline, a
        ``BatchDue``): a record that arrives meanwhile costs its producer's ``sem_post`` no
        syscall and this process no wake-up, which on a VM whose idle vCPUs halt is the
        larger part of a cross-process hop. With ``spin_on_posts`` it watches posts, as the
        spin does: a record pushed without one (a request joining a forming batch,
        ``scheduler.forming``) does not end the poll; the caller drains at its end.
        """
        clock = time.perf_counter
        end = clock() + timeout_s
        found = self._spin_found if self.spin_on_posts else self.has_pending
        while True:
            if self._woken or found():
                self._woken = False
                self.waiter.consume_all()
                return True
            if clock() >= end:
                return False
            os.sched_yield()

    def _sleep(self, timeout_s: float | None, t0: float) -> bool:
        """Sleep on the wake-up until a post finds a record in a ring (or ``wake``), or
        until ``timeout_s`` after ``t0`` (``time.perf_counter``)."""
        while True:
            left = None if timeout_s is None else max(0.0, timeout_s - (time.perf_counter() - t0))
            if not self.waiter.wait(left):
                return False
            if self._woken or self.has_pending():
                self._woken = False
                self.waiter.consume_all()
                return True
            # NOTE: a stale post (its record was drained already): wait on.

    def wake(self) -> None:
        """Wake this consumer from within its own process (``wait`` returns True)."""
        self._woken = True
        self.waiter.wake()

    def set_quiet(self, ring_name: str, quiet: bool) -> None:
        """Let lazy pushes into one of this inbox's rings go without a wake-up, or ask for
        wake-ups again (``Ring.set_quiet``: after asking again, ``fence`` and recheck
        ``has_pending`` before sleeping); a ring not attached is ignored."""
        ring = self._by_name.get(ring_name.lstrip("/"))
        if ring is not None:
            ring.set_quiet(quiet)

    def set_quiet_word(self, ring_names: Sequence[str], word: int) -> None:
        """Store ``word`` as the quiet word of each of ``ring_names`` that is attached
        (``Ring.set_quiet_word``: a frontend ring's mask of model buckets)."""
        for name in ring_names:
            ring = self._by_name.get(name.lstrip("/"))
            if ring is not None:
                ring.set_quiet_word(word)

    def set_forming(self, ring_names: Sequence[str], mask: int, allowance: int, floor: int) -> None:
        """Store the forming words into each of ``ring_names`` that is attached
        (``Ring.set_forming``)."""
        for name in ring_names:
            ring = self._by_name.get(name.lstrip("/"))
            if ring is not None:
                ring.set_forming(mask, allowance, floor)

    def has_pending(self) -> bool:
        """Whether any ring holds a record (a poll: no syscall, nothing decoded)."""
        # NOTE: a loop, not any() over a generator: this runs on every poll of a spin.
        for ring in self._rings:  # noqa: SIM110
            if ring.has_records():
                return True
        return False

    @property
    def decode_buffer(self) -> Callable[[Any], T]:
        """This inbox's decoder of one record (``codec.Decoder.decode_buffer``)."""
        return self._decoder.decode_buffer

    def drain(self, read: Callable[[memoryview], Any] | None = None) -> list[T]:
        """Every message pending in every ring, decoded (per-ring order kept). ``read``:
        what reads each record instead of the decoder (a view valid during the call; e.g.
        the native answer side's reader, which serves some records itself and gives None
        for them, ``frontend.native.known_answers``)."""
        out: list[T] = []
        dec = self._decoder.decode_buffer if read is None else read
        pop = self._pop if read is None else None
        for ring in self._rings:
            if ring.has_records():
                out += ring.pop_each(dec) if pop is None else ring.pop_native(pop, dec)
        return out

    def close(self) -> None:
        """Unmap the rings and close the semaphore handle."""
        for ring in self._rings:
            ring.close()
        self.waiter.close()
