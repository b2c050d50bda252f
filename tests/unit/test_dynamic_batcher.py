"""Batch formation (``scheduler.policies.default``, ``scheduler.policies.dynamic``) with a
FakeClock: Triton's default scheduler and dynamic batcher, rule by rule, then properties over
random arrival sequences."""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from triton_mp.scheduler.policies.clock import FakeClock
from triton_mp.scheduler.policies.default import DefaultScheduler
from triton_mp.scheduler.policies.dynamic import DynamicBatcher
from triton_mp.scheduler.policies.policy import Batch, Queued

US = 1000  # nanoseconds per microsecond


@dataclass
class Feed:
    """Offers numbered requests to a scheduler at the clock's current time."""

    sched: DynamicBatcher | DefaultScheduler
    clock: FakeClock = field(default_factory=FakeClock)
    keys: itertools.count[int] = field(default_factory=itertools.count)

    def offer(self, *batch_sizes: int, shape: Hashable = ()) -> list[Queued]:
        items = []
        for bs in batch_sizes:
            item = Queued(next(self.keys), bs, shape, self.clock.now_ns())
            self.sched.offer(item, self.clock.now_ns())
            items.append(item)
        return items

    def pop(self) -> list[Batch]:
        return self.sched.pop_ready(self.clock.now_ns())


def _keys(batch: Batch) -> list[Hashable]:
    return [q.key for q in batch.requests]


def dynamic(
    max_batch_size: int = 8,
    preferred: Sequence[int] = (4, 8),
    delay_us: int = 100,
    instances: Sequence[int] = (0,),
) -> Feed:
    return Feed(DynamicBatcher(max_batch_size, preferred, delay_us, instances))


# --------------------------------------------------------------------------- delay


def test_fewer_than_preferred_wait_for_the_delay_then_go_together() -> None:
    f = dynamic()
    t0 = f.clock.now_ns()
    f.offer(1, 1, 1)
    assert f.pop() == []
    assert f.sched.next_deadline_ns() == t0 + 100 * US
    f.clock.advance_us(99)
    assert f.pop() == []
    f.clock.advance_us(1)
    (batch,) = f.pop()
    assert _keys(batch) == [0, 1, 2]
    assert (batch.instance_id, batch.total_batch_size, batch.reason) == (0, 3, "delay")
    assert f.sched.queue_depth() == 0
    assert f.sched.next_deadline_ns() is None


def test_the_deadline_is_the_oldest_requests() -> None:
    f = dynamic()
    t0 = f.clock.now_ns()
    f.offer(1)
    f.clock.advance_us(60)
    f.offer(1)
    assert f.pop() == []
    assert f.sched.next_deadline_ns() == t0 + 100 * US
    f.clock.advance_us(40)
    (batch,) = f.pop()
    assert _keys(batch) == [0, 1]


def test_zero_delay_sends_whatever_is_queued_at_once() -> None:
    f = dynamic(preferred=(4,), delay_us=0)
    f.offer(1)
    assert f.sched.next_deadline_ns() is None
    (batch,) = f.pop()
    assert (_keys(batch), batch.reason) == ([0], "idle")


# --------------------------------------------------------------------------- preferred / max


def test_reaching_a_preferred_size_sends_at_once() -> None:
    f = dynamic()
    f.offer(1, 1, 1, 1)
    (batch,) = f.pop()
    assert (_keys(batch), batch.total_batch_size, batch.reason) == ([0, 1, 2, 3], 4, "preferred")


def test_past_a_preferred_size_sends_the_preferred_part_at_once() -> None:
    f = dynamic()
    f.offer(1, 1, 1, 1, 1)
    (batch,) = f.pop()
    assert (_keys(batch), batch.total_batch_size, batch.reason) == ([0, 1, 2, 3], 4, "preferred")
    assert f.sched.queue_depth() == 1
    # the only instance is busy now: nothing to wait for
    assert f.sched.next_deadline_ns() is None


def test_the_largest_preferred_size_wins() -> None:
    f = dynamic()
    f.offer(*[1] * 9)
    (batch,) = f.pop()
    assert (len(batch.requests), batch.total_batch_size) == (8, 8)
    assert f.sched.queue_depth() == 1


def test_full_batch_without_preferred_sizes_sends_at_once() -> None:
    f = dynamic(max_batch_size=4, preferred=())
    f.offer(1, 1, 1)
    assert f.pop() == []
    f.offer(1)
    (batch,) = f.pop()
    assert (batch.total_batch_size, batch.reason) in {(4, "max"), (4, "preferred")}


def test_preferred_sizes_outside_one_to_max_are_ignored() -> None:
    f = dynamic(max_batch_size=4, preferred=(0, 16, 2))
    assert f.sched.preferred == {2}
    f.offer(1, 1)
    (batch,) = f.pop()
    assert batch.total_batch_size == 2


def test_queued_work_waits_for_an_instance_and_the_next_batch_is_bigger() -> None:
    f = dynamic(preferred=(), instances=())
    f.offer(1, 1, 1)
    f.clock.advance_us(1000)
    assert f.pop() == []
    assert f.sched.next_deadline_ns() is None
    f.offer(1, 1)
    f.sched.instance_idle(0)
    (batch,) = f.pop()
    assert (batch.total_batch_size, batch.reason) == (5, "delay")


# --------------------------------------------------------------------------- client batches


def test_a_request_of_batch_size_three_counts_three() -> None:
    f = dynamic(preferred=(4,))
    f.offer(3)
    assert f.pop() == []
    f.offer(1)
    (batch,) = f.pop()
    assert (_keys(batch), batch.total_batch_size, batch.reason) == ([0, 1], 4, "preferred")


def test_a_request_is_never_split_to_fill_a_batch() -> None:
    f = dynamic(preferred=(), instances=(0, 1))
    f.offer(5, 5)
    (first,) = f.pop()
    assert (_keys(first), first.total_batch_size, first.reason) == ([0], 5, "max")
    # the second request alone: nothing follows it, so it waits for its delay
    assert f.pop() == []
    f.clock.advance_us(100)
    (second,) = f.pop()
    assert (second.instance_id, _keys(second), second.total_batch_size) == (1, [1], 5)


def test_a_request_that_does_not_fit_closes_the_batch() -> None:
    f = dynamic(preferred=(), instances=(0,))
    f.offer(3, 4, 2)
    (batch,) = f.pop()
    assert (_keys(batch), batch.total_batch_size, batch.reason) == ([0, 1], 7, "max")
    assert f.sched.queue_depth() == 1


def test_a_request_larger_than_max_batch_size_goes_alone() -> None:
    f = dynamic(max_batch_size=4, preferred=(), instances=(0,))
    f.offer(6, 1)
    (batch,) = f.pop()
    assert (_keys(batch), batch.total_batch_size) == ([0], 6)


# --------------------------------------------------------------------------- Triton's edges
# Triton core ``DynamicBatchScheduler::GetDynamicBatch``: while the delay has not run out,
# a batch is cut at the largest preferred size seen, or, when none was seen, just before
# the sum would pass the largest preferred size; once the oldest request's delay has run
# out, everything walked (up to max_batch_size) goes, preferred sizes notwithstanding.


def test_no_batch_passes_the_largest_preferred_size_before_the_delay() -> None:
    f = dynamic(preferred=(4,))
    f.offer(3, 3)  # 6 would pass 4, and no preferred size was reached
    (batch,) = f.pop()
    assert (_keys(batch), batch.total_batch_size) == ([0], 3)


def test_cut_before_passing_the_largest_preferred_size() -> None:
    f = dynamic(preferred=(4,), instances=(0, 1))
    f.offer(2, 3, 1)
    # [2] goes at once (2 + 3 passes 4); then [3, 1] makes 4 on its own
    first, second = f.pop()
    assert (first.instance_id, _keys(first), first.total_batch_size) == (0, [0], 2)
    assert (second.instance_id, _keys(second), second.total_batch_size) == (1, [1, 2], 4)
    assert second.reason == "preferred"


def test_after_the_delay_everything_up_to_max_batch_size_goes() -> None:
    f = dynamic(preferred=(4,), instances=())
    f.offer(1, 1, 1, 1, 1, 1)
    f.clock.advance_us(100)
    f.sched.instance_idle(0)
    (batch,) = f.pop()
    assert (batch.total_batch_size, batch.reason) == (6, "delay")


def test_zero_delay_still_cuts_at_a_preferred_size() -> None:
    f = dynamic(preferred=(2, 4), delay_us=0)
    f.offer(1, 1, 1)
    (batch,) = f.pop()
    assert (_keys(batch), batch.total_batch_size, batch.reason) == ([0, 1], 2, "preferred")


def test_before_the_delay_a_preferred_size_past_the_walk_is_kept() -> None:
    f = dynamic(preferred=(4,))
    f.offer(1, 1, 1, 1, 1, 1)
    (batch,) = f.pop()
    assert (batch.total_batch_size, batch.reason) == (4, "preferred")


# --------------------------------------------------------------------------- shapes


def test_a_shape_change_closes_the_batch() -> None:
    f = dynamic(instances=(0, 1))
    f.offer(1, 1, shape=(16,))
    f.offer(1, shape=(32,))
    f.offer(1, shape=(16,))
    first, second = f.pop()
    assert (_keys(first), first.total_batch_size, first.reason) == ([0, 1], 2, "shape")
    # the odd one out is followed by yet another shape: it goes alone at once too
    assert (_keys(second), second.reason) == ([2], "shape")
    # the last one has nothing after it: it waits for its delay
    assert f.sched.queue_depth() == 1
    f.sched.instance_idle(0)
    assert f.pop() == []
    f.clock.advance_us(100)
    (third,) = f.pop()
    assert (_keys(third), third.reason) == ([3], "delay")


def test_requests_of_one_shape_still_reach_a_preferred_size() -> None:
    f = dynamic(preferred=(2,))
    f.offer(1, 1, shape=("a",))
    f.offer(1, 1, shape=("b",))
    (batch,) = f.pop()
    assert (_keys(batch), batch.reason) == ([0, 1], "preferred")


# --------------------------------------------------------------------------- instances


def test_no_idle_instance_means_no_batch_and_no_deadline() -> None:
    f = dynamic(instances=())
    f.offer(1, 1, 1, 1, 1, 1, 1, 1)
    assert f.pop() == []
    assert f.sched.next_deadline_ns() is None
    f.sched.instance_idle(3)
    (batch,) = f.pop()
    assert (batch.instance_id, batch.total_batch_size) == (3, 8)


def test_idle_instances_take_batches_in_fifo_order() -> None:
    f = dynamic(preferred=(2,), instances=(0, 1, 2))
    f.offer(1, 1, 1, 1, 1, 1)
    batches = f.pop()
    assert [b.instance_id for b in batches] == [0, 1, 2]
    assert [_keys(b) for b in batches] == [[0, 1], [2, 3], [4, 5]]
    f.offer(1, 1)
    assert f.pop() == []  # all busy
    f.sched.instance_idle(1)
    f.sched.instance_idle(0)
    (batch,) = f.pop()
    assert batch.instance_id == 1


def test_instance_idle_twice_does_not_double_book_it() -> None:
    f = dynamic(preferred=(1,), instances=())
    f.sched.instance_idle(0)
    f.sched.instance_idle(0)
    f.offer(1, 1)
    (batch,) = f.pop()
    assert batch.instance_id == 0
    assert f.sched.queue_depth() == 1


def test_instance_gone_gets_no_more_batches() -> None:
    f = dynamic(instances=(0, 1))
    f.sched.instance_gone(0)
    f.sched.instance_gone(7)  # unknown: ignored
    f.offer(1, 1, 1, 1)
    (batch,) = f.pop()
    assert batch.instance_id == 1
    f.offer(1, 1, 1, 1)
    assert f.pop() == []
    assert f.sched.next_deadline_ns() is None
    f.sched.instance_idle(0)  # restarted
    (batch,) = f.pop()
    assert batch.instance_id == 0


def test_drain_queue_returns_everything_in_order() -> None:
    f = dynamic(instances=())
    items = f.offer(1, 2, 3)
    assert f.sched.queue_depth() == 3
    assert f.sched.drain_queue() == items
    assert f.sched.queue_depth() == 0
    f.sched.instance_idle(0)
    assert f.pop() == []


def test_max_batch_size_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="max_batch_size >= 0"):
        DynamicBatcher(-1)


def test_max_batch_size_zero_runs_requests_alone() -> None:
    f = Feed(DynamicBatcher(0, (), 100, (0, 1)))
    f.offer(1, 1, 1)
    batches = f.pop()
    assert [(_keys(b), b.total_batch_size, b.reason) for b in batches] == [
        ([0], 1, "single"),
        ([1], 1, "single"),
    ]
    assert f.sched.queue_depth() == 1


# --------------------------------------------------------------------------- default scheduler


def test_default_scheduler_runs_one_request_per_batch() -> None:
    f = Feed(DefaultScheduler([0, 1]))
    f.offer(1, 4, 1)
    batches = f.pop()
    assert [(b.instance_id, _keys(b), b.total_batch_size, b.reason) for b in batches] == [
        (0, [0], 1, "single"),
        (1, [1], 4, "single"),
    ]
    assert f.sched.queue_depth() == 1
    assert f.sched.next_deadline_ns() is None
    assert f.pop() == []
    f.sched.instance_idle(1)
    (batch,) = f.pop()
    assert (batch.instance_id, _keys(batch)) == (1, [2])


def test_default_scheduler_instances_and_drain() -> None:
    f = Feed(DefaultScheduler())
    items = f.offer(1, 1)
    assert f.pop() == []
    f.sched.instance_idle(5)
    f.sched.instance_gone(5)
    assert f.pop() == []
    assert f.sched.drain_queue() == items
    assert f.sched.queue_depth() == 0


# --------------------------------------------------------------------------- properties


@dataclass
class Sim:
    """Drives a DynamicBatcher and checks every batch it forms against the rules."""

    sched: DynamicBatcher
    mbs: int
    delay_ns: int
    clock: FakeClock = field(default_factory=FakeClock)
    idle: list[int] = field(default_factory=list)
    busy: set[int] = field(default_factory=set)
    queued: list[Queued] = field(default_factory=list)
    offered: list[Queued] = field(default_factory=list)
    dispatched: list[Queued] = field(default_factory=list)

    def pop(self) -> None:
        now = self.clock.now_ns()
        for batch in self.sched.pop_ready(now):
            assert batch.instance_id in self.idle, "a batch went to an instance that is not idle"
            self.idle.remove(batch.instance_id)
            self.busy.add(batch.instance_id)
            sizes = [q.batch_size for q in batch.requests]
            assert batch.requests
            assert batch.total_batch_size == sum(sizes)
            assert batch.total_batch_size <= self.mbs
            assert len({q.shape_key for q in batch.requests}) == 1
            # the batch is the oldest requests, in order: FIFO overall and per shape
            n = len(batch.requests)
            assert list(batch.requests) == self.queued[:n]
            del self.queued[:n]
            self.dispatched.extend(batch.requests)
        if self.queued and self.idle:
            # an idle instance and queued work: the batcher must be waiting for a deadline
            deadline = self.sched.next_deadline_ns()
            assert deadline is not None
            assert deadline > now
            assert now - self.queued[0].enqueue_ns < self.delay_ns
            # ...and that deadline is no later than when the oldest request's delay runs out
            assert deadline <= self.queued[0].enqueue_ns + self.delay_ns

    def set_idle(self, instance_id: int) -> None:
        self.busy.discard(instance_id)
        if instance_id not in self.idle:
            self.idle.append(instance_id)
        self.sched.instance_idle(instance_id)


_ops = st.lists(
    st.one_of(
        st.tuples(st.just("offer"), st.integers(1, 8), st.integers(0, 2)),
        st.tuples(st.just("advance"), st.integers(0, 250), st.just(0)),
        st.tuples(st.just("done"), st.integers(0, 2), st.just(0)),
        st.tuples(st.just("gone"), st.integers(0, 2), st.just(0)),
        st.tuples(st.just("deadline"), st.just(0), st.just(0)),
    ),
    max_size=60,
)


@settings(max_examples=400, deadline=None)
@given(
    mbs=st.integers(1, 8),
    preferred=st.sets(st.integers(1, 8), max_size=3),
    delay_us=st.sampled_from([0, 1, 50, 100, 1000]),
    n_instances=st.integers(1, 3),
    ops=_ops,
)
def test_random_arrivals_follow_the_rules(
    mbs: int,
    preferred: set[int],
    delay_us: int,
    n_instances: int,
    ops: list[tuple[str, int, int]],
) -> None:
    instances = list(range(n_instances))
    sim = Sim(DynamicBatcher(mbs, sorted(preferred), delay_us, instances), mbs, delay_us * US)
    sim.idle = list(instances)
    keys = itertools.count()
    for op, a, b in ops:
        if op == "offer":
            item = Queued(next(keys), min(a, mbs), ("shape", b), sim.clock.now_ns())
            sim.sched.offer(item, sim.clock.now_ns())
            sim.queued.append(item)
            sim.offered.append(item)
        elif op == "advance":
            sim.clock.advance_us(a)
        elif op == "done":
            busy = sorted(sim.busy)
            if busy:
                sim.set_idle(busy[a % len(busy)])
        elif op == "gone":
            victim = instances[a % n_instances]
            sim.sched.instance_gone(victim)
            sim.busy.discard(victim)
            if victim in sim.idle:
                sim.idle.remove(victim)
        elif op == "deadline":
            deadline = sim.sched.next_deadline_ns()
            if deadline is not None:
                sim.clock.advance_us(max(0, -(-(deadline - sim.clock.now_ns()) // US)))
                sim.pop()
                # no request waits past its delay while an instance is idle
                if sim.queued and sim.idle:
                    assert sim.clock.now_ns() - sim.queued[0].enqueue_ns <= sim.delay_ns
        sim.pop()

    # finish: every instance comes back and time passes; everything comes out exactly once
    for i in instances:
        sim.set_idle(i)
    for _ in range(len(sim.offered) + 1):
        if not sim.queued:
            break
        sim.clock.advance_us(delay_us + 1)
        sim.pop()
        for i in sorted(sim.busy):
            sim.set_idle(i)
    assert sim.queued == []
    assert sim.sched.queue_depth() == 0
    assert [q.key for q in sim.dispatched] == [q.key for q in sim.offered]


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 4), min_size=1, max_size=30),
    n_instances=st.integers(1, 3),
)
def test_default_scheduler_dispatches_each_request_alone_in_order(
    sizes: list[int], n_instances: int
) -> None:
    f = Feed(DefaultScheduler(range(n_instances)))
    offered = f.offer(*sizes)
    out: list[Queued] = []
    for _ in range(len(sizes) + 1):
        batches = f.pop()
        assert len(batches) <= n_instances
        for b in batches:
            assert len(b.requests) == 1
            out.extend(b.requests)
            f.sched.instance_idle(b.instance_id)
    assert out == offered


def test_a_batch_that_waited_for_an_instance_past_its_delay_closes_as_idle() -> None:
    f = dynamic(preferred=(), instances=())
    f.offer(1, 1)
    f.clock.advance_us(500)  # the delay ran out long ago while no instance was free
    f.sched.instance_idle(0, f.clock.now_ns())
    (batch,) = f.pop()
    assert (batch.total_batch_size, batch.reason) == (2, "idle")
    # an instance already idle when the delay runs out: the delay closed the batch
    f.offer(1)
    f.sched.instance_idle(0, f.clock.now_ns())
    f.clock.advance_us(100)
    (batch,) = f.pop()
    assert batch.reason == "delay"
