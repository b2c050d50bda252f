"""Batch formation for one model version: Triton's default scheduler and dynamic batcher.

Pure state machines, imported only by ``scheduler.main`` and tests: no ipc, no clock, no
I/O. The caller passes ``now_ns`` to every call and asks ``next_deadline_ns`` when to call
again. Both classes share one contract (``ModelScheduler``) so the scheduler process treats
them alike, and the sequence batcher of a later issue slots in beside them.

Semantics (Triton core ``dynamic_batch_scheduler.cc``, ``scheduler_utils.cc``, docs
``batcher.md``, ``model_configuration.md``):

- A batch is formed only when an instance is idle; while all are busy the queue grows and
  the next batch is bigger.
- The queue (``PriorityQueue``) has one FIFO per priority level; level 1 is the highest.
  A request's ``priority`` of 0, or above ``priority_levels``, means
  ``default_priority_level``; without ``priority_levels`` there is one level (0).
- Each level has a queue policy (``ModelQueuePolicy``): ``max_queue_size`` refuses requests
  beyond it at once; a request's queue timeout is ``default_timeout_microseconds``, which its
  own ``timeout`` parameter may *shorten* when ``allow_timeout_override`` is set (0 = none).
  When it expires, ``REJECT`` fails the request and ``DELAY`` moves it behind every other
  request of its level (but ahead of lower levels).
- Default scheduler (no ``dynamic_batching``): one request per execution, in FIFO order.
- Dynamic batcher (``GetDynamicBatch``): walk the queue in priority order (per level: the
  waiting requests, then the delayed ones), summing request batch sizes while the sum stays
  <= ``max_batch_size`` and every shape-enforced input has the same shape as the first
  request's (``shape_key``). On the way, mark a *cut*: the last sum equal to a preferred
  size or, when none was reached, the sum just before it would pass the largest preferred
  size. The *oldest* request is the one with the earliest enqueue time among those walked.
  Then:
  * the oldest request's ``max_queue_delay`` has not run out (a delay of 0 never does)
    and there is a cut: send up to the cut now (reason ``preferred``, or ``max``);
  * the walk filled the batch (the next request does not fit: ``max``; a shape differs:
    ``shape``), or the sum reached the largest preferred size: send all walked now;
  * the delay has run out (``delay``; ``idle`` when it ran out while every instance was
    busy, so the batch closed when one became free), or is 0 (``idle`` too): send all
    walked, preferred sizes notwithstanding;
  * otherwise wait until the oldest request's delay runs out.
- A request with batch size n counts n toward max_batch_size and is never split. With
  ``max_batch_size`` 0 the dynamic batcher keeps its queue rules but runs requests alone.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from triton_mp.common.errors import ErrorCode


@dataclass(slots=True)
class Queued:
    """A request waiting in a model's queue (the scheduler's view of it).

    Attributes:
        key: unique id of the request within the scheduler.
        batch_size: how much of max_batch_size it uses (``max(1, request batch)``).
        shape_key: requests batch together only when equal (shapes of enforced inputs).
        enqueue_ns: when it entered the queue.
        payload: whatever the caller needs back with the batch (the descriptor).
        priority: the request's ``priority`` parameter (0 = the default level).
        timeout_us: the request's ``timeout`` parameter in microseconds (0 = none).
        level: the priority level it was queued at (set by the queue).
        deadline_ns: when its queue timeout expires (set by the queue; 0 = never).
        delayed: its timeout expired under ``DELAY`` (set by the queue).
        corrid: the correlation ID of its sequence (sequence batcher), else None.
        flags: START (1) | END (2) of its sequence (sequence batcher).
    """

    key: Hashable
    batch_size: int
    shape_key: Hashable
    enqueue_ns: int
    payload: object = None
    priority: int = 0
    timeout_us: int = 0
    level: int = 0
    deadline_ns: int = 0
    delayed: bool = False
    corrid: Hashable = None
    flags: int = 0


@dataclass(frozen=True, slots=True)
class Batch:
    """A batch handed to one instance."""

    instance_id: int
    requests: tuple[Queued, ...]
    total_batch_size: int
    reason: str
    """Why it closed: ``single``, ``max``, ``preferred``, ``shape``, ``delay``, ``idle``."""
    rows: int = 0
    """Batch rows the backend sees (sequence batcher, Direct); 0 = one per request."""
    slots: tuple[int, ...] = ()
    """Row of each request when ``rows`` is set."""
    released: tuple[Hashable, ...] = ()
    """Correlation IDs whose sequences on this instance ended idle since its last batch."""


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a request is refused or failed by its model's scheduler.

    The caller prefixes the message with Triton's ``[request id: <id>] ``.
    """

    code: ErrorCode
    message: str
    reason: str = "REJECTED"
    """Failure reason for ``nv_inference_request_failure``: REJECTED, CANCELED, OTHER."""


QUEUE_FULL = Rejection(ErrorCode.UNAVAILABLE, "Exceeds maximum queue size")
"""Triton's refusal when a priority level holds ``max_queue_size`` requests."""
TIMED_OUT = Rejection(ErrorCode.UNAVAILABLE, "Request timeout expired")
"""Triton's error for a request whose queue timeout expired under ``REJECT``."""


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    """One priority level's ``ModelQueuePolicy``."""

    timeout_action: Literal["REJECT", "DELAY"] = "REJECT"
    default_timeout_us: int = 0
    """0 = requests never time out (a request's own timeout cannot add one)."""
    allow_timeout_override: bool = False
    max_queue_size: int = 0
    """0 = unbounded."""

    def deadline_ns(self, enqueue_ns: int, request_timeout_us: int) -> int:
        """When a request queued at ``enqueue_ns`` times out (0 = never).

        A request timeout overrides the default only when allowed, non-zero and shorter
        (Triton ``PolicyQueue::Enqueue``).
        """
        timeout_us = self.default_timeout_us
        if self.allow_timeout_override and 0 < request_timeout_us < timeout_us:
            timeout_us = request_timeout_us
        return enqueue_ns + timeout_us * 1000 if timeout_us else 0


@dataclass(frozen=True, slots=True)
class LevelSnapshot:
    """One priority level at a point in time (for ``triton-mp stat``)."""

    level: int
    depth: int
    delayed: int
    oldest_enqueue_ns: int | None
    rejected: int
    timed_out: int
    delayed_total: int


@dataclass(slots=True)
class _Level:
    policy: QueuePolicy
    waiting: collections.deque[Queued] = field(default_factory=collections.deque)
    delayed: collections.deque[Queued] = field(default_factory=collections.deque)
    rejected: int = 0
    """Refused by max_queue_size."""
    timed_out: int = 0
    """Failed by a REJECT timeout."""
    delayed_total: int = 0
    """Moved back by a DELAY timeout."""

    def size(self) -> int:
        return len(self.waiting) + len(self.delayed)


class PriorityQueue:
    """Triton's ``PriorityQueue``: one FIFO per priority level, each with its queue policy.

    Args:
        priority_levels: ``dynamic_batching.priority_levels`` (0 = a single level 0).
        default_priority_level: level of requests with priority 0 or out of range.
        default_policy: ``default_queue_policy``.
        level_policies: ``priority_queue_policy`` (levels without an entry use the default).
    """

    def __init__(
        self,
        priority_levels: int = 0,
        default_priority_level: int = 0,
        default_policy: QueuePolicy = QueuePolicy(),
        level_policies: Mapping[int, QueuePolicy] | None = None,
    ) -> None:
        policies = level_policies or {}
        numbers = range(1, priority_levels + 1) if priority_levels > 0 else range(1)
        self._levels = {n: _Level(policies.get(n, default_policy)) for n in numbers}
        self.priority_levels = priority_levels
        self.default_level = default_priority_level if priority_levels > 0 else 0
        self._count = 0
        self._timeouts = any(lv.policy.default_timeout_us for lv in self._levels.values())
        self._next_timeout_ns: int | None = None

    def level_of(self, priority: int) -> int:
        """The level a request with this ``priority`` parameter queues at."""
        if self.priority_levels == 0 or priority <= 0 or priority > self.priority_levels:
            return self.default_level
        return priority

    def push(self, item: Queued) -> bool:
        """Queue ``item`` at its level (sets ``level`` and ``deadline_ns``).

        Returns:
            False when the level already holds ``max_queue_size`` requests (nothing queued).
        """
        level = self._levels[self.level_of(item.priority)]
        cap = level.policy.max_queue_size
        if cap and level.size() >= cap:
            level.rejected += 1
            return False
        item.level = self.level_of(item.priority)
        item.deadline_ns = level.policy.deadline_ns(item.enqueue_ns, item.timeout_us)
        level.waiting.append(item)
        self._count += 1
        if item.deadline_ns and (
            self._next_timeout_ns is None or item.deadline_ns < self._next_timeout_ns
        ):
            self._next_timeout_ns = item.deadline_ns
        return True

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[Queued]:
        """Every queued request in service order."""
        for level in self._levels.values():
            yield from level.waiting
            yield from level.delayed

    def popleft(self, n: int) -> tuple[Queued, ...]:
        """Remove and return the first ``n`` requests in service order."""
        out: list[Queued] = []
        for level in self._levels.values():
            for dq in (level.waiting, level.delayed):
                while dq and len(out) < n:
                    out.append(dq.popleft())
            if len(out) == n:
                break
        self._count -= len(out)
        return tuple(out)

    def expire(self, now_ns: int) -> list[Queued]:
        """Apply queue timeouts due by ``now_ns``.

        Returns:
            The requests failed by ``REJECT`` (removed); ``DELAY`` ones move to the back of
            their level.
        """
        if self._next_timeout_ns is None or now_ns < self._next_timeout_ns:
            return []
        rejected: list[Queued] = []
        nearest: int | None = None
        for level in self._levels.values():
            keep: collections.deque[Queued] = collections.deque()
            for item in level.waiting:
                if item.deadline_ns and item.deadline_ns <= now_ns:
                    item.deadline_ns = 0
                    if level.policy.timeout_action == "DELAY":
                        item.delayed = True
                        level.delayed.append(item)
                        level.delayed_total += 1
                    else:
                        level.timed_out += 1
                        rejected.append(item)
                    continue
                keep.append(item)
                if item.deadline_ns and (nearest is None or item.deadline_ns < nearest):
                    nearest = item.deadline_ns
            level.waiting = keep
        self._count -= len(rejected)
        self._next_timeout_ns = nearest
        return rejected

    def next_timeout_ns(self) -> int | None:
        """The nearest queue timeout of a waiting request; None = none pending."""
        return self._next_timeout_ns

    def remove(self, key: Hashable) -> Queued | None:
        """Remove the request ``key``; None when it is not queued."""
        for level in self._levels.values():
            for dq in (level.waiting, level.delayed):
                for item in dq:
                    if item.key == key:
                        dq.remove(item)
                        self._count -= 1
                        return item
        return None

    def clear(self) -> list[Queued]:
        """Remove and return everything, in service order."""
        items = list(self)
        for level in self._levels.values():
            level.waiting.clear()
            level.delayed.clear()
        self._count = 0
        self._next_timeout_ns = None
        return items

    def snapshot(self) -> list[LevelSnapshot]:
        """Per level: depth, delayed, oldest enqueue time and the cumulative counters."""
        out = []
        for number, level in self._levels.items():
            # NOTE: waiting is in enqueue order; delayed is in expiry order.
            enqueued = [q.enqueue_ns for q in level.delayed]
            if level.waiting:
                enqueued.append(level.waiting[0].enqueue_ns)
            oldest = min(enqueued, default=None)
            out.append(
                LevelSnapshot(
                    number,
                    level.size(),
                    len(level.delayed),
                    oldest,
                    level.rejected,
                    level.timed_out,
                    level.delayed_total,
                )
            )
        return out


class ModelScheduler(Protocol):
    """What the scheduler process needs from a per-model scheduler."""

    def offer(self, item: Queued, now_ns: int) -> Rejection | None:
        """Enqueue a request; a Rejection when it cannot be queued (nothing is kept)."""
        ...

    def instance_idle(self, instance_id: int, now_ns: int = 0) -> None:
        """An instance finished its batch (or became ready) at ``now_ns`` and can take
        another."""
        ...

    def instance_gone(self, instance_id: int) -> None:
        """An instance died or stopped: never hand it work until ``instance_idle``."""
        ...

    def expire(self, now_ns: int) -> list[tuple[Queued, Rejection]]:
        """Apply timeouts due by ``now_ns``; returns the requests to fail now, and why."""
        ...

    def pop_ready(self, now_ns: int) -> list[Batch]:
        """Batches to dispatch now, each to one idle instance."""
        ...

    def next_deadline_ns(self) -> int | None:
        """When ``expire`` or ``pop_ready`` may act without any other event; None = never."""
        ...

    def drain_queue(self) -> list[Queued]:
        """Remove and return every queued request (shutdown, model unload)."""
        ...

    def cancel(self, key: Hashable) -> Queued | None:
        """Remove the queued request ``key``; None when it is not queued (any more)."""
        ...

    def queue_depth(self) -> int:
        """Requests waiting."""
        ...

    def levels(self) -> list[LevelSnapshot]:
        """The queue per priority level."""
        ...


class _QueueAndInstances:
    """What every per-model scheduler keeps: a priority queue and idle instances in FIFO
    order (so load spreads over all instances)."""

    def __init__(self, instance_ids: Sequence[int] = (), queue: PriorityQueue | None = None):
        self._queue = queue if queue is not None else PriorityQueue()
        self._idle: collections.deque[int] = collections.deque(instance_ids)
        self._idle_since: dict[int, int] = {}

    def offer(self, item: Queued, now_ns: int) -> Rejection | None:
        return None if self._queue.push(item) else QUEUE_FULL

    def instance_idle(self, instance_id: int, now_ns: int = 0) -> None:
        if instance_id not in self._idle:
            self._idle.append(instance_id)
            self._idle_since[instance_id] = now_ns

    def instance_gone(self, instance_id: int) -> None:
        with contextlib.suppress(ValueError):
            self._idle.remove(instance_id)

    def expire(self, now_ns: int) -> list[tuple[Queued, Rejection]]:
        return [(item, TIMED_OUT) for item in self._queue.expire(now_ns)]

    def next_deadline_ns(self) -> int | None:
        return self._queue.next_timeout_ns()

    def drain_queue(self) -> list[Queued]:
        return self._queue.clear()

    def cancel(self, key: Hashable) -> Queued | None:
        return self._queue.remove(key)

    def queue_depth(self) -> int:
        return len(self._queue)

    def levels(self) -> list[LevelSnapshot]:
        return self._queue.snapshot()


class DefaultScheduler(_QueueAndInstances):
    """Triton's default scheduler: each request runs alone on the next idle instance."""

    def pop_ready(self, now_ns: int) -> list[Batch]:
        out = []
        idle, queue = self._idle, self._queue
        while idle and queue:
            (item,) = queue.popleft(1)
            out.append(Batch(idle.popleft(), (item,), item.batch_size, "single"))
        return out


@dataclass(frozen=True, slots=True)
class _Walk:
    """What walking the queue from its head found (see the module docstring)."""

    count: int
    total: int
    cut: tuple[int, int] | None
    stop: str
    oldest_ns: int


class DynamicBatcher(_QueueAndInstances):
    """Triton's dynamic batcher for one model version (see the module docstring).

    Args:
        max_batch_size: ``max_batch_size`` of the model (0 = requests run alone).
        preferred_batch_sizes: ``dynamic_batching.preferred_batch_size`` (normalised: empty
            means ``[max_batch_size]``).
        max_queue_delay_us: ``dynamic_batching.max_queue_delay_microseconds``.
        instance_ids: instances that start idle.
        queue: the priority queue with the model's levels and queue policies (default: one
            level, no policy).
    """

    def __init__(
        self,
        max_batch_size: int,
        preferred_batch_sizes: Sequence[int] = (),
        max_queue_delay_us: int = 0,
        instance_ids: Sequence[int] = (),
        queue: PriorityQueue | None = None,
    ) -> None:
        if max_batch_size < 0:
            raise ValueError("the dynamic batcher needs max_batch_size >= 0")
        self.max_batch_size = max_batch_size
        self.preferred = frozenset(p for p in preferred_batch_sizes if 0 < p <= max_batch_size)
        self.max_preferred = max(self.preferred, default=max_batch_size)
        self.max_queue_delay_ns = max_queue_delay_us * 1000
        super().__init__(instance_ids, queue)

    def pop_ready(self, now_ns: int) -> list[Batch]:
        out = []
        idle = self._idle
        while idle and self._queue:
            batch = self._form(now_ns)
            if batch is None:
                break
            n, total, reason = batch
            items = self._queue.popleft(n)
            out.append(Batch(idle.popleft(), items, total, reason))
        return out

    def _walk(self) -> _Walk:
        return walk(self._queue, self.max_batch_size, self.preferred, self.max_preferred)

    def _form(self, now_ns: int) -> tuple[int, int, str] | None:
        """(request count, total batch size, reason) of the batch to send now, or None."""
        if self.max_batch_size == 0:
            head = next(iter(self._queue))
            return 1, head.batch_size, "single"
        idle_since = self._idle_since.get(self._idle[0], 0)
        return decide(
            self._walk(),
            now_ns,
            self.max_queue_delay_ns,
            self.preferred,
            self.max_preferred,
            idle_since,
        )

    def next_deadline_ns(self) -> int | None:
        deadline = self._queue.next_timeout_ns()
        if self._queue and self._idle and self.max_queue_delay_ns and self.max_batch_size:
            w = self._walk()
            # NOTE: a walk that would send at once (cut, stop) is due now: pop_ready was not
            # called since the last change; the oldest enqueue time is in the past.
            due = w.oldest_ns if (w.cut or w.stop) else w.oldest_ns + self.max_queue_delay_ns
            deadline = due if deadline is None else min(deadline, due)
        return deadline


def walk(
    items: Iterable[Queued],
    max_batch_size: int,
    preferred: frozenset[int],
    max_preferred: int,
) -> _Walk:
    """Walk ``items`` (in service order) as far as one batch can reach (module docstring)."""
    total = 0
    count = 0
    cut: tuple[int, int] | None = None
    stop = ""
    key: Hashable = None
    oldest = 0
    for item in items:
        if count == 0:
            key = item.shape_key
            oldest = item.enqueue_ns
        elif item.shape_key != key:
            stop = "shape"
            break
        grown = total + item.batch_size
        if count and cut is None and grown > max_preferred:
            cut = (count, total)
        if grown > max_batch_size:
            stop = "max"
            if count == 0:
                # NOTE: a request alone over max_batch_size; the frontend rejects such
                # requests, so this only guards against a bad descriptor.
                total, count = grown, 1
            break
        total = grown
        count += 1
        oldest = min(oldest, item.enqueue_ns)
        if total in preferred:
            cut = (count, total)
        if total >= max_batch_size:
            stop = "max"
            break
    return _Walk(count, total, cut, stop, oldest)


def decide(
    w: _Walk,
    now_ns: int,
    delay_ns: int,
    preferred: frozenset[int],
    max_preferred: int,
    idle_since_ns: int,
) -> tuple[int, int, str] | None:
    """(request count, total batch size, reason) to send now after walk ``w``, or None to
    wait for the delay (module docstring). ``idle_since_ns``: when the instance that would
    take the batch became idle."""
    delay_ran_out = delay_ns > 0 and now_ns - w.oldest_ns >= delay_ns
    if w.cut is not None and not delay_ran_out:
        reason = "preferred" if w.cut[1] in preferred else w.stop or "max"
        return w.cut[0], w.cut[1], reason
    if w.stop:
        return w.count, w.total, w.stop
    if delay_ran_out:
        # NOTE: when the delay ran out while every instance was busy, the batch closed
        # because an instance became free, not because of the delay.
        waited_for_instance = idle_since_ns > w.oldest_ns + delay_ns
        return w.count, w.total, "idle" if waited_for_instance else "delay"
    if delay_ns == 0:
        return w.count, w.total, "idle"
    if w.total >= max_preferred:
        return w.count, w.total, "max"
    return None
