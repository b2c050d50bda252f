"""``workers.execution_watch``: the inbox read while a batch executes (no processes)."""

from __future__ import annotations

import threading
import time

from triton_mp.workers.execution_watch import ExecutionWatch


class FakeInbox:
    """An inbox whose rings are a list (thread-safe enough for the test)."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self.lock = threading.Lock()

    def push(self, item: str) -> None:
        with self.lock:
            self.items.append(item)

    def has_pending(self) -> bool:
        return bool(self.items)

    def drain(self) -> list[str]:
        with self.lock:
            out, self.items = self.items, []
            return out


def test_between_batches_the_watch_reads_nothing() -> None:
    inbox = FakeInbox()
    applied: list[str] = []
    watch = ExecutionWatch(inbox, lambda m: applied.append(m) or True, poll_s=0.001)
    inbox.push("cancel")
    watch.poll()
    assert (applied, inbox.items) == ([], ["cancel"])
    assert watch.take() == ["cancel"]


def test_during_a_batch_cancels_apply_at_once_and_the_rest_waits_in_order() -> None:
    inbox = FakeInbox()
    applied: list[str] = []

    def apply(msg: str) -> bool:
        if msg.startswith("cancel"):
            applied.append(msg)
            return True
        return False

    watch = ExecutionWatch(inbox, apply, poll_s=0.001)
    watch.begin()
    try:
        inbox.push("batch")
        inbox.push("cancel-1")
        inbox.push("shutdown")
        deadline = time.monotonic() + 5
        while not applied and time.monotonic() < deadline:
            time.sleep(0.005)
        assert applied == ["cancel-1"]
    finally:
        watch.end()
    inbox.push("late")
    assert watch.take() == ["batch", "shutdown", "late"]
    watch.stop()
