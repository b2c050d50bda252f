"""Cross-process wake-ups: how a producer tells a blocked consumer that a ring has records.

Imported by ``ipc.channel`` (and the supervisor, which creates them). Two kinds, one per
consumer style:

- ``semaphore`` (POSIX named semaphore): for the synchronous loops of the scheduler and the
  workers, which block in ``sem_timedwait`` with their next deadline as the timeout.
- ``fifo`` (a named pipe in ``/dev/shm``): for the asyncio frontends, whose event loop
  watches the pipe's descriptor directly. A semaphore there would need a thread that blocks
  on it and hops every wake-up over to the loop, paying a thread switch and a GIL handoff per
  wake-up on the hottest path of the server.

Producers write one byte per wake-up without blocking; a full pipe means wake-ups are already
pending, so the byte is dropped. Producers open the FIFO read-write, which on Linux never
blocks and never fails for want of a reader, so start-up order does not matter.

A FIFO wake-up also has an *arm*: a POSIX semaphore of the same name (value 0 or 1) that the
consumer posts when it is about to block and wants a byte (``Waiter.arm``). A producer takes
the arm with ``sem_trywait`` and writes a byte only when it got it, so while the consumer is
busy (it polls its rings between events, ``Waiter.disarm``) answers cost the producer no
syscall and the consumer no wake-up, and of several producers only one writes. Both sides'
semaphore operations are atomic read-modify-writes (full barriers), so a record published
before the producer's trywait is seen by a consumer that armed before it, and a consumer that
armed after it rechecks its rings and sees the record: no wake-up is lost. A semaphore
consumer needs none of this: glibc's ``sem_post`` makes a syscall only when someone waits
(measured: 0.04 µs of CPU with nobody waiting, 5-8 µs to wake a sleeper on this VM).

A semaphore consumer may also let a producer's record go without any post at all, when the
record changes nothing it must act on at once (the scheduler and a ``BatchDone`` while nothing
waits for that instance: ``ring.Ring.set_quiet``, ``channel.Sender.send_lazy``). That is
Dekker's protocol, and each side needs a full barrier between its store and its load
(``fence``): the producer publishes the record, fences, reads the flag; the consumer clears
the flag, fences, rechecks its rings, then sleeps. Either the producer sees the flag cleared
and posts, or the consumer sees the record and does not sleep.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Literal

import msgspec
import posix_ipc

from triton_mp.ipc.memory.shm import DEV_SHM, create_semaphore

WakeupKind = Literal["semaphore", "fifo"]

_FENCE = threading.Lock()


def fence() -> None:
    """A full memory barrier between the caller's shared-memory stores before it and its
    loads after it (Dekker's protocol, module docstring). An uncontended lock's acquire and
    release are atomic read-modify-writes of its semaphore in glibc (``lock cmpxchg`` on
    x86-64, a full barrier, the ring's own assumption; ``ipc.memory.ring``); ~0.1 µs."""
    _FENCE.acquire()
    _FENCE.release()


class Wakeup(msgspec.Struct, frozen=True, array_like=True):
    """Names a consumer's wake-up object (POSIX name with leading slash)."""

    kind: WakeupKind
    name: str


def create_wakeup(kind: WakeupKind, name: str) -> Wakeup:
    """Create the object (supervisor). Removed with the other ``/dev/shm`` objects on exit."""
    if kind == "semaphore":
        create_semaphore(name).close()
    else:
        os.mkfifo(DEV_SHM / name.lstrip("/"), 0o600)
        # NOTE: armed from the start: a consumer that has not polled yet wants its wake-ups.
        create_semaphore(name, initial_value=1).close()
    return Wakeup(kind, name)


class Waker:
    """Producer side: wake the consumer."""

    def __init__(self, wakeup: Wakeup) -> None:
        self._sem: posix_ipc.Semaphore | None = None
        self._arm: posix_ipc.Semaphore | None = None
        self._fd = -1
        if wakeup.kind == "semaphore":
            self._sem = posix_ipc.Semaphore(wakeup.name)
        else:
            self._fd = os.open(DEV_SHM / wakeup.name.lstrip("/"), os.O_RDWR | os.O_NONBLOCK)
            with contextlib.suppress(posix_ipc.ExistentialError):
                self._arm = posix_ipc.Semaphore(wakeup.name)

    def wake(self) -> None:
        """Post one wake-up (never blocks); on a FIFO only when the consumer is armed."""
        if self._sem is not None:
            self._sem.release()
            return
        arm = self._arm
        if arm is not None:
            # NOTE: the consumer is not blocked; it polls its rings. Reading the value first
            # spares the trywait's exception on the common path (a busy consumer): a
            # consumer that arms after this read rechecks its rings and finds the record.
            # The value is a plain load, which x86 may move before the record's stores:
            # fence first (Dekker's protocol, module docstring), or a consumer that arms
            # in between could recheck, miss the record and sleep.
            fence()
            if not arm.value:
                return
            try:
                arm.acquire(0)
            except posix_ipc.BusyError:
                return
        # NOTE: a full pipe already holds pending wake-ups; dropping this one is safe. A
        # try, not contextlib.suppress: no context manager object per wake-up (hot path).
        try:  # noqa: SIM105 - the hot path (see the NOTE)
            os.write(self._fd, b"\0")
        except BlockingIOError:
            pass

    def posted(self) -> bool:
        """Whether a post is pending (semaphore; one ``sem_getvalue``, no system call):
        the consumer's, or a producer's view of it (``channel.Sender.consumer_woken``)."""
        return self._sem is not None and self._sem.value > 0

    def close(self) -> None:
        """Close the handle."""
        if self._sem is not None:
            self._sem.close()
        else:
            os.close(self._fd)
            if self._arm is not None:
                self._arm.close()


class Waiter(Waker):
    """Consumer side: block until woken (semaphore) or watch a descriptor (fifo).

    It opens the same object a producer does, and can wake itself (e.g. to stop a loop).
    """

    def wait(self, timeout_s: float | None) -> bool:
        """Block until woken or ``timeout_s`` passes (None = forever). True when woken.

        Raises:
            TypeError: on a fifo waiter (watch ``fileno()`` from an event loop instead).
        """
        if self._sem is None:
            raise TypeError("a fifo wake-up is watched with fileno(), not waited on")
        try:
            self._sem.acquire(timeout_s)
        except posix_ipc.BusyError:
            return False
        return True

    def consume(self) -> None:
        """Take one pending post without blocking, if there is one (semaphore): the post
        of a record this consumer found by polling."""
        if self._sem is not None:
            try:  # noqa: SIM105 - no context manager object per call (consume_all's NOTE)
                self._sem.acquire(0)
            except posix_ipc.BusyError:
                pass

    def consume_all(self) -> None:
        """Take every pending post without blocking (semaphore), before draining the rings:
        each post taken announced a record published before it, which the drain then
        takes, so none is left to wake the consumer again for nothing."""
        sem = self._sem
        if sem is not None:
            # NOTE: a try, not contextlib.suppress: once per wake-up of every loop (hot path).
            try:
                while sem.value:
                    sem.acquire(0)
            except posix_ipc.BusyError:
                pass

    def fileno(self) -> int:
        """The FIFO's descriptor, readable when woken (fifo waiters only)."""
        return self._fd

    def arm(self) -> None:
        """Ask producers for a byte on the next record (fifo; before blocking). The caller
        rechecks its rings afterwards: what was published before this is not announced."""
        if self._arm is not None and self._arm.value == 0:
            # NOTE: only the consumer posts, and only from 0: the value stays 0 or 1.
            self._arm.release()

    def disarm(self) -> bool:
        """Stop asking for bytes while this consumer polls (fifo). False when a producer
        took the arm first: its byte is in the FIFO (or on its way) and ``clear`` reads it."""
        if self._arm is None:
            return False
        try:
            self._arm.acquire(0)
        except posix_ipc.BusyError:
            return False
        return True

    def clear(self) -> None:
        """Consume pending wake-up bytes (fifo), before draining the rings."""
        if self._fd >= 0:
            with contextlib.suppress(BlockingIOError):
                while len(os.read(self._fd, 65536)) == 65536:
                    pass
