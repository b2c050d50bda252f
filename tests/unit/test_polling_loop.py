"""The frontend's polling selector: records in the inbox rings wake the loop without a
FIFO byte while it runs, and an armed FIFO wakes it when it blocks."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest

from triton_mp.frontend.dispatch import linger, polling_loop
from triton_mp.frontend.dispatch.polling_loop import PollingSelector
from triton_mp.ipc import Inbox, Sender, encode
from triton_mp.ipc.memory.notify import Wakeup, create_wakeup
from triton_mp.ipc.memory.ring import Ring
from triton_mp.ipc.memory.shm import unlink_quietly


@pytest.fixture
def names() -> Iterator[tuple[str, str]]:
    base = f"/triton_mp_{os.getpid()}_test_poll"
    ring, fifo = base + "_r", base + "_fifo"
    Ring.create(ring, 4096).close()
    create_wakeup("fifo", fifo)
    yield ring, fifo
    unlink_quietly(ring)
    unlink_quietly(fifo)


def _polled_inbox(
    names: tuple[str, str],
) -> tuple[Inbox[int], Sender, PollingSelector, asyncio.SelectorEventLoop]:
    """An inbox on the ``names`` ring and FIFO, its sender, and a loop on a PollingSelector."""
    ring, fifo = names
    wakeup = Wakeup("fifo", fifo)
    inbox: Inbox[int] = Inbox(wakeup, [ring], int)
    sender = Sender(ring, wakeup)
    selector = PollingSelector()
    return inbox, sender, selector, asyncio.SelectorEventLoop(selector)


def _run(
    loop: asyncio.AbstractEventLoop,
    main: Callable[[], Coroutine[Any, Any, None]],
    *closers: Callable[[], None],
) -> None:
    """``main()`` on ``loop``; then the loop and ``closers`` are closed, in order, whatever
    happened."""
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
        for close in closers:
            close()


def _serve_until(
    loop: asyncio.AbstractEventLoop,
    inbox: Inbox[int],
    sender: Sender,
    selector: PollingSelector,
    on_wakeup: Callable[[], None],
    outstanding: int,
    produce: Callable[[], None],
    done: asyncio.Event,
    settle: bool = False,
) -> None:
    """Run ``loop`` reading ``inbox`` (``on_wakeup`` per wake-up), watched with ``outstanding``
    answers awaited, while ``produce`` runs on a plain thread (not the loop's executor, whose
    completion would wake the loop itself), until ``done`` (5 s at most); ``settle``: one more
    pass before the watch ends. Then the loop, ``sender`` and ``inbox`` are closed."""

    async def main() -> None:
        loop.add_reader(inbox.waiter.fileno(), on_wakeup)
        selector.watch(inbox, lambda: outstanding)
        producer = threading.Thread(target=produce)
        producer.start()
        await asyncio.wait_for(done.wait(), 5)
        producer.join()
        if settle:
            await asyncio.sleep(0)  # NOTE: the select after the last record's ran
        selector.watch(None)
        loop.remove_reader(inbox.waiter.fileno())

    _run(loop, main, sender.close, inbox.close)


def test_records_reach_the_reader_with_and_without_blocking(names: tuple[str, str]) -> None:
    inbox, sender, selector, loop = _polled_inbox(names)
    got: list[int] = []
    done = asyncio.Event()

    def on_wakeup() -> None:
        got.extend(inbox.drain())
        if len(got) >= 3:
            done.set()

    async def main() -> None:
        loop.add_reader(inbox.waiter.fileno(), on_wakeup)
        selector.watch(inbox)
        sender.send(1)  # the loop is running: polled, no byte needed
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert got == [1]
        # Blocked in epoll with no timer due: only the armed FIFO can wake it. A plain
        # thread (not the loop's executor, whose completion would wake the loop itself).
        t0 = time.monotonic()
        producer = threading.Thread(
            target=lambda: (time.sleep(0.05), sender.send(2), sender.send(3))
        )
        producer.start()
        await asyncio.wait_for(done.wait(), 5)
        producer.join()
        assert got == [1, 2, 3]
        assert time.monotonic() - t0 < 4
        selector.watch(None)
        loop.remove_reader(inbox.waiter.fileno())

    _run(loop, main, sender.close, inbox.close)


def test_pass_end_callbacks_run_before_each_poll_and_a_failing_one_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``at_pass_end``: every callback runs at the start of each ``select`` (after the
    pass's callbacks: what they queued is seen), in order; one that raises is logged and
    the loop goes on."""
    selector = PollingSelector()
    loop = asyncio.SelectorEventLoop(selector)
    seen: list[object] = []
    queued: list[int] = []

    def boom() -> None:
        raise RuntimeError("boom")

    selector.at_pass_end(lambda: seen.append(tuple(queued)))
    selector.at_pass_end(boom)

    async def main() -> None:
        queued.append(1)  # NOTE: this pass's work: the next select sees it
        await asyncio.sleep(0)
        queued.append(2)
        await asyncio.sleep(0)

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    assert (1,) in seen
    assert (1, 2) in seen
    assert seen.index((1,)) < seen.index((1, 2))
    assert "pass-end callback failed" in caplog.text


def _run_early_wake(
    names: tuple[str, str],
    outstanding: int,
    monkeypatch: pytest.MonkeyPatch,
    busy: list[int] | None = None,
) -> tuple[list[int], int]:
    """Block the loop, wake it with no record (a worker's early wake), push a record with no
    wake at all once the loop polls (or after 0.3 s), and a woken one 0.2 s later; returns
    what the loop got before that and its early polls. ``busy``: each yield between two
    polls takes 1 ms, as when another task wants the vCPU, and is counted there."""
    # NOTE: a long poll, never cut short by other tasks unless ``busy``: the test does not
    # depend on how fast or how loaded this machine is.
    monkeypatch.setattr(polling_loop, "PREWAKE_POLL_S", 2.0)
    monkeypatch.setattr(polling_loop, "BUSY_YIELD_S", 0.0005 if busy is not None else 1.0)
    monkeypatch.setattr(linger, "DUE_POLL_S", 0.0)  # NOTE: the early wake's poll alone
    if busy is not None:
        yields = busy

        def slow_yield() -> None:
            yields.append(1)
            time.sleep(0.001)

        monkeypatch.setattr(polling_loop.os, "sched_yield", slow_yield)
    inbox, sender, selector, loop = _polled_inbox(names)
    got: list[int] = []
    by_then: list[int] = []
    done = asyncio.Event()

    drained = threading.Event()  # NOTE: the loop drained its inbox at least once

    def on_wakeup() -> None:
        got.extend(inbox.drain())
        drained.set()
        if 8 in got:
            done.set()

    def produce() -> None:
        time.sleep(0.05)  # NOTE: the loop blocks meanwhile (no timer but wait_for's)
        sender.wake()  # the loop is blocked and armed: one byte, nothing in the ring
        until = time.monotonic() + 0.3
        while not selector.early_polls and time.monotonic() < until:
            time.sleep(0.0001)
        if busy is not None:
            drained.wait(2)  # NOTE: the poll was cut short, and the loop drained
        sender.push_quiet(encode(7))  # no byte: only a polling loop sees it
        time.sleep(0.2)
        by_then.extend(got)
        sender.send(8)

    _serve_until(loop, inbox, sender, selector, on_wakeup, outstanding, produce, done)
    return by_then, selector.early_polls


def test_an_early_wake_with_answers_outstanding_polls_for_the_answer(
    names: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``PREWAKE_POLL_S``: after a wake that found no record, with answers outstanding, the
    loop polls its rings: a record pushed without a byte right after is taken at once."""
    by_then, polls = _run_early_wake(names, 1, monkeypatch)
    assert by_then == [7]
    assert polls >= 1


def test_an_early_wake_poll_stops_when_another_task_wants_the_cpu(
    names: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``BUSY_YIELD_S``: a yield between two polls that let another task run ends the poll
    at once, long before ``PREWAKE_POLL_S``."""
    yields: list[int] = []
    _by_then, polls = _run_early_wake(names, 1, monkeypatch, busy=yields)
    assert polls == 1
    assert len(yields) == 1


def test_an_early_wake_with_nothing_outstanding_does_not_poll(
    names: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No answer awaited: the loop blocks again at once (the quiet record waits for the
    next byte), so a stray wake never makes an idle frontend poll."""
    by_then, polls = _run_early_wake(names, 0, monkeypatch)
    assert by_then == []
    assert polls == 0


def test_the_loop_polls_after_answers_only_while_the_next_event_follows_at_once(
    names: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``frontend.dispatch.linger``: a client that comes back ~0.1 ms after each answer
    makes the loop poll before blocking; one that comes back 10x ``LINGER_S`` later stops it
    after one poll at most."""
    monkeypatch.setattr(polling_loop, "BUSY_YIELD_S", 1.0)  # NOTE: however loaded the machine
    # NOTE: a 20 ms window against clients back after 0.1 ms and 200 ms: the verdict cannot
    # turn on this machine's load (at 250 us it failed once at load 9)
    monkeypatch.setattr(linger, "LINGER_S", 0.02)
    inbox, sender, selector, loop = _polled_inbox(names)
    rfd, wfd = os.pipe()
    requests = 0
    done = asyncio.Event()
    lingers: list[int] = []

    def on_request() -> None:
        nonlocal requests
        before = requests
        requests += len(os.read(rfd, 64))  # NOTE: a late loop reads two requests at once
        if before < 20 <= requests or before < 30 <= requests:
            lingers.append(selector.lingers)
        if requests >= 30:
            done.set()

    def client(n: int, after_s: float) -> None:
        for _ in range(n):
            time.sleep(0.002)
            sender.send(1)  # an answer
            time.sleep(after_s)
            os.write(wfd, b"r")  # the client's next request

    async def main() -> None:
        loop.add_reader(inbox.waiter.fileno(), inbox.drain)
        loop.add_reader(rfd, on_request)
        selector.watch(inbox)
        producer = threading.Thread(target=lambda: (client(20, 0.0001), client(10, 0.2)))
        producer.start()
        await asyncio.wait_for(done.wait(), 10)
        producer.join()
        selector.watch(None)
        loop.remove_reader(inbox.waiter.fileno())
        loop.remove_reader(rfd)

    _run(loop, main, sender.close, inbox.close, lambda: os.close(rfd), lambda: os.close(wfd))
    fast, slow = lingers
    assert fast >= 3
    assert slow - fast <= 1


def test_an_awaited_answer_is_polled_for_while_answers_come_soon(
    names: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``linger.AnswerDue``: with an answer outstanding the loop polls before it blocks, so
    an answer pushed without a byte is taken; after an answer that came later than
    ``DUE_POLL_S`` it blocks at once (the next quiet record waits for a byte)."""
    monkeypatch.setattr(polling_loop, "BUSY_YIELD_S", 1.0)  # NOTE: however loaded the machine
    monkeypatch.setattr(linger, "DUE_POLL_S", 0.5)
    inbox, sender, selector, loop = _polled_inbox(names)
    selector.linger.pays = True  # NOTE: as after a client that came back at once
    got: list[int] = []
    seen: dict[str, list[int]] = {}
    done = asyncio.Event()

    def on_wakeup() -> None:
        got.extend(inbox.drain())
        if 4 in got:
            done.set()

    def produce() -> None:
        time.sleep(0.05)
        sender.push_quiet(encode(1))  # no byte: only a polling loop sees it
        time.sleep(0.3)
        seen["polled"] = list(got)
        time.sleep(0.5)  # NOTE: 0.85 s after the loop began to wait: past DUE_POLL_S
        sender.send(2)
        time.sleep(0.05)
        sender.push_quiet(encode(3))
        time.sleep(0.3)
        seen["blocked"] = list(got)
        sender.send(4)

    _serve_until(loop, inbox, sender, selector, on_wakeup, 1, produce, done)
    assert seen["polled"] == [1]
    assert seen["blocked"] == [1, 2]
    assert got == [1, 2, 3, 4]


@pytest.mark.parametrize(("outstanding", "dense"), [(0, True), (1, False)])
def test_no_poll_for_answers_when_idle_or_when_the_client_pauses(
    names: tuple[str, str], monkeypatch: pytest.MonkeyPatch, outstanding: int, dense: bool
) -> None:
    """An idle loop (no answer awaited), or one whose client does not come back at once
    (``Linger.pays`` False), blocks at once: a record pushed without a byte waits for the
    next byte."""
    monkeypatch.setattr(polling_loop, "BUSY_YIELD_S", 1.0)
    monkeypatch.setattr(linger, "DUE_POLL_S", 0.5)
    inbox, sender, selector, loop = _polled_inbox(names)
    selector.linger.pays = dense
    got: list[int] = []
    seen: list[int] = []
    done = asyncio.Event()

    def on_wakeup() -> None:
        got.extend(inbox.drain())
        if 2 in got:
            done.set()

    def produce() -> None:
        time.sleep(0.05)
        sender.push_quiet(encode(1))
        time.sleep(0.3)
        seen.extend(got)
        sender.send(2)

    _serve_until(loop, inbox, sender, selector, on_wakeup, outstanding, produce, done)
    assert seen == []
    assert selector.due_polls == 0
    assert got == [1, 2]


def test_the_wait_after_an_early_wake_does_not_teach_that_answers_come_soon(
    names: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batching delay: the first wait after a request is long (no poll for answers after
    it), the worker's early wake comes late in the batch, its poll runs out, and the answer
    follows a short wait; that wait must not turn the polls for answers back on (each
    request would then poll ``DUE_POLL_S`` for nothing)."""
    monkeypatch.setattr(polling_loop, "BUSY_YIELD_S", 1.0)
    monkeypatch.setattr(polling_loop, "PREWAKE_POLL_S", 0.01)
    monkeypatch.setattr(linger, "DUE_POLL_S", 0.1)
    inbox, sender, selector, loop = _polled_inbox(names)
    selector.linger.pays = True
    done = asyncio.Event()
    got: list[int] = []

    def on_wakeup() -> None:
        got.extend(inbox.drain())
        if got:
            done.set()

    def produce() -> None:
        time.sleep(0.3)  # NOTE: past DUE_POLL_S: the loop blocked
        sender.wake()  # the early wake: a byte, no record
        until = time.monotonic() + 1.0
        while not selector.early_polls and time.monotonic() < until:
            time.sleep(0.0001)
        time.sleep(0.03)  # NOTE: the early poll (10 ms) ran out; the loop blocked again
        sender.send(1)

    _serve_until(loop, inbox, sender, selector, on_wakeup, 1, produce, done, settle=True)
    assert got == [1]
    assert selector.early_polls == 1
    assert not selector.due.pays
