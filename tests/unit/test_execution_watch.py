"""``workers.execution_watch``: the inbox read while a batch executes (no processes)."""

from __future__ import annotations

import threading

from triton_mp.workers.execution_watch import ExecutionWatch


class FakeInbox:
    """An inbox whose rings are a list (thread-safe enough for the test)."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self.lock = threading.Lock()
        self.polls = 0
        self.drains = 0

    def push(self, item: str) -> None:
        with self.lock:
            self.items.append(item)

    def has_pending(self) -> bool:
        self.polls += 1
        return bool(self.items)

    def drain(self) -> list[str]:
        self.drains += 1
        with self.lock:
            out, self.items = self.items, []
            return out


def _cancels(applied: list[str]):  # noqa: ANN202 - a test helper
    def apply(msg: str) -> bool:
        if msg.startswith("cancel"):
            applied.append(msg)
            return True
        return False

    return apply


def test_between_batches_the_watch_reads_nothing() -> None:
    inbox = FakeInbox()
    applied: list[str] = []
    watch = ExecutionWatch(inbox, lambda m: applied.append(m) or True)
    inbox.push("cancel")
    watch.poll()
    assert (applied, inbox.items, inbox.polls) == ([], ["cancel"], 0)
    assert watch.take() == ["cancel"]


def test_during_a_batch_cancels_apply_at_once_and_the_rest_waits_in_order() -> None:
    inbox = FakeInbox()
    applied: list[str] = []
    watch = ExecutionWatch(inbox, _cancels(applied))
    watch.begin()
    inbox.push("batch")
    inbox.push("cancel-1")
    inbox.push("shutdown")
    watch.poll()
    assert applied == ["cancel-1"]
    inbox.push("cancel-2")
    watch.end()
    watch.poll()
    assert applied == ["cancel-1"]
    inbox.push("late")
    assert watch.take() == ["batch", "shutdown", "cancel-2", "late"]


def test_a_batch_costs_no_poll_unless_the_model_asks() -> None:
    """begin/end alone never look at the rings: a model that never calls is_cancelled()
    pays nothing per batch (no thread, no wake-up)."""
    inbox = FakeInbox()
    watch = ExecutionWatch(inbox, _cancels([]))
    for _ in range(100):
        watch.begin()
        inbox.push("cancel")
        watch.end()
    assert inbox.polls == 0
    assert all(t.name != "execution-watch" for t in threading.enumerate())
    assert len(watch.take()) == 100


def test_a_model_thread_polls_while_the_batch_runs() -> None:
    """is_cancelled() from a thread the model started (a decoupled sender) reads the inbox
    too, while the loop's thread is inside execute."""
    inbox = FakeInbox()
    applied: list[str] = []
    watch = ExecutionWatch(inbox, _cancels(applied))
    watch.begin()
    inbox.push("cancel-7")
    t = threading.Thread(target=watch.poll)
    t.start()
    t.join()
    watch.end()
    assert applied == ["cancel-7"]
    assert watch.take() == []


def test_an_empty_take_drains_nothing_and_kept_messages_come_first() -> None:
    inbox = FakeInbox()
    watch = ExecutionWatch(inbox, _cancels([]))
    assert watch.take() == []
    assert inbox.drains == 0  # NOTE: one poll of the rings, no drain, no lock
    watch.begin()
    inbox.push("batch-1")
    watch.poll()
    watch.end()
    assert watch.take() == ["batch-1"]  # NOTE: kept, the rings empty
    inbox.push("batch-2")
    assert watch.take() == ["batch-2"]


def test_a_take_after_a_wait_drains_without_looking_first() -> None:
    """The loop's wait returned on a record: ``take(pending=True)`` drains at once (no poll
    of the rings before it), kept messages still first."""
    inbox = FakeInbox()
    watch = ExecutionWatch(inbox, _cancels([]))
    watch.begin()
    inbox.push("batch-1")
    watch.poll()
    watch.end()
    inbox.push("batch-2")
    polls = inbox.polls
    assert watch.take(pending=True) == ["batch-1", "batch-2"]
    assert inbox.polls == polls
    assert inbox.drains == 2
