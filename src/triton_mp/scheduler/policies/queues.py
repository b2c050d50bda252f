"""The queue of a model version: Triton's ``PriorityQueue`` with per-level queue policies.

Pure, like every batching policy (``scheduler.policies.policy``): no ipc, no clock, no I/O. Used by
the default scheduler and the dynamic batcher (``scheduler.policies``), which share
``QueuedInstances`` (the queue plus the idle instances). Semantics (Triton core
``scheduler_utils.cc``, docs ``model_configuration.md``):

- The queue has one FIFO per priority level; level 1 is the highest. A request's
  ``priority`` of 0, or above ``priority_levels``, means ``default_priority_level``; without
  ``priority_levels`` there is one level (0).
- Each level has a queue policy (``ModelQueuePolicy``): ``max_queue_size`` refuses requests
  beyond it at once; a request's queue timeout is ``default_timeout_microseconds``, which its
  own ``timeout`` parameter may *shorten* when ``allow_timeout_override`` is set (0 = none).
  When it expires, ``REJECT`` fails the request and ``DELAY`` moves it behind every other
  request of its level (but ahead of lower levels).
- Service order: per level, the waiting requests, then the delayed ones.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from triton_mp.scheduler.policies.policy import (
    QUEUE_FULL,
    TIMED_OUT,
    IterativeSteps,
    LevelSnapshot,
    Queued,
    Rejection,
    arrived_ns,
)


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


EAGER_LEVELS = 4096
"""Up to this many ``priority_levels``, every level's FIFO is made with the queue; above,
a level's is made when a request first queues there."""


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
        policies = dict(level_policies or {})
        self._policies = policies
        self._default_policy = default_policy
        if priority_levels > EAGER_LEVELS:
            # NOTE: a config may ask for up to 2^64 - 1 levels (Triton's QA does): only the
            # default level and those with a policy exist until a request needs another.
            wanted = {default_priority_level, *(n for n in policies if n <= priority_levels)}
            numbers: Iterable[int] = sorted(n for n in wanted if n >= 1)
        else:
            numbers = range(1, priority_levels + 1) if priority_levels > 0 else range(1)
        self._levels = {n: _Level(policies.get(n, default_policy)) for n in numbers}
        self.priority_levels = priority_levels
        self.default_level = default_priority_level if priority_levels > 0 else 0
        self._count = 0
        self._timeouts = bool(default_policy.default_timeout_us) or any(
            p.default_timeout_us for n, p in policies.items() if 1 <= n <= priority_levels
        )
        self._next_timeout_ns: int | None = None
        self.version = 0
        """Bumped by every change of the queue's contents or order, so a caller can keep
        what it computed from the queue until it changes (the dynamic batcher's walk)."""

    def _add_level(self, number: int) -> _Level:
        """The FIFO of a level not made yet (``EAGER_LEVELS``), kept in level order."""
        level = _Level(self._policies.get(number, self._default_policy))
        self._levels = dict(sorted({**self._levels, number: level}.items()))
        return level

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
        number = self.level_of(item.priority)
        level = self._levels.get(number)
        if level is None:
            level = self._add_level(number)
        cap = level.policy.max_queue_size
        if cap and level.size() >= cap:
            level.rejected += 1
            return False
        item.level = number
        # NOTE: without a default timeout on any level no request times out (deadline_ns:
        # a request's own timeout only shortens the default); per request, skip the call.
        if self._timeouts:
            item.deadline_ns = level.policy.deadline_ns(item.enqueue_ns, item.timeout_us)
        else:
            item.deadline_ns = 0
        level.waiting.append(item)
        self._count += 1
        self.version += 1
        if item.deadline_ns and (
            self._next_timeout_ns is None or item.deadline_ns < self._next_timeout_ns
        ):
            self._next_timeout_ns = item.deadline_ns
        return True

    def plain_waiting(self) -> collections.deque[Queued] | None:
        """The one FIFO a request is appended to as it is (``push``: one level, no
        ``max_queue_size``, no timeout), for ``scheduler.plain_requests``; None when ``push``
        does more."""
        if self.priority_levels or self._timeouts:
            return None
        level = self._levels[0]
        return None if level.policy.max_queue_size else level.waiting

    def pushed(self, n: int) -> None:
        """``n`` requests were appended to ``plain_waiting`` (``push``'s count and version)."""
        self._count += n
        self.version += n

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[Queued]:
        """Every queued request in service order."""
        for level in self._levels.values():
            yield from level.waiting
            yield from level.delayed

    def popleft(self, n: int) -> tuple[Queued, ...]:
        """Remove and return the first ``n`` requests in service order."""
        if not self.priority_levels:
            level = self._levels[0]
            if not level.delayed and len(level.waiting) >= n:
                # NOTE: one level, nothing delayed: its FIFO's first n, what the loop below
                # takes, at half its cost (10 items: 3.6 -> 1.8 µs at load 14; issue 34).
                pop = level.waiting.popleft
                got = tuple([pop() for _ in range(n)])
                self._count -= n
                self.version += 1
                return got
        out: list[Queued] = []
        for level in self._levels.values():
            for dq in (level.waiting, level.delayed):
                while dq and len(out) < n:
                    out.append(dq.popleft())
            if len(out) == n:
                break
        self._count -= len(out)
        self.version += 1
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
        self.version += 1
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
                        self.version += 1
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
        self.version += 1
        return items

    def snapshot(self) -> list[LevelSnapshot]:
        """Per level: depth, delayed, oldest arrival time and the cumulative counters."""
        out = []
        for number, level in self._levels.items():
            # NOTE: every item: requests from several frontends are queued in the order the
            # scheduler read them, not quite in arrival order (a status query is rare).
            oldest = min(map(arrived_ns, (*level.waiting, *level.delayed)), default=None)
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


class QueuedInstances:
    """What the default scheduler and the dynamic batcher keep: a priority queue and the
    idle instances in FIFO order (so load spreads over all instances). Implements every
    ``Policy`` method but ``pop_ready``."""

    iterative_steps: IterativeSteps | None = None

    def __init__(self, instance_ids: Sequence[int] = (), queue: PriorityQueue | None = None):
        self._queue = queue if queue is not None else PriorityQueue()
        self._idle: collections.deque[int] = collections.deque(instance_ids)
        self._idle_since: dict[int, int] = {}
        self._leaving: set[int] = set()
        """Instances a regroup removed: never idle here again."""

    @property
    def queue(self) -> PriorityQueue:
        """Its priority queue (``scheduler.plain_requests`` appends to a plain one)."""
        return self._queue

    def offer(self, item: Queued, now_ns: int) -> Rejection | None:
        return None if self._queue.push(item) else QUEUE_FULL

    def instance_idle(self, instance_id: int, now_ns: int = 0) -> None:
        if instance_id not in self._idle and instance_id not in self._leaving:
            self._idle.append(instance_id)
            self._idle_since[instance_id] = now_ns

    def instance_gone(self, instance_id: int) -> None:
        with contextlib.suppress(ValueError):
            self._idle.remove(instance_id)

    def regroup(self, added: Sequence[int], leaving: Sequence[int]) -> None:
        for instance_id in leaving:
            self._leaving.add(instance_id)
            self.instance_gone(instance_id)

    def holds(self, instance_id: int) -> bool:
        return False  # NOTE: a leaving instance holds nothing but its running batch.

    def expire(self, now_ns: int) -> list[tuple[Queued, Rejection]]:
        due = self._queue.next_timeout_ns()
        if due is None or now_ns < due:
            return []  # NOTE: the common case, on every dispatch pass: nothing to look at.
        return [(item, TIMED_OUT) for item in self._queue.expire(now_ns)]

    def next_deadline_ns(self) -> int | None:
        return self._queue.next_timeout_ns()

    def due_batch(self) -> tuple[int, int] | None:
        return None  # NOTE: no batching delay: a queued request goes out at once.

    def forming_room(self) -> tuple[int, int] | None:
        return None

    def drain_queue(self) -> list[Queued]:
        return self._queue.clear()

    def cancel(self, key: Hashable) -> Queued | None:
        return self._queue.remove(key)

    def queue_depth(self) -> int:
        return len(self._queue)

    def levels(self) -> list[LevelSnapshot]:
        return self._queue.snapshot()
