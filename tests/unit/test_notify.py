"""Wake-ups between processes: semaphores for blocking loops, FIFOs for event loops."""

from __future__ import annotations

import os
import select
from collections.abc import Iterator

import pytest

from triton_mp.ipc.memory.notify import Waiter, Waker, Wakeup, WakeupKind, create_wakeup
from triton_mp.ipc.memory.shm import unlink_quietly


@pytest.fixture(params=["semaphore", "fifo"])
def wakeup(request: pytest.FixtureRequest) -> Iterator[Wakeup]:
    kind: WakeupKind = request.param
    w = create_wakeup(kind, f"/triton_mp_{os.getpid()}_test_{kind}")
    yield w
    unlink_quietly(w.name)


def _readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


def test_a_wake_reaches_the_waiter(wakeup: Wakeup) -> None:
    waiter, waker = Waiter(wakeup), Waker(wakeup)
    try:
        if wakeup.kind == "semaphore":
            assert not waiter.wait(0.01)
            waker.wake()
            assert waiter.wait(1.0)
            assert not waiter.wait(0.01)
        else:
            assert not _readable(waiter.fileno())
            waker.wake()
            waker.wake()
            assert _readable(waiter.fileno())
            waiter.clear()
            assert not _readable(waiter.fileno())
            with pytest.raises(TypeError):
                waiter.wait(0)
    finally:
        waker.close()
        waiter.close()


def test_fifo_wakes_never_block_when_nobody_reads() -> None:
    w = create_wakeup("fifo", f"/triton_mp_{os.getpid()}_test_full")
    try:
        waker = Waker(w)  # no consumer has it open: must not block or fail
        for _ in range(100_000):  # far more than a pipe buffer holds
            waker.wake()
        waiter = Waiter(w)
        assert _readable(waiter.fileno())
        waiter.clear()
        assert not _readable(waiter.fileno())
        waiter.close()
        waker.close()
    finally:
        unlink_quietly(w.name)


def test_an_armed_fifo_gets_one_byte_and_a_disarmed_one_none() -> None:
    w = create_wakeup("fifo", f"/triton_mp_{os.getpid()}_test_arm")
    try:
        waiter, first, second = Waiter(w), Waker(w), Waker(w)
        # armed from creation: the first wake writes, the next finds the arm taken
        first.wake()
        second.wake()
        assert _readable(waiter.fileno())
        waiter.clear()
        second.wake()
        assert not _readable(waiter.fileno())  # not armed: the consumer is polling
        waiter.arm()
        waiter.arm()  # arming twice still asks for one byte only
        second.wake()
        first.wake()
        assert _readable(waiter.fileno())
        assert os.read(waiter.fileno(), 16) == b"\0"
        waiter.arm()
        assert waiter.disarm()  # taken back before any producer saw it
        first.wake()
        assert not _readable(waiter.fileno())
        assert not waiter.disarm()  # nothing left to take back
        for h in (first, second, waiter):
            h.close()
    finally:
        unlink_quietly(w.name)


def test_a_fifo_producer_fences_before_it_reads_the_arm(monkeypatch: pytest.MonkeyPatch) -> None:
    """The producer's record stores must be visible before it reads the arm (a plain load
    that x86 may move ahead of them): a fence comes first, on the busy path too."""
    from triton_mp.ipc.memory import notify

    w = create_wakeup("fifo", f"/triton_mp_{os.getpid()}_test_fence")
    try:
        waiter, waker = Waiter(w), Waker(w)
        waiter.clear()
        assert waiter.disarm()  # the consumer is busy: the arm reads 0
        fences: list[int] = []
        monkeypatch.setattr(notify, "fence", lambda: fences.append(1))
        waker.wake()
        assert fences == [1]
        assert not _readable(waiter.fileno())
        waker.close()
        waiter.close()
    finally:
        unlink_quietly(w.name)
