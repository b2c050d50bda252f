"""The native answer thread's decisions (``frontend/native/answer_thread.h``), without a
server or other processes: real rings and a real FIFO wake-up, the thread started without a
handoff (it serves nothing, so every record goes to Python's queue).

- every record reaches Python byte for byte, each ring's in order, woken by a producer's
  ``Waker.wake`` exactly as the loop was (the FIFO's arm);
- idle, the thread blocks armed (no spin) and Python's eventfd is written only when Python
  armed it, for a record, and for a worker's early wake only while Python awaits answers;
- a ring removed is read first (its records queued), a ring added is read after a wake;
- stopped, it leaves unread records in the rings for Python's own drain;
- ``InboxHandler.read_through``: the loop watches the queue while the thread runs, settles
  after every drain of it, and applies what the thread queued before the rings again.
"""

from __future__ import annotations

import importlib
import os
import select
import time
from collections.abc import Callable, Iterator
from typing import Any

import posix_ipc
import pytest

from triton_mp.frontend.dispatch.inbox import InboxHandler
from triton_mp.frontend.native import available
from triton_mp.frontend.native.answer_thread import AnswerQueue
from triton_mp.ipc.memory.notify import Waker, Wakeup, create_wakeup
from triton_mp.ipc.memory.ring import Ring
from triton_mp.ipc.memory.shm import unlink_quietly
from triton_mp.ipc.protocol.messages import InferResponse

pytestmark = pytest.mark.skipif(not available(), reason="the native extension is not built")


@pytest.fixture
def native() -> Iterator[Any]:
    module = importlib.import_module("triton_mp.frontend.native._native")
    yield module
    module.answer_thread_stop()


@pytest.fixture
def names() -> Iterator[tuple[str, list[str]]]:
    base = f"/triton_mp_{os.getpid()}_test_answer_thread"
    rings = [base + "_r0", base + "_r1", base + "_r2"]
    for r in rings:
        Ring.create(r, 4096).close()
    create_wakeup("fifo", base + "_fifo")
    yield base + "_fifo", rings
    for name in [*rings, base + "_fifo"]:
        unlink_quietly(name)


def _wait_for(what: str, done: Callable[[], bool]) -> None:
    """Until ``done()`` (the thread runs beside this one); fails naming ``what`` after 10 s."""
    deadline = time.monotonic() + 10
    while not done():
        assert time.monotonic() < deadline, f"the thread never {what}"
        time.sleep(0.001)


def _armed_and_blocked(native: Any, fifo: str) -> bool:
    """The thread sleeps: it posted the FIFO's arm (``notify.Waiter.arm``) and blocks."""
    return bool(posix_ipc.Semaphore(fifo).value == 1)


def _readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


def test_every_record_reaches_python_in_ring_order_woken_through_the_fifo_arm(
    native: Any, names: tuple[str, list[str]]
) -> None:
    fifo, rings = names
    assert native.answer_thread_start(fifo, rings[:2], 256, False)
    assert not native.answer_thread_start(fifo, rings[:2], 256, False), "one thread at a time"
    _wait_for("slept armed", lambda: _armed_and_blocked(native, fifo))
    producers = [Ring.attach(r) for r in rings[:2]]
    waker = Waker(Wakeup("fifo", fifo))
    sent: list[list[bytes]] = [[], []]
    for i in range(40):
        record = bytes([i % 2]) + os.urandom(i * 13 % 200)
        producers[i % 2].push(record)
        sent[i % 2].append(record)
        if i % 7 == 0:
            waker.wake()
    waker.wake()
    got: list[bytes] = []
    _wait_for("queued all", lambda: got.extend(native.answer_thread_take()[0]) or len(got) == 40)
    assert [r for r in got if r[0] == 0] == sent[0]
    assert [r for r in got if r[0] == 1] == sent[1]
    stats = native.answer_thread_stats()
    assert stats["to_python"] == 40
    assert stats["served"] == 0
    _wait_for("slept armed again", lambda: _armed_and_blocked(native, fifo))
    assert not any(p.has_records() for p in producers)
    for p in producers:
        p.close()
    waker.close()


def test_python_is_woken_only_when_armed_and_early_wakes_only_when_it_awaits(
    native: Any, names: tuple[str, list[str]]
) -> None:
    fifo, rings = names
    assert native.answer_thread_start(fifo, rings[:1], 256, False)
    fd = native.answer_thread_fd()
    producer = Ring.attach(rings[0])
    waker = Waker(Wakeup("fifo", fifo))
    _wait_for("slept armed", lambda: _armed_and_blocked(native, fifo))
    # NOTE: not armed (Python polls between events): a record is queued, no write
    producer.push(b"a")
    waker.wake()
    _wait_for("queued it", native.answer_thread_pending)
    assert not _readable(fd)
    assert native.answer_thread_take() == ([b"a"], False)
    # NOTE: armed: the next record writes the eventfd, and takes the arm
    native.answer_thread_arm(False)
    producer.push(b"b")
    waker.wake()
    _wait_for("woke Python", lambda: _readable(fd))
    assert not native.answer_thread_disarm(), "the write took the arm"
    native.answer_thread_clear()
    assert not _readable(fd)
    assert native.answer_thread_take() == ([b"b"], False)
    # NOTE: an early wake (a byte, no record): passed on only while Python awaits answers
    _wait_for("slept armed", lambda: _armed_and_blocked(native, fifo))
    native.answer_thread_arm(False)
    before = native.answer_thread_stats()["sleeps"]
    waker.wake()
    _wait_for("slept again", lambda: native.answer_thread_stats()["sleeps"] > before)
    assert not _readable(fd)
    assert native.answer_thread_disarm(), "still armed: nothing was written"
    _wait_for("slept armed", lambda: _armed_and_blocked(native, fifo))
    native.answer_thread_arm(True)
    waker.wake()
    _wait_for("passed the early wake on", lambda: _readable(fd))
    native.answer_thread_clear()
    assert native.answer_thread_take() == ([], False)
    assert native.answer_thread_stats()["early_polls"] == 0, "no owned call awaited: no poll"
    producer.close()
    waker.close()


def test_a_removed_ring_is_read_first_an_added_one_after_a_wake_and_stop_leaves_the_rest(
    native: Any, names: tuple[str, list[str]]
) -> None:
    fifo, rings = names
    assert native.answer_thread_start(fifo, rings[:2], 256, False)
    _wait_for("slept armed", lambda: _armed_and_blocked(native, fifo))
    r1, r2 = Ring.attach(rings[1]), Ring.attach(rings[2])
    r1.push(b"left behind")  # NOTE: no wake: its producer died
    assert native.answer_thread_remove_ring(rings[1])
    assert not native.answer_thread_remove_ring(rings[1])
    assert native.answer_thread_take() == ([b"left behind"], False)
    r1.push(b"not read")
    r2.push(b"new ring")
    assert native.answer_thread_add_ring(rings[2])
    assert native.answer_thread_add_ring(rings[2].lstrip("/")), "attached already"
    assert not native.answer_thread_add_ring(rings[2] + "_none")
    native.answer_thread_wake()
    _wait_for("read the new ring", native.answer_thread_pending)
    assert native.answer_thread_take() == ([b"new ring"], False)
    native.answer_thread_stop()
    r2.push(b"after stop")
    time.sleep(0.01)
    assert r1.pop_all() == [b"not read"]
    assert r2.pop_all() == [b"after stop"]
    assert native.answer_thread_stats() is None
    r1.close()
    r2.close()


class _Waiter:
    def __init__(self, fd: int) -> None:
        self._fd = fd

    def fileno(self) -> int:
        return self._fd


class _Inbox:
    """``ipc.Inbox``'s surface that InboxHandler uses (its rings are the thread's)."""

    def __init__(self, fifo: str, rings: list[str]) -> None:
        self.wakeup = Wakeup("fifo", fifo)
        self.waiter = _Waiter(-7)
        self._rings = rings

    def ring_names(self) -> tuple[str, ...]:
        return tuple(self._rings)

    def decode_buffer(self, record: Any) -> Any:
        return InferResponse(request_id=int(bytes(record)), version=1)

    def drain(self, read: Any = None) -> list[Any]:
        return []


class _Loop:
    def __init__(self) -> None:
        self.readers: dict[int, Any] = {}

    def add_reader(self, fd: int, callback: Any) -> None:
        self.readers[fd] = callback

    def remove_reader(self, fd: int) -> bool:
        return self.readers.pop(fd, None) is not None


class _Selector:
    def __init__(self) -> None:
        self.watched: list[Any] = []

    def watch(self, source: Any, outstanding: Any = None) -> None:
        self.watched.append(source)


class _Pending:
    def __init__(self) -> None:
        self.delivered: list[Any] = []

    def __len__(self) -> int:
        return 0

    def deliver(self, msgs: Any) -> None:
        self.delivered.extend(msgs)


def test_the_handler_watches_the_queue_settles_each_drain_and_applies_it_before_the_rings(
    native: Any, names: tuple[str, list[str]]
) -> None:
    fifo, rings = names
    inbox, pending = _Inbox(fifo, rings[:1]), _Pending()
    handler = InboxHandler(inbox, pending, None, None, None)  # type: ignore[arg-type]
    assert handler.fifo() == (fifo, tuple(rings[:1]))
    q = AnswerQueue.start(native, fifo, tuple(rings[:1]), 256, inbox.decode_buffer, len)
    assert q is not None
    loop, selector = _Loop(), _Selector()
    handler.watch(loop, selector, lambda: 0)  # type: ignore[arg-type]
    assert list(loop.readers) == [-7]
    assert selector.watched[-1] is inbox
    settles: list[int] = []
    handler.read_through(q, lambda: settles.append(1))
    assert list(loop.readers) == [q.waiter.fileno()]
    assert selector.watched[-1] is q
    producer = Ring.attach(rings[0])
    producer.push(b"5")
    native.answer_thread_wake()
    _wait_for("queued it", q.has_pending)
    loop.readers[q.waiter.fileno()]()  # NOTE: the loop's drain of the queue
    assert settles == [1]
    assert [m.request_id for m in pending.delivered] == [5]
    producer.push(b"6")
    native.answer_thread_wake()
    _wait_for("queued it", q.has_pending)
    q.stop()  # NOTE: queued, not drained: applied before the rings are read again
    handler.read_through(None, lambda: None)
    assert settles == [1, 1]
    assert [m.request_id for m in pending.delivered] == [5, 6]
    assert selector.watched[-1] is inbox
    assert list(loop.readers) == [-7]
    handler.unwatch()
    assert loop.readers == {}
    assert selector.watched[-1] is None
    producer.close()
