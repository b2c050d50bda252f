"""Priority levels and queue policies of the dynamic batcher (``scheduler.policies.queues``) with a
FakeClock: Triton's ``PriorityQueue`` rules one by one, then properties over random runs."""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import hypothesis.strategies as st
from hypothesis import given, settings

from triton_mp.scheduler.policies.clock import FakeClock
from triton_mp.scheduler.policies.default import DefaultScheduler
from triton_mp.scheduler.policies.dynamic import DynamicBatcher
from triton_mp.scheduler.policies.policy import Batch, Queued
from triton_mp.scheduler.policies.queues import PriorityQueue, QueuePolicy

US = 1000
NO_POLICY = QueuePolicy()


@dataclass
class Feed:
    """Offers numbered requests at the clock's current time; records refusals."""

    sched: DynamicBatcher | DefaultScheduler
    clock: FakeClock = field(default_factory=FakeClock)
    keys: itertools.count[int] = field(default_factory=itertools.count)
    refused: list[Hashable] = field(default_factory=list)

    def offer(
        self, *batch_sizes: int, priority: int = 0, timeout_us: int = 0, shape: Hashable = ()
    ) -> list[Queued]:
        items = []
        for bs in batch_sizes:
            now = self.clock.now_ns()
            item = Queued(next(self.keys), bs, shape, now, priority=priority, timeout_us=timeout_us)
            if self.sched.offer(item, now) is None:
                items.append(item)
            else:
                self.refused.append(item.key)
        return items

    def pop(self) -> list[Batch]:
        return self.sched.pop_ready(self.clock.now_ns())

    def expire(self) -> list[Hashable]:
        return [q.key for q, _ in self.sched.expire(self.clock.now_ns())]


def _keys(batch: Batch) -> list[Hashable]:
    return [q.key for q in batch.requests]


def batcher(
    *,
    mbs: int = 4,
    preferred: Sequence[int] = (),
    delay_us: int = 0,
    instances: Sequence[int] = (0,),
    levels: int = 0,
    default_level: int = 0,
    policy: QueuePolicy = NO_POLICY,
    level_policies: Mapping[int, QueuePolicy] | None = None,
) -> Feed:
    queue = PriorityQueue(levels, default_level, policy, level_policies)
    return Feed(DynamicBatcher(mbs, preferred, delay_us, instances, queue))


# --------------------------------------------------------------------------- priority levels


def test_a_higher_priority_request_overtakes_a_hundred_queued_lower_ones() -> None:
    f = batcher(mbs=1, levels=2, default_level=2, instances=())
    f.offer(*[1] * 100, priority=2)
    (urgent,) = f.offer(1, priority=1)
    f.sched.instance_idle(0)
    (batch,) = f.pop()
    assert _keys(batch) == [urgent.key]
    f.sched.instance_idle(0)
    (batch,) = f.pop()
    assert _keys(batch) == [0]  # then the lower level, oldest first


def test_the_same_level_is_fifo_and_batches_span_levels_in_priority_order() -> None:
    f = batcher(mbs=8, levels=3, default_level=3, instances=())
    f.offer(1, 1, priority=3)  # 0, 1
    f.offer(1, priority=2)  # 2
    f.offer(1, 1, priority=1)  # 3, 4
    f.sched.instance_idle(0)
    (batch,) = f.pop()
    assert _keys(batch) == [3, 4, 2, 0, 1]


def test_the_largest_priority_levels_make_queues_only_for_levels_in_use() -> None:
    """Triton's QA config (2^64 - 1 levels, default 2^32 - 1, a policy at 2^32): the queue
    is made at once and levels sort as ever (one queue per level would never finish)."""
    top = 2**64 - 1
    f = batcher(mbs=8, levels=top, default_level=2**32 - 1, instances=(),
                level_policies={2**32: QueuePolicy(max_queue_size=1)})  # fmt: skip
    f.offer(1, priority=top)  # 0
    f.offer(1, priority=0)  # 1: the default level
    f.offer(1, 1, priority=2**32)  # 2, and 3 refused by its level's policy
    f.offer(1, priority=7)  # 4
    assert f.refused == [3]
    f.sched.instance_idle(0)
    (batch,) = f.pop()
    assert _keys(batch) == [4, 1, 2, 0]


def test_priority_zero_or_out_of_range_means_the_default_level() -> None:
    q = PriorityQueue(3, 2)
    assert [q.level_of(p) for p in (0, 1, 2, 3, 4, 99)] == [2, 1, 2, 3, 2, 2]
    assert PriorityQueue().level_of(1) == 0  # no levels: priority ignored


def test_without_priority_levels_priority_is_ignored() -> None:
    f = batcher(mbs=1, instances=())
    f.offer(1, priority=5)
    f.offer(1, priority=1)
    f.sched.instance_idle(0)
    (batch,) = f.pop()
    assert _keys(batch) == [0]


def test_the_default_scheduler_ignores_priority() -> None:
    f = Feed(DefaultScheduler())
    f.offer(1, priority=3)
    f.offer(1, priority=1)
    f.sched.instance_idle(0)
    (batch,) = f.pop()
    assert _keys(batch) == [0]


def test_the_delay_counts_from_the_oldest_request_walked_on_any_level() -> None:
    f = batcher(mbs=8, preferred=(8,), delay_us=100, levels=2, default_level=2)
    t0 = f.clock.now_ns()
    f.offer(1, priority=2)
    f.clock.advance_us(60)
    f.offer(1, priority=1)  # head of the queue now, but younger
    assert f.pop() == []
    assert f.sched.next_deadline_ns() == t0 + 100 * US
    f.clock.advance_us(40)
    (batch,) = f.pop()
    assert (_keys(batch), batch.reason) == ([1, 0], "delay")


# --------------------------------------------------------------------------- max_queue_size


def test_a_full_level_refuses_at_once_and_counts_it() -> None:
    f = batcher(instances=(), policy=QueuePolicy(max_queue_size=4))
    accepted = f.offer(*[1] * 20)
    assert [q.key for q in accepted] == [0, 1, 2, 3]
    assert f.refused == list(range(4, 20))
    (level,) = f.sched.levels()
    assert (level.level, level.depth, level.rejected) == (0, 4, 16)
    # once a batch leaves, room is made again
    f.sched.instance_idle(0)
    (batch,) = f.pop()
    assert batch.total_batch_size == 4
    assert len(f.offer(1)) == 1


def test_queue_size_is_per_level() -> None:
    f = batcher(
        instances=(),
        levels=2,
        default_level=2,
        level_policies={1: QueuePolicy(max_queue_size=1)},
    )
    f.offer(1, 1, priority=1)
    f.offer(1, 1, 1, priority=2)  # level 2: default policy, unbounded
    assert f.refused == [1]
    assert [(lv.level, lv.depth, lv.rejected) for lv in f.sched.levels()] == [(1, 1, 1), (2, 3, 0)]


def test_a_delayed_request_still_counts_toward_the_queue_size() -> None:
    policy = QueuePolicy("DELAY", default_timeout_us=10, max_queue_size=2)
    f = batcher(instances=(), policy=policy)
    f.offer(1, 1)
    f.clock.advance_us(10)
    assert f.expire() == []
    f.offer(1)
    assert f.refused == [2]


# --------------------------------------------------------------------------- timeouts


def test_reject_fails_a_request_whose_queue_timeout_expired() -> None:
    f = batcher(instances=(), policy=QueuePolicy("REJECT", default_timeout_us=100))
    t0 = f.clock.now_ns()
    f.offer(1)
    f.clock.advance_us(50)
    f.offer(1)
    # no instance idle: the timeout still wakes the scheduler
    assert f.sched.next_deadline_ns() == t0 + 100 * US
    f.clock.advance_us(49)
    assert f.expire() == []
    f.clock.advance_us(1)
    assert f.expire() == [0]
    assert f.sched.next_deadline_ns() == t0 + 150 * US
    f.clock.advance_us(50)
    assert f.expire() == [1]
    assert f.sched.next_deadline_ns() is None
    (level,) = f.sched.levels()
    assert (level.depth, level.timed_out) == (0, 2)


def test_a_dispatched_request_never_times_out() -> None:
    f = batcher(policy=QueuePolicy("REJECT", default_timeout_us=100))
    f.offer(1)
    (batch,) = f.pop()
    f.clock.advance_us(1000)
    assert f.expire() == []


def test_the_request_timeout_may_only_shorten_the_default_when_allowed() -> None:
    allowed = QueuePolicy("REJECT", default_timeout_us=100, allow_timeout_override=True)
    f = batcher(instances=(), policy=allowed)
    f.offer(1, timeout_us=30)  # 0: shortened to 30
    f.offer(1, timeout_us=500)  # 1: longer than the default: the default stays
    f.offer(1)  # 2: none given: the default
    f.clock.advance_us(30)
    assert f.expire() == [0]
    f.clock.advance_us(70)
    assert f.expire() == [1, 2]

    not_allowed = batcher(instances=(), policy=QueuePolicy("REJECT", default_timeout_us=100))
    not_allowed.offer(1, timeout_us=30)
    not_allowed.clock.advance_us(99)
    assert not_allowed.expire() == []


def test_a_request_timeout_without_a_default_timeout_has_no_effect() -> None:
    f = batcher(instances=(), policy=QueuePolicy("REJECT", allow_timeout_override=True))
    f.offer(1, timeout_us=10)
    assert f.sched.next_deadline_ns() is None
    f.clock.advance_us(1_000_000)
    assert f.expire() == []


def test_delay_moves_an_expired_request_behind_its_level_but_ahead_of_lower_ones() -> None:
    f = batcher(
        mbs=1,
        instances=(),
        levels=2,
        default_level=2,
        level_policies={1: QueuePolicy("DELAY", default_timeout_us=100)},
    )
    f.offer(1, priority=1)  # 0: will expire
    f.offer(1, priority=2)  # 1
    f.clock.advance_us(100)
    f.offer(1, priority=1)  # 2: fresh
    assert f.expire() == []
    assert [(lv.level, lv.depth, lv.delayed, lv.delayed_total) for lv in f.sched.levels()] == [
        (1, 2, 1, 1),
        (2, 1, 0, 0),
    ]
    order = []
    for _ in range(3):
        f.sched.instance_idle(0)
        (batch,) = f.pop()
        order.extend(_keys(batch))
    assert order == [2, 0, 1]


def test_cancel_finds_a_delayed_request() -> None:
    f = batcher(instances=(), policy=QueuePolicy("DELAY", default_timeout_us=1))
    f.offer(1)
    f.clock.advance_us(1)
    f.expire()
    item = f.sched.cancel(0)
    assert item is not None
    assert item.delayed
    assert f.sched.queue_depth() == 0


def test_level_snapshot_reports_the_oldest_waiting_request() -> None:
    f = batcher(instances=(), levels=2, default_level=2)
    t0 = f.clock.now_ns()
    f.offer(1, priority=2)
    f.clock.advance_us(5)
    f.offer(1, priority=1)
    lv1, lv2 = f.sched.levels()
    assert (lv1.oldest_arrival_ns, lv2.oldest_arrival_ns) == (t0 + 5 * US, t0)
    assert f.sched.drain_queue()[0].key == 1  # service order
    assert [lv.oldest_arrival_ns for lv in f.sched.levels()] == [None, None]


# --------------------------------------------------------------------------- properties


@dataclass
class PrioSim:
    """Drives a DynamicBatcher with levels and policies; checks every batch it forms."""

    sched: DynamicBatcher
    mbs: int
    delay_ns: int
    clock: FakeClock = field(default_factory=FakeClock)
    idle: list[int] = field(default_factory=list)
    busy: set[int] = field(default_factory=set)
    queued: dict[Hashable, Queued] = field(default_factory=dict)
    outcome: dict[Hashable, str] = field(default_factory=dict)

    def step(self) -> None:
        now = self.clock.now_ns()
        for item, _ in self.sched.expire(now):
            assert item.key in self.queued, "a request expired twice or was never queued"
            assert item.deadline_ns == 0 or item.deadline_ns <= now
            del self.queued[item.key]
            self.outcome[item.key] = "expired"
        for batch in self.sched.pop_ready(now):
            assert batch.instance_id in self.idle, "a batch went to an instance that is not idle"
            self.idle.remove(batch.instance_id)
            self.busy.add(batch.instance_id)
            assert batch.requests
            assert batch.total_batch_size == sum(q.batch_size for q in batch.requests)
            assert batch.total_batch_size <= self.mbs
            assert len({q.shape_key for q in batch.requests}) == 1
            for q in batch.requests:
                assert self.queued.pop(q.key, None) is q, "a request was dispatched twice"
                self.outcome[q.key] = "dispatched"
            # priority order: nothing left behind outranks anything in the batch, and a
            # level's waiting (not delayed) requests leave in arrival order
            for r in self.queued.values():
                for b in batch.requests:
                    assert r.level >= b.level
                    if r.level == b.level and not r.delayed and not b.delayed:
                        assert r.enqueue_ns >= b.enqueue_ns
        assert self.sched.queue_depth() == len(self.queued)
        if self.queued and self.idle and self.delay_ns:
            # an idle instance and queued work: the batcher waits, but never past the delay
            deadline = self.sched.next_deadline_ns()
            head = next(iter(self.sched._queue))  # noqa: SLF001 - the service order
            assert deadline is not None
            assert now < deadline <= head.enqueue_ns + self.delay_ns


_prio_ops = st.lists(
    st.one_of(
        st.tuples(st.just("offer"), st.integers(1, 4), st.integers(0, 4), st.integers(0, 300)),
        st.tuples(st.just("advance"), st.integers(0, 250), st.just(0), st.just(0)),
        st.tuples(st.just("done"), st.integers(0, 2), st.just(0), st.just(0)),
        st.tuples(st.just("deadline"), st.just(0), st.just(0), st.just(0)),
    ),
    max_size=60,
)

_policies = st.builds(
    QueuePolicy,
    st.sampled_from(["REJECT", "DELAY"]),
    st.sampled_from([0, 50, 200]),
    st.booleans(),
    st.sampled_from([0, 2, 5]),
)


@settings(max_examples=300, deadline=None)
@given(
    mbs=st.integers(1, 6),
    preferred=st.sets(st.integers(1, 6), max_size=2),
    delay_us=st.sampled_from([0, 50, 100]),
    n_instances=st.integers(1, 2),
    levels=st.integers(0, 3),
    default_policy=_policies,
    level_policy=_policies,
    ops=_prio_ops,
)
def test_random_runs_lose_nothing_and_respect_priorities(
    mbs: int,
    preferred: set[int],
    delay_us: int,
    n_instances: int,
    levels: int,
    default_policy: QueuePolicy,
    level_policy: QueuePolicy,
    ops: list[tuple[str, int, int, int]],
) -> None:
    instances = list(range(n_instances))
    queue = PriorityQueue(
        levels, max(1, levels) if levels else 0, default_policy, {1: level_policy}
    )
    sched = DynamicBatcher(mbs, sorted(preferred), delay_us, instances, queue)
    sim = PrioSim(sched, mbs, delay_us * US, idle=list(instances))
    keys = itertools.count()
    offered = []
    for op, a, b, c in ops:
        if op == "offer":
            now = sim.clock.now_ns()
            item = Queued(next(keys), min(a, mbs), ("shape", c % 2), now, priority=b, timeout_us=c)
            offered.append(item.key)
            if sched.offer(item, now) is None:
                sim.queued[item.key] = item
            else:
                sim.outcome[item.key] = "refused"
        elif op == "advance":
            sim.clock.advance_us(a)
        elif op == "done":
            busy = sorted(sim.busy)
            if busy:
                i = busy[a % len(busy)]
                sim.busy.discard(i)
                sim.idle.append(i)
                sched.instance_idle(i)
        elif op == "deadline":
            deadline = sched.next_deadline_ns()
            if deadline is not None:
                sim.clock.advance_us(max(0, -(-(deadline - sim.clock.now_ns()) // US)))
        sim.step()

    # finish: instances come back, time passes; every request ends exactly once
    for _ in range(len(offered) + 2):
        for i in sorted(sim.busy):
            sim.busy.discard(i)
            sim.idle.append(i)
            sched.instance_idle(i)
        sim.clock.advance_us(max(delay_us, 300) + 1)
        sim.step()
    assert sim.queued == {}
    assert sorted(sim.outcome, key=lambda k: int(str(k))) == offered


def _q(key: int, enqueue_ns: int = 0, timeout_us: int = 0) -> Queued:
    return Queued(key, 1, (), enqueue_ns, timeout_us=timeout_us)


def test_the_queue_version_moves_with_every_change_and_only_then() -> None:
    """The dynamic batcher keeps its walk while ``version`` stays (``DynamicBatcher._walk``)."""
    q = PriorityQueue(default_policy=QueuePolicy("DELAY", default_timeout_us=10))
    seen = [q.version]

    def changed() -> bool:
        moved = q.version != seen[-1]
        seen.append(q.version)
        return moved

    q.push(_q(1))
    assert changed()
    list(q)
    q.expire(0)
    assert not changed()  # NOTE: nothing due: nothing moved
    q.push(_q(2))
    assert changed()
    q.expire(20 * US)  # both DELAYed to the back
    assert changed()
    assert q.remove(1) is not None
    assert changed()
    assert q.remove(99) is None
    assert not changed()
    q.popleft(1)
    assert changed()
    q.push(_q(3))
    q.clear()
    assert changed()


def test_a_kept_walk_is_redone_when_a_request_joins() -> None:
    """Preferred size 2: one queued request waits for its delay; the second completes the
    preferred batch at once, though the first walk was kept."""
    sched = DynamicBatcher(8, (2,), max_queue_delay_us=100, instance_ids=(0,))
    sched.offer(_q(1), 0)
    assert sched.pop_ready(1 * US) == []
    assert sched.next_deadline_ns() == 100 * US
    sched.offer(_q(2, 2 * US), 2 * US)
    assert sched.next_deadline_ns() == 0  # NOTE: due now
    (batch,) = sched.pop_ready(3 * US)
    assert [q.key for q in batch.requests] == [1, 2]
