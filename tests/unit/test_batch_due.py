"""The due-batch notice, process-free: when the scheduler's loop polls instead of sleeping
(``scheduler.policies.clock.wait_plan``), which instance it tells a batch is due and when
(``Policy.due_batch``, ``SchedulerCore.due_notices``), how long the worker then polls
(``workers.due.DueBatch``), and ``Inbox.poll`` on a real ring."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from tests.helpers.ring_channel import ring_channel
from tests.unit.scheduler_harness import US, Harness, model_spec
from triton_mp.ipc import Inbox
from triton_mp.ipc.memory.notify import Wakeup, create_wakeup
from triton_mp.ipc.memory.ring import Ring
from triton_mp.ipc.memory.shm import unlink_quietly
from triton_mp.ipc.protocol.messages import BatchAssign, BatchDue, Shutdown, ToScheduler, ToWorker
from triton_mp.ipc.protocol.specs import (
    BatchingSpec,
    ChannelSpec,
    InboxSpec,
    LogSpec,
    SchedulerSpec,
)
from triton_mp.scheduler import main as scheduler_main
from triton_mp.scheduler.main import Router, _serve
from triton_mp.scheduler.outbox import Outbound, ToInstance
from triton_mp.scheduler.policies.clock import (
    DUE_LEAD_NS,
    LATE_QUANTILE,
    LEAD_MARGIN_NS,
    MAX_LEAD_NS,
    MIN_LEAD_NS,
    FakeClock,
    WakeLead,
    wait_plan,
)
from triton_mp.scheduler.policies.default import DefaultScheduler
from triton_mp.scheduler.policies.dynamic import DynamicBatcher
from triton_mp.scheduler.policies.policy import Queued
from triton_mp.workers.due import (
    MAX_POLL_NS,
    POLL_GRACE_NS,
    POLL_MAX_REQUESTS,
    SIZE_WEIGHT,
    DueBatch,
)

# ------------------------------------------------------------------ wait_plan


def test_no_deadline_sleeps_until_a_message() -> None:
    assert wait_plan(5_000, None) == (None, 0.0)


def test_a_far_deadline_sleeps_until_the_lead_then_polls_to_it() -> None:
    now = 1_000_000
    sleep_s, poll_s = wait_plan(now, now + 500 * US, lead_ns=100 * US)
    assert sleep_s == pytest.approx(400e-6)
    assert poll_s == pytest.approx(100e-6)


def test_within_the_lead_it_polls_to_the_deadline_without_sleeping() -> None:
    now = 1_000_000
    assert wait_plan(now, now + 30 * US, lead_ns=100 * US) == (0.0, pytest.approx(30e-6))


def test_a_deadline_due_or_past_does_not_wait() -> None:
    assert wait_plan(1_000, 1_000) == (0.0, 0.0)
    assert wait_plan(2_000, 1_000) == (0.0, 0.0)
    assert wait_plan(0, 0) == (0.0, 0.0)  # a retirement due (next_deadline_ns 0)


def test_the_default_lead_is_a_few_tens_of_microseconds() -> None:
    assert 20 * US <= DUE_LEAD_NS <= 200 * US


# ------------------------------------------------------------------ WakeLead


def test_the_lead_starts_at_the_default() -> None:
    assert WakeLead().lead_ns == DUE_LEAD_NS


def _feed(lead: WakeLead, samples: list[int]) -> None:
    for late in samples:
        lead.slept(late)


def test_the_lead_follows_the_late_quantile_of_the_sleeps_plus_the_notice() -> None:
    # sleeps that end 20-80 µs late, evenly: the median is ~50 µs
    rng = random.Random(34)
    samples = [rng.randrange(20 * US, 80 * US) for _ in range(6000)]
    lead = WakeLead()
    _feed(lead, samples[:3000])
    # NOTE: a streaming estimate wanders around the quantile (a few µs): its mean over
    # the second half sits on it.
    seen = []
    for late in samples[3000:]:
        lead.slept(late)
        seen.append(lead.late_ns)
    want = sorted(samples)[int(len(samples) * LATE_QUANTILE)]
    assert abs(sum(seen) / len(seen) - want) < 3 * US
    assert abs(lead.late_ns - want) < 12 * US
    assert lead.lead_ns == lead.late_ns + LEAD_MARGIN_NS


def test_punctual_sleeps_bring_the_lead_down_to_the_notice() -> None:
    lead = WakeLead()
    _feed(lead, [2 * US] * 2000)
    assert lead.late_ns < 5 * US
    assert lead.lead_ns < DUE_LEAD_NS - 50 * US
    _feed(lead, [-10 * US] * 2000)  # early: never below the notice's own time
    assert lead.lead_ns == MIN_LEAD_NS


def test_a_burst_of_very_late_sleeps_is_capped_and_forgotten() -> None:
    lead = WakeLead()
    _feed(lead, [3_000 * US] * 1000)  # milliseconds late under load: not chased
    assert lead.lead_ns == MAX_LEAD_NS
    _feed(lead, [30 * US] * 2000)  # the load goes: back within a few thousand sleeps
    assert lead.lead_ns < DUE_LEAD_NS


# ------------------------------------------------------------------ the loop


class _LoopInbox:
    """The scheduler's inbox as ``_serve`` uses it, on a fake clock: a timed sleep ends
    ``late_us`` late, the poll runs to its end, the drains give ``msgs`` in turn."""

    def __init__(self, clock: FakeClock, events: list[tuple[str, object]], late_us: int) -> None:
        self.clock, self.events, self.late_us = clock, events, late_us
        self.drains: list[list[object]] = [[], [Shutdown()]]

    def wait(self, timeout_s: float | None) -> bool:
        self.events.append(("wait", timeout_s))
        if timeout_s is None:
            return True  # the Shutdown's post
        self.clock.advance_us(round(timeout_s * 1e6) + self.late_us)
        return False

    def poll(self, timeout_s: float) -> bool:
        self.events.append(("poll", self.clock.now_ns()))
        self.clock.advance_us(round(timeout_s * 1e6))
        return False

    def drain(self) -> list[object]:
        return self.drains.pop(0)

    def has_pending(self) -> bool:
        return False


class _LoopRouter:
    """The router as ``_serve`` uses it: what it sends and when it flushes."""

    frontends = 1

    def __init__(self, clock: FakeClock, events: list[tuple[str, object]], flush_us: int) -> None:
        self.clock, self.events, self.flush_us = clock, events, flush_us

    def quiet_done(self, quiet: frozenset[int]) -> bool:
        return False

    def quiet_requests(self, mask: int) -> bool:
        return False

    def forming(self, forming: object) -> bool:
        return False

    def send(self, item: Outbound) -> None:
        assert isinstance(item, ToInstance)
        self.events.append((type(item.msg).__name__, self.clock.now_ns()))

    def flush(self) -> None:
        self.events.append(("flush", None))
        self.clock.advance_us(self.flush_us)


def test_the_loop_notices_the_worker_before_the_deadline_and_learns_how_late_it_polled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = model_spec(
        "add_sub",
        (0, 1),
        batching=BatchingSpec(kind="dynamic", max_batch_size=8, max_queue_delay_us=500),
    )
    h = Harness(models=(spec,))
    h.ready(0, 1)
    h.request()
    deadline = h.core.next_deadline_ns()
    assert deadline is not None
    start = h.now
    events: list[tuple[str, object]] = []
    inbox = _LoopInbox(h.clock, events, late_us=30)
    # the notice's post costs 60 µs (a woken worker takes this vCPU)
    router = _LoopRouter(h.clock, events, flush_us=60)
    lead = WakeLead(late_ns=80 * US)
    before, lead_ns = lead.late_ns, lead.lead_ns
    monkeypatch.setattr(scheduler_main.os, "sched_yield", lambda: events.append(("yield", None)))
    _serve(h.core, inbox, router, h.clock, lead)  # type: ignore[arg-type]
    kinds = [k for k, _ in events]
    assert kinds == [
        "wait",  # the timed sleep to the lead
        "BatchDue",
        "flush",
        "poll",  # to the deadline
        "BatchAssign",
        "flush",
        "yield",  # the polling worker may share this vCPU: it runs now
        "wait",  # no deadline: until a message (the Shutdown)
        "flush",
    ]
    sleep_s = events[0][1]
    assert isinstance(sleep_s, float)
    # planned after the pass's bookkeeping (no time passes on this clock)
    assert sleep_s == pytest.approx((deadline - start - lead_ns) / 1e9)
    due_at, polled_at, assign_at = events[1][1], events[3][1], events[4][1]
    assert due_at == deadline - lead_ns + 30 * US  # the sleep ended 30 µs late
    assert polled_at == deadline - lead_ns + 90 * US  # and the notice took 60
    # 90 µs late is over the lead (80 µs, no margin): the poll starts after the deadline and
    # the batch leaves at once; the next lead is longer (the sleep's 30 µs alone would have
    # brought it down)
    assert lead_ns == 80 * US
    assert assign_at == polled_at == deadline + 10 * US
    assert lead.late_ns > before


# ------------------------------------------------------------ Policy.due_batch


def _queued(key: int, now_ns: int, batch_size: int = 1) -> Queued:
    return Queued(key, batch_size, (), now_ns)


def test_a_delay_running_names_the_first_idle_instance_and_its_end() -> None:
    b = DynamicBatcher(8, (4,), max_queue_delay_us=500, instance_ids=(7, 9))
    assert b.due_batch() is None  # nothing queued
    b.offer(_queued(1, 1_000), 1_000)
    b.offer(_queued(2, 3_000), 3_000)
    assert b.due_batch() == (7, 1_000 + 500 * US)  # the oldest request's delay
    assert b.next_deadline_ns() == 1_000 + 500 * US


def test_a_batch_that_goes_at_once_or_cannot_go_is_not_due() -> None:
    full = DynamicBatcher(8, (2,), max_queue_delay_us=500, instance_ids=(1,))
    full.offer(_queued(1, 0), 0)
    full.offer(_queued(2, 0), 0)  # the preferred size: sent on the next pass
    assert full.due_batch() is None
    busy = DynamicBatcher(8, (), max_queue_delay_us=500, instance_ids=())
    busy.offer(_queued(1, 0), 0)  # no idle instance: an instance's BatchDone sends it
    assert busy.due_batch() is None
    no_delay = DynamicBatcher(8, (), max_queue_delay_us=0, instance_ids=(1,))
    no_delay.offer(_queued(1, 0), 0)
    assert no_delay.due_batch() is None
    plain = DefaultScheduler(instance_ids=(1,))
    plain.offer(_queued(1, 0), 0)
    assert plain.due_batch() is None


# ------------------------------------------------------ SchedulerCore.due_notices


def test_the_core_notices_the_instance_once_per_due_time() -> None:
    h = Harness()
    h.ready(0, 1)
    req = h.request()  # add_sub: 100 µs delay, preferred 4
    due_at = req.arrival_ns + 100 * US
    assert h.core.next_deadline_ns() == due_at
    assert list(h.core.due_notices(due_at - 1)) == []  # not due by that horizon
    h.deliver(list(h.core.due_notices(due_at)))
    assert h.to_workers == [(0, BatchDue(at_ns=due_at))]
    h.deliver(list(h.core.due_notices(due_at)))  # the loop's next pass in the lead
    assert len(h.to_workers) == 1
    h.clock.advance_us(100)
    ((instance, batch),) = h.dispatch()
    assert instance == 0
    assert isinstance(batch, BatchAssign)


def test_a_batch_sent_early_makes_no_notice() -> None:
    h = Harness()
    h.ready(0)
    for _ in range(4):
        h.request()  # the preferred size: due now, not at the delay's end
    assert list(h.core.due_notices(h.now + 1_000 * US)) == []
    assert len(h.dispatch()) == 1


# ------------------------------------------------------------------ DueBatch


def test_the_worker_polls_from_the_notice_to_shortly_after_the_due_time() -> None:
    due = DueBatch()
    assert due.poll_s(0) == 0.0  # nothing announced: sleep
    now = 10_000_000
    due.expect(now + 80 * US, now)
    assert due.poll_s(now) == pytest.approx((80 * US + POLL_GRACE_NS) / 1e9)
    assert due.poll_s(now + 80 * US + POLL_GRACE_NS) == 0.0  # the window passed: dropped
    assert due.at_ns is None


def test_a_batch_ends_the_poll_and_an_early_notice_is_capped() -> None:
    due = DueBatch()
    due.expect(50_000_000, 0)  # 50 ms ahead: polls MAX_POLL_NS at most
    assert due.poll_s(0) == pytest.approx(MAX_POLL_NS / 1e9)
    due.arrived(1)
    assert due.poll_s(1) == 0.0


def test_while_batches_are_large_a_notice_is_slept_through() -> None:
    due = DueBatch()
    for _ in range(3):
        due.arrived(20)  # loaded: the mean is over the bound
    assert due.mean_requests > POLL_MAX_REQUESTS
    due.expect(80 * US, 0)
    assert due.poll_s(0) == 0.0  # sleeps until the batch's post
    assert due.at_ns is None
    due.arrived(1)  # one small batch among large ones: still loaded
    due.expect(80 * US, 0)
    assert due.poll_s(0) == 0.0
    while due.mean_requests > POLL_MAX_REQUESTS:
        due.arrived(1)
    due.expect(80 * US, 0)
    assert due.poll_s(0) == pytest.approx((80 * US + POLL_GRACE_NS) / 1e9)


def test_the_mean_follows_the_batch_sizes() -> None:
    due = DueBatch()
    assert due.mean_requests == 0.0
    due.arrived(8)
    assert due.mean_requests == pytest.approx(8 * SIZE_WEIGHT)
    due.arrived(8)
    assert due.mean_requests == pytest.approx(8 * (1 - (1 - SIZE_WEIGHT) ** 2))


def test_the_worker_asks_for_notices_only_while_it_would_poll() -> None:
    asked: list[bool] = []
    due = DueBatch(asked.append)
    assert asked == [True]  # at start: a restarted instance's ring may say otherwise
    due.arrived(1)
    assert asked == [True]  # unchanged: not asked again
    while due.mean_requests <= POLL_MAX_REQUESTS:
        due.arrived(20)
    assert asked == [True, False]
    due.arrived(20)
    assert asked == [True, False]
    while due.mean_requests > POLL_MAX_REQUESTS:
        due.arrived(1)
    assert asked == [True, False, True]


def test_a_worker_that_wants_no_notices_gets_none_and_batches_still_come() -> None:
    """The worker's side (``DueBatch``'s ask on the quiet flag of the scheduler's ring to it,
    as ``workers.main`` wires it) and the scheduler's (``Router.send``) on a real ring."""
    with ExitStack() as stack:
        inbox_ring, inbox_wakeup = stack.enter_context(ring_channel("due_in", 1 << 14))
        to_worker, worker_wakeup = stack.enter_context(ring_channel("due_w0", 1 << 14))
        spec = SchedulerSpec(
            models=(),
            inbox=InboxSpec(inbox_wakeup, (inbox_ring,)),
            to_workers={0: ChannelSpec(to_worker, worker_wakeup)},
            to_frontends={},
            log=LogSpec(),
        )
        sched_inbox: Inbox[ToScheduler] = Inbox(inbox_wakeup, [inbox_ring], ToScheduler)
        stack.callback(sched_inbox.close)
        router = Router(spec, sched_inbox)
        worker_inbox: Inbox[ToWorker] = Inbox(worker_wakeup, [to_worker], ToWorker)
        stack.callback(worker_inbox.close)
        due = DueBatch(lambda wanted: worker_inbox.set_quiet(to_worker, not wanted))
        notice = ToInstance(0, BatchDue(at_ns=5))
        batch = ToInstance(0, BatchAssign(batch_id=1, requests=(), dispatch_ns=0))

        router.send(notice)  # small batches so far: the worker polls on a notice
        router.flush()
        assert worker_inbox.wait(0.0)
        assert worker_inbox.drain() == [BatchDue(at_ns=5)]
        while due.mean_requests <= POLL_MAX_REQUESTS:
            due.arrived(20)
        router.send(notice)  # large batches: dropped, nothing pushed or posted
        router.flush()
        assert not worker_inbox.waiter.posted()
        assert not worker_inbox.has_pending()
        router.send(batch)  # a batch still comes, with its post
        router.flush()
        assert worker_inbox.wait(0.0)
        assert [type(m) for m in worker_inbox.drain()] == [BatchAssign]
        while due.mean_requests > POLL_MAX_REQUESTS:
            due.arrived(1)
        router.send(notice)  # small again: notices come again
        router.flush()
        assert worker_inbox.wait(0.0)
        assert worker_inbox.drain() == [BatchDue(at_ns=5)]


# ------------------------------------------------------------------ Inbox.poll


@pytest.fixture
def channel() -> Iterator[tuple[str, Wakeup]]:
    base = f"/triton_mp_{os.getpid()}_test_due"
    Ring.create(base + "_r", 4096).close()
    wakeup = create_wakeup("semaphore", base + "_sem")
    yield base + "_r", wakeup
    unlink_quietly(base + "_r")
    unlink_quietly(base + "_sem")


def test_poll_finds_an_unannounced_record_and_times_out_without_one(
    channel: tuple[str, Wakeup],
) -> None:
    ring_name, wakeup = channel
    inbox: Inbox[int] = Inbox(wakeup, [ring_name], int)
    ring = Ring.attach(ring_name)
    try:
        t0 = time.perf_counter()
        assert not inbox.poll(0.002)
        assert time.perf_counter() - t0 >= 0.002
        ring.push(b"\x05")  # published, never posted: a sleep would miss it
        assert inbox.poll(1.0)
        assert inbox.drain() == [5]
    finally:
        ring.close()
        inbox.close()
