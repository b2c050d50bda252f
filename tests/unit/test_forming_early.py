"""The scheduler's loop reads the requests pushed while a pass handled its drain in that
pass, and stores the forming words before its dispatch (``scheduler.main._forming_early``):
the requests that raced the first request of a batch cost no pass of their own, and the
batch leaves at the same time with the same requests."""

from __future__ import annotations

import pytest

from tests.unit.scheduler_harness import US, Harness, fe, model_spec
from triton_mp.ipc.protocol.messages import (
    BatchAssign,
    BlockRef,
    InferRequest,
    Shutdown,
    TensorRef,
)
from triton_mp.ipc.protocol.specs import BatchingSpec
from triton_mp.ipc.recordio.records import decode_request
from triton_mp.scheduler import main as scheduler_main
from triton_mp.scheduler.forming import NOT_FORMING, Forming
from triton_mp.scheduler.main import _serve
from triton_mp.scheduler.outbox import Outbound, ToInstance
from triton_mp.scheduler.policies.clock import FakeClock


def _request(rid: int, arrival_ns: int) -> InferRequest:
    seg = "/triton_mp_0_f0_a0"
    return InferRequest(
        request_id=rid,
        reply_to=fe(0),
        model="add_sub",
        version=1,
        batch_size=1,
        inputs=(
            TensorRef("INPUT0", "FP32", (1, 16), seg, 64 * rid, 64),
            TensorRef("INPUT1", "FP32", (1, 16), seg, 64 * rid + 64, 64),
        ),
        outputs=("OUTPUT0",),
        block=BlockRef(seg, 64 * rid - 64),
        arrival_ns=arrival_ns,
    )


class _Waiter:
    def __init__(self, events: list[str]) -> None:
        self.events = events

    def consume_all(self) -> None:
        self.events.append("consume")


class _Inbox:
    """The inbox as ``_serve`` uses it, on a fake clock. ``rings``: what each drain finds;
    ``pending``: what ``has_pending`` answers in turn (then False). A timed sleep runs to
    its end, an untimed one ends at once (a post), the poll runs to its end."""

    def __init__(
        self,
        clock: FakeClock,
        events: list[str],
        rings: list[list[object]],
        pending: list[bool],
    ) -> None:
        self.clock, self.events, self.rings, self.pending = clock, events, rings, pending
        self.waiter = _Waiter(events)

    def wait(self, timeout_s: float | None) -> bool:
        self.events.append("wait" if timeout_s is None else f"sleep {timeout_s > 0}")
        if timeout_s:
            self.clock.advance_us(round(timeout_s * 1e6))
            return False
        return True

    def poll(self, timeout_s: float) -> bool:
        self.events.append("poll")
        self.clock.advance_us(round(timeout_s * 1e6))
        return False

    def drain(self) -> list[object]:
        self.events.append("drain")
        self.clock.advance_us(5)
        return self.rings.pop(0) if self.rings else []

    def has_pending(self) -> bool:
        return self.pending.pop(0) if self.pending else False

    def found(self) -> None:
        self.events.append("found")


class _Router:
    frontends = 1

    def __init__(self, clock: FakeClock, events: list[str]) -> None:
        self.clock, self.events = clock, events
        self.words: Forming = NOT_FORMING
        self.assigns: list[tuple[int, BatchAssign]] = []

    def quiet_done(self, quiet: frozenset[int]) -> bool:
        return False

    def quiet_requests(self, mask: int) -> bool:
        return False

    def forming(self, forming: Forming) -> bool:
        if forming == self.words:
            return False
        self.words = forming
        self.events.append(f"forming {forming.rows}")
        return True

    def send(self, item: Outbound) -> None:
        assert isinstance(item, ToInstance)
        if isinstance(item.msg, BatchAssign):
            self.assigns.append((self.clock.now_ns(), item.msg))
        self.events.append(type(item.msg).__name__)

    def flush(self) -> None:
        self.events.append("flush")


def _loop(
    pending: list[bool], monkeypatch: pytest.MonkeyPatch
) -> tuple[list[str], _Router, int, int]:
    """One batch: the first request wakes a pass, a second is pushed (with a post) while
    that pass handles the first, nothing else comes before the delay runs out; a
    ``Shutdown`` ends the loop. Returns the events, the router, the passes and when the
    first request arrived."""
    spec = model_spec(
        "add_sub",
        (0, 1),
        batching=BatchingSpec(kind="dynamic", max_batch_size=8, max_queue_delay_us=500),
    )
    h = Harness(models=(spec,))
    h.ready(0, 1)
    start = h.now
    events: list[str] = []
    rings: list[list[object]] = [[_request(1, start)], [_request(2, start + 3 * US)], []]
    inbox = _Inbox(h.clock, events, rings, pending)
    router = _Router(h.clock, events)
    monkeypatch.setattr(scheduler_main.os, "sched_yield", lambda: None)

    def shutdown_after_the_batch() -> list[object]:
        events.append("drain")
        if rings:
            return rings.pop(0)
        return [Shutdown()] if router.assigns else []

    inbox.drain = shutdown_after_the_batch  # type: ignore[method-assign]
    passes = _serve(h.core, inbox, router, h.clock)  # type: ignore[arg-type]
    return events, router, passes, start


def test_a_request_pushed_while_the_first_is_handled_is_read_in_the_same_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # has_pending: after the pass's handling (the second request's post), then after the
    # forming words were stored (nothing), then before the sleep: nothing.
    events, router, passes, start = _loop([True, False], monkeypatch)
    first = events.index("drain")
    # the racing request is read before the pass's dispatch and the words are stored
    # before it: the loop's next wait is the timed sleep to the delay's lead
    assert events[first : first + 5] == ["drain", "consume", "found", "drain", "forming 5"]
    assert events[first + 5 : first + 7] == ["flush", "sleep True"]
    (sent_at, assign), *_ = router.assigns
    assert [decode_request(r).request_id for r in assign.requests] == [1, 2]
    assert sent_at >= start + 500 * US
    assert passes == 3  # the first request's, the due pass, the Shutdown's


def test_words_changed_with_a_record_pending_after_the_fence_recheck_before_the_sleep(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # has_pending: the second request's post; after the words were stored: a record (it
    # may have been counted under the old words): the loop must not sleep before a drain.
    events, router, passes, _ = _loop([True, True, True], monkeypatch)
    first = events.index("drain")
    assert events[first : first + 5] == ["drain", "consume", "found", "drain", "forming 5"]
    assert events[first + 5 : first + 7] == ["flush", "sleep False"]  # no sleep: a pass
    assert passes == 4
