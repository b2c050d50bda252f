"""``scheduler.forming``: requests that join a batch waiting for its delay without waking the
scheduler, and why that forms the same batches at the same times.

The rule's pieces (``room_before_cut``, ``DynamicBatcher.forming_room``, ``forming_state``,
``SchedulerCore.forming``, the frontend's ``Allowance``) are checked alone, then together: a
process-free replay of random traffic through the core, once with every request read as it
is pushed and once through the forming rule (a request pushed within the allowance waits
unread until a wake-up, the deadline or a ``BatchDone`` reads the rings), must send the same
batches at the same times with fewer passes.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field

import msgspec
import pytest

from tests.helpers.ring_channel import ring_channel
from tests.unit.scheduler_harness import DYNAMIC, US, Harness, fe, model_spec
from triton_mp.frontend.dispatch.wakes import Allowance, HeldWakes
from triton_mp.ipc import Inbox, Sender
from triton_mp.ipc.memory.notify import Waiter, Wakeup
from triton_mp.ipc.protocol.messages import (
    BatchAssign,
    BatchDone,
    BlockRef,
    InferRequest,
    TensorRef,
    ToScheduler,
)
from triton_mp.ipc.protocol.specs import (
    ChannelSpec,
    InboxSpec,
    LogSpec,
    ModelVersionSpec,
    QueuePolicySpec,
    SchedulerSpec,
)
from triton_mp.ipc.recordio.quiet_requests import allowance_word, model_bit, model_bucket
from triton_mp.ipc.recordio.records import decode_request, encode_request
from triton_mp.scheduler.forming import NOT_FORMING, Forming, forming_state
from triton_mp.scheduler.main import Router
from triton_mp.scheduler.policies.dynamic import room_before_cut

ADD_SUB = model_bit("add_sub")
OTHER = model_spec("other_model", (5,))
assert model_bucket("add_sub") != model_bucket("other_model")


# ------------------------------------------------------------------ the room
@pytest.mark.parametrize(
    ("total", "preferred", "max_batch_size", "room"),
    [
        (1, (), 64, 62),  # no preferred size: up to 63 rows, never 64
        (1, (4,), 8, 2),  # 3 rows, not 4: the preferred size cuts
        (5, (4,), 8, 0),  # past the largest preferred size: the next row cuts
        (2, (4, 6), 8, 1),
        (4, (4, 6), 8, 1),  # 4 was reached without a cut? then 5 is the last safe sum
        (1, (8,), 4, 2),  # a preferred size above max_batch_size never counts
        (63, (), 64, 0),
    ],
)
def test_the_room_stops_one_row_short_of_every_cut(
    total: int, preferred: tuple[int, ...], max_batch_size: int, room: int
) -> None:
    pref = frozenset(p for p in preferred if p <= max_batch_size)
    max_pref = max(pref, default=max_batch_size)
    assert room_before_cut(total, pref, max_pref, max_batch_size) == room


def _dynamic(**kw: object) -> ModelVersionSpec:
    """DYNAMIC (max_batch_size 8, preferred 4, 100 µs) with ``kw`` changed in its batching."""
    batching = msgspec.structs.replace(DYNAMIC.batching, **kw)
    return msgspec.structs.replace(
        DYNAMIC, batching=batching, max_batch_size=batching.max_batch_size
    )


def test_a_batch_forms_only_while_an_idle_instance_waits_for_the_delay() -> None:
    h = Harness(models=(DYNAMIC, OTHER))
    h.ready(0, 1, 5)
    assert h.core.forming(1) == NOT_FORMING  # nothing queued
    first = h.request()
    assert h.dispatch() == []
    assert h.core.forming(1) == Forming(ADD_SUB, 2, first.arrival_ns)  # 1 queued, cut at 4
    assert h.core.forming(2) == NOT_FORMING  # two frontends: drains read ring by ring
    h.request(batch_size=2)
    assert h.core.forming(1) == NOT_FORMING  # 3 queued: the next row reaches 4
    h.clock.advance_us(200)
    assert len(h.dispatch()) == 1
    assert h.core.forming(1) == NOT_FORMING


def test_nothing_forms_for_models_whose_batches_compare_shapes_levels_or_time_out() -> None:
    for spec in (
        model_spec("add_sub", (0, 1), dims=(-1,)),  # shapes must agree
        _dynamic(priority_levels=2, default_priority_level=1),  # a request may jump ahead
        _dynamic(default_queue_policy=QueuePolicySpec(default_timeout_us=5000)),
        _dynamic(max_queue_delay_us=0),  # no delay: nothing waits
    ):
        h = Harness(models=(spec,))
        h.ready(0, 1)
        h.request()
        h.dispatch()
        assert h.core.forming(1) == NOT_FORMING, spec.batching


def test_nothing_forms_while_the_server_stops_defers_or_rate_limits() -> None:
    h = Harness(models=(DYNAMIC,))
    h.ready(0, 1)
    h.request()
    assert h.core.forming(1).mask == ADD_SUB
    h.core.stopping = True
    assert h.core.forming(1) == NOT_FORMING
    h.core.stopping = False
    h.core.limiter = object()  # type: ignore[assignment]
    assert h.core.forming(1) == NOT_FORMING


def test_a_bucket_shared_with_a_model_that_does_not_form_stays_clear() -> None:
    h = Harness(models=(DYNAMIC, OTHER))
    h.ready(0, 1, 5)
    h.request()
    h.request(model="other_model")
    gens = list(h.core.lifecycle.generations())
    for gen in gens:
        gen.request_bit = ADD_SUB  # NOTE: as if both names fell in one bucket
    both = forming_state(gens, h.core.handoffs.eligible, 1)
    assert both.mask == ADD_SUB  # both form
    assert both.rows == 2
    h.clock.advance_us(200)
    h.dispatch()
    h.request()  # add_sub forms again; other_model's instance is busy now
    assert forming_state(gens, h.core.handoffs.eligible, 1) == NOT_FORMING


# ------------------------------------------------------------------ the frontend's count
def test_the_allowance_counts_rows_per_epoch_and_checks_the_bucket_and_the_floor() -> None:
    a = Allowance()
    words = (ADD_SUB, allowance_word(1, 3), 1000)
    # NOTE: the first epoch seen counts as spent (a producer that replaced a dead one)
    assert not a.join(ADD_SUB, 1, 1000, words)
    words = (ADD_SUB, allowance_word(2, 3), 1000)
    assert a.join(ADD_SUB, 2, 1000, words)
    assert not a.join(ADD_SUB, 2, 1500, words)  # 4 > 3: wake (not counted)
    assert a.join(ADD_SUB, 1, 1500, words)
    assert not a.join(ADD_SUB, 1, 1500, words)  # the allowance is spent
    words = (ADD_SUB, allowance_word(3, 3), 1000)  # a new epoch: counted from 0
    assert a.join(ADD_SUB, 3, 1200, words)
    assert not a.join(ADD_SUB, 0, 999, words)  # stamped before the oldest: wake
    assert not a.join(model_bit("other_model"), 0, 2000, words)  # not forming
    assert not a.join(ADD_SUB, 0, 2000, (0, allowance_word(4, 9), 0))  # mask clear
    assert not a.join(0, 0, 2000, words)  # no bit: always wakes


# ------------------------------------------------------------------ replays
COMPUTE_US = 300


@dataclass
class Replay:
    """One run of traffic through a ``Harness``: ``lazy`` pushes through the forming rule."""

    spec: ModelVersionSpec
    lazy: bool
    rings: int
    h: Harness = field(init=False)
    batches: list[tuple[int, int, tuple[int, ...]]] = field(default_factory=list)
    """(time ns, instance, request ids) of each batch sent."""
    passes: int = 0
    unread: list[list[InferRequest]] = field(init=False)
    counts: list[Allowance] = field(init=False)
    words: tuple[int, int, int] = (0, 0, 0)
    epoch: int = 0
    running: dict[int, tuple[int, BatchAssign]] = field(default_factory=dict)
    busy_mask: int = 0
    """The quiet word stored at the last pass (``scheduler.request_wakeups``)."""
    quiet: frozenset[int] = frozenset()
    """The instances whose ``BatchDone`` goes without a wake-up (``scheduler.done_wakeups``)."""
    unread_done: list[BatchDone] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.h = Harness(models=(self.spec,), frontend_ids=tuple(range(self.rings)))
        self.h.ready(0, 1)
        self.unread = [[] for _ in range(self.rings)]
        self.counts = [Allowance() for _ in range(self.rings)]
        self.published = NOT_FORMING

    def push(self, ring: int, req: InferRequest) -> None:
        bit = model_bit(req.model)
        if self.lazy and bit & self.busy_mask:
            self.unread[ring].append(req)
            return
        if self.lazy and self.counts[ring].join(bit, req.batch_size, req.arrival_ns, self.words):
            self.unread[ring].append(req)
            return
        self.unread[ring].append(req)
        self.run_pass()

    def run_pass(self, done: list[BatchDone] | None = None) -> None:
        """One pass of ``scheduler.main._serve``: drain (BatchDone first, then ring by
        ring), handle, dispatch, publish the forming words."""
        h, now = self.h, self.h.now
        self.passes += 1
        msgs: list[object] = [*self.unread_done, *(done or [])]
        self.unread_done.clear()
        for ring in self.unread:
            msgs += ring
            ring.clear()
        h.deliver(list(h.core.handle_all(msgs, now)))  # type: ignore[arg-type]
        for iid, batch in h.dispatch():
            ids = tuple(r.request_id for r in _requests(batch))
            self.batches.append((now, iid, ids))
            self.running[iid] = (now + COMPUTE_US * US, batch)
        if self.lazy:
            self.busy_mask = h.core.quiet_requests()
            self.quiet = h.core.quiet_done(self.busy_mask)
        forming = h.core.forming(self.rings)
        if forming != self.published:
            self.epoch += 1
            self.published = forming
            self.words = (forming.mask, allowance_word(self.epoch, forming.rows), forming.floor_ns)

    def next_event_ns(self) -> int | None:
        times = [t for t, _ in self.running.values()]
        deadline = self.h.core.next_deadline_ns()
        if deadline is not None:
            times.append(deadline)
        return min(times, default=None)

    def until(self, t_ns: int) -> None:
        """Run the deadlines and batch ends due before ``t_ns``, then set the clock there."""
        while (t := self.next_event_ns()) is not None and t <= t_ns:
            self.h.clock._now_ns = max(self.h.now, t)
            ended = [iid for iid, (end, _) in self.running.items() if end <= self.h.now]
            done = [_done(iid, self.running.pop(iid)[1], self.h.now) for iid in ended]
            loud = [d for d in done if d.instance_id not in self.quiet]
            self.unread_done += [d for d in done if d.instance_id in self.quiet]
            deadline = self.h.core.next_deadline_ns()
            if loud or (deadline is not None and deadline <= self.h.now):
                self.run_pass(loud)
        self.h.clock._now_ns = max(self.h.now, t_ns)


def _requests(batch: BatchAssign) -> list[InferRequest]:
    return [decode_request(r) for r in batch.requests]


def _done(iid: int, batch: BatchAssign, now: int) -> BatchDone:
    return BatchDone(
        instance_id=iid,
        batch_id=batch.batch_id,
        start_ns=now - COMPUTE_US * US,
        compute_input_ns=1 * US,
        compute_infer_ns=5 * US,
        compute_output_ns=2 * US,
        end_ns=now,
    )


def _request(rid: int, ring: int, rows: int, arrival_ns: int) -> InferRequest:
    seg = f"/triton_mp_0_f{ring}_a0"
    shape = (rows, 16)
    nbytes = 4 * rows * 16
    return InferRequest(
        request_id=rid,
        reply_to=fe(ring),
        model="add_sub",
        version=1,
        batch_size=rows,
        inputs=(
            TensorRef("INPUT0", "FP32", shape, seg, 64 * rid, nbytes),
            TensorRef("INPUT1", "FP32", shape, seg, 64 * rid + nbytes, nbytes),
        ),
        outputs=("OUTPUT0",),
        block=BlockRef(seg, 64 * rid - 64),
        arrival_ns=arrival_ns,
    )


def _replay(spec: ModelVersionSpec, lazy: bool, rings: int, seed: int) -> Replay:
    """Random traffic: bursts of requests (1-3 rows) a few µs to a few hundred µs apart,
    each stamped up to 30 µs before its push (the frontend's own time)."""
    rng = random.Random(seed)
    run = Replay(spec, lazy, rings)
    t = run.h.now
    for rid in range(1, 400):
        t += rng.choice((2, 5, 20, 60, 150, 400)) * US
        run.until(t)
        rows = rng.choice((1, 1, 1, 2, 3))
        run.push(rng.randrange(rings), _request(rid, 0, rows, t - rng.randrange(30) * US))
    run.until(t + 10_000 * US)
    return run


SPECS = {
    "preferred4": _dynamic(),
    "no_preferred": _dynamic(preferred_batch_sizes=(), max_batch_size=16, max_queue_delay_us=500),
    "preferred2_6": _dynamic(preferred_batch_sizes=(2, 6), max_queue_delay_us=300),
    # NOTE: never quiet requests (a queue timeout): a BatchDone read late must still be
    # read at once while requests wait for its instance.
    "timeout": _dynamic(
        max_queue_delay_us=300,
        default_queue_policy=QueuePolicySpec(default_timeout_us=100_000),
    ),
}


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("name", sorted(SPECS))
def test_requests_read_late_form_the_same_batches_at_the_same_times(name: str, seed: int) -> None:
    eager = _replay(SPECS[name], lazy=False, rings=1, seed=seed)
    lazy = _replay(SPECS[name], lazy=True, rings=1, seed=seed)
    assert len(eager.batches) > 50
    assert lazy.batches == eager.batches
    assert lazy.passes < eager.passes


# ------------------------------------------------------------------ over real rings
@pytest.fixture
def wired() -> Iterator[tuple[Router, Inbox[ToScheduler], str, Wakeup]]:
    """A router whose inbox holds one frontend's ring (id 0); yields (router, inbox, the
    ring's name, the inbox's wakeup)."""
    with ExitStack() as stack:
        ring_name, wakeup = stack.enter_context(ring_channel("forming_in", 1 << 16))
        frontend = stack.enter_context(ring_channel("forming_f0", 1 << 12))
        spec = SchedulerSpec(
            models=(),
            inbox=InboxSpec(wakeup, (ring_name,)),
            to_workers={},
            to_frontends={0: ChannelSpec(*frontend)},
            log=LogSpec(),
        )
        inbox: Inbox[ToScheduler] = Inbox(wakeup, [ring_name], ToScheduler, spin_on_posts=True)
        stack.callback(inbox.close)
        yield Router(spec, inbox), inbox, ring_name, wakeup


def _record(rows: int, arrival_ns: int) -> bytes:
    data = encode_request(_request(1, 0, rows, arrival_ns))
    assert data is not None
    return data


def test_a_frontend_pushes_within_the_allowance_the_router_stored_without_a_post(
    wired: tuple[Router, Inbox[ToScheduler], str, Wakeup],
) -> None:
    router, inbox, ring_name, wakeup = wired
    sender = Sender(ring_name, wakeup)
    waiter = Waiter(wakeup)
    w = HeldWakes.over(sender, sender._waker.wake)
    try:
        assert router.frontends == 1
        assert router.forming(Forming(ADD_SUB, 3, 1000))
        assert not router.forming(Forming(ADD_SUB, 3, 1000))  # unchanged: nothing stored
        w.send(_record(1, 2000))
        assert waiter.wait(0)  # the first epoch a frontend sees counts as spent
        inbox.drain()
        assert router.forming(Forming(ADD_SUB, 3, 1500))  # read: a new epoch
        w.send(_record(2, 2000))
        with w.held():
            w.send(_record(1, 2000))
        assert not waiter.posted()  # 3 rows: within the allowance
        w.send(_record(1, 2000))
        assert waiter.wait(0)  # the fourth row wakes
        assert router.forming(Forming(ADD_SUB, 9, 1000))
        w.send(_record(1, 999))
        assert waiter.wait(0)  # stamped before the floor
        assert not inbox.poll(0.002)  # pushed quietly: the poll watches posts
        assert len(inbox.drain()) == 4
        assert router.forming(NOT_FORMING)
        w.send(_record(1, 2000))
        assert waiter.wait(0)
    finally:
        waiter.close()
        sender.close()


PRODUCER = ("push", "read_words_and_maybe_post")
CONSUMER = ("publish_new_epoch", "recheck_rings")


def _interleavings() -> Iterator[tuple[str, ...]]:
    for where in itertools.combinations(range(4), 2):
        p, c = iter(PRODUCER), iter(CONSUMER)
        yield tuple(next(p) if i in where else next(c) for i in range(4))


@pytest.mark.parametrize("order", list(_interleavings()), ids="-".join)
def test_no_interleaving_lets_an_uncounted_request_wait_unread(
    wired: tuple[Router, Inbox[ToScheduler], str, Wakeup], order: tuple[str, ...]
) -> None:
    """The frontend pushed a request under epoch 2 that the scheduler drained; its next
    request races the scheduler storing epoch 3 (fence, recheck: ``Router.forming`` and the
    loop). Counted against epoch 3 (the allowance stored after the drain) it may wait
    unread; counted against epoch 2, whose count epoch 3 forgets, the recheck must find
    it before the sleep."""
    router, inbox, ring_name, wakeup = wired
    sender = Sender(ring_name, wakeup)
    waiter = Waiter(wakeup)
    w = HeldWakes.over(sender, sender._waker.wake)
    try:
        router.forming(Forming(ADD_SUB, 1, 0))
        w.send(_record(1, 10))  # the first epoch it sees: spent, it posts
        assert waiter.wait(0)
        router.forming(Forming(ADD_SUB, 3, 0))  # epoch 2: 3 rows
        w.send(_record(1, 10))
        assert not waiter.posted()
        inbox.drain()  # epoch 3 will count that row in its queue
        data = _record(1, 10)
        found = False
        for step in order:
            if step == "push":
                assert sender.push_quiet(data)
            elif step == "read_words_and_maybe_post":
                if not (w._quiet_word and w._joins(ADD_SUB, data)):
                    sender._waker.wake()
            elif step == "publish_new_epoch":
                assert router.forming(Forming(ADD_SUB, 1, 0))
            else:
                found = inbox.has_pending()
        woken = waiter.wait(0)
        counted = w._allowance.epoch == router._epoch and w._allowance.used == 1
        assert found or woken or counted, f"an uncounted request waits unread in {order}"
        if order.index("read_words_and_maybe_post") < order.index("publish_new_epoch"):
            assert found  # quiet under epoch 2: only the recheck reads it
    finally:
        waiter.close()
        sender.close()
