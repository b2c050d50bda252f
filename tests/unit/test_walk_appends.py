"""The dynamic batcher's walk goes on over appended requests (``DynamicBatcher._walk``,
``PriorityQueue.reorders`` / ``tail``): after any history of the queue's changes (requests
offered one by one or appended by the plain lane, batches popped, queue timeouts, cancels,
priority levels, ``DELAY``), the walk it keeps equals one walk of the whole queue from its
head (``walk``, its twin), field by field."""

from __future__ import annotations

import itertools

import hypothesis.strategies as st
from hypothesis import given, settings

from triton_mp.scheduler.policies.dynamic import DynamicBatcher, walk
from triton_mp.scheduler.policies.policy import Queued
from triton_mp.scheduler.policies.queues import PriorityQueue, QueuePolicy

US = 1000

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("offer"), st.integers(1, 5), st.sampled_from([(), (1,), (2,)])),
        st.tuples(st.just("append"), st.integers(1, 4), st.integers(1, 3)),
        st.tuples(st.just("pop"), st.integers(0, 3), st.none()),
        st.tuples(st.just("advance"), st.integers(0, 400), st.none()),
        st.tuples(st.just("cancel"), st.integers(0, 30), st.none()),
        st.tuples(st.just("idle"), st.integers(0, 1), st.none()),
    ),
    max_size=60,
)
"""(op, arg, arg): offer a request of batch size arg (shape key arg2); append arg requests
of batch size arg2 through the plain lane; pop up to arg batches; advance the clock arg µs
(queue timeouts expire); cancel the request keyed arg; make instance arg idle."""


def _queue(kind: int) -> PriorityQueue:
    if kind == 0:
        return PriorityQueue()  # the plain lane's queue: one level, no policy
    if kind == 1:  # one level whose timeouts move requests back (DELAY)
        return PriorityQueue(0, 0, QueuePolicy("DELAY", 150))
    return PriorityQueue(2, 2, QueuePolicy("REJECT", 300), {1: QueuePolicy("DELAY", 100)})


def _fields(w: object) -> tuple[object, ...]:
    return tuple(getattr(w, f) for f in ("count", "total", "cut", "stop", "oldest_ns"))


@settings(max_examples=300, deadline=None)
@given(
    kind=st.integers(0, 2),
    max_batch_size=st.integers(1, 12),
    preferred=st.lists(st.integers(1, 12), max_size=3),
    ops=OPS,
    priorities=st.lists(st.integers(0, 3), min_size=1, max_size=8),
)
def test_the_kept_walk_is_a_walk_of_the_whole_queue(
    kind: int, max_batch_size: int, preferred: list[int], ops: list, priorities: list[int]
) -> None:
    queue = _queue(kind)
    b = DynamicBatcher(max_batch_size, preferred, 200, (), queue)
    now = 1_000_000
    keys = itertools.count()
    prio = itertools.cycle(priorities)

    def item(size: int, shape: object) -> Queued:
        return Queued(next(keys), min(size, max_batch_size), shape, now, None, next(prio), 0)

    for op, a, c in ops:
        if op == "offer":
            b.offer(item(a, c), now)
        elif op == "append":
            waiting = queue.plain_waiting()
            if waiting is None:
                continue  # the lane appends only to a plain queue
            for _ in range(a):
                waiting.append(item(c, ()))
            queue.pushed(a)
        elif op == "pop":
            for _ in range(a):
                b.pop_ready(now)
        elif op == "advance":
            now += a * US
            b.expire(now)
        elif op == "cancel":
            b.cancel(a)
        else:
            b.instance_idle(a, now)
        kept = b._walk()
        assert _fields(kept) == _fields(walk(queue, max_batch_size, b.preferred, b.max_preferred))
        assert b._walk() is kept  # nothing changed since: the same walk


def test_a_walk_goes_on_only_over_what_was_appended() -> None:
    queue = PriorityQueue()
    b = DynamicBatcher(8, (4,), 200, (), queue)
    for k in range(2):
        b.offer(Queued(k, 1, (), 1000), 1000)
    first = b._walk()
    assert (first.count, first.total, first.cut) == (2, 2, None)
    b.offer(Queued(2, 2, (), 1500), 1500)  # appended: the walk goes on from 2 requests
    w = b._walk()
    assert (w.count, w.total, w.cut, w.oldest_ns) == (3, 4, (3, 4), 1000)
    b.cancel(0)  # not an append: walked again from the head
    w = b._walk()
    assert (w.count, w.total, w.cut, w.oldest_ns) == (2, 3, None, 1000)
