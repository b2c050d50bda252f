"""The frontend's polling selector: records in the inbox rings wake the loop without a
FIFO byte while it runs, and an armed FIFO wakes it when it blocks."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator

import pytest

from triton_mp.frontend.dispatch.polling_loop import PollingSelector
from triton_mp.ipc import Inbox, Sender
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


def test_records_reach_the_reader_with_and_without_blocking(names: tuple[str, str]) -> None:
    ring, fifo = names
    wakeup = Wakeup("fifo", fifo)
    inbox: Inbox[int] = Inbox(wakeup, [ring], int)
    sender = Sender(ring, wakeup)
    selector = PollingSelector()
    loop = asyncio.SelectorEventLoop(selector)
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

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
        sender.close()
        inbox.close()


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
