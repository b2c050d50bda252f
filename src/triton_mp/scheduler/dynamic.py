"""Batch formation for one model version: Triton's default scheduler and dynamic batcher.

Pure state machines, imported only by ``scheduler.main`` and tests: no ipc, no clock, no
I/O. The caller passes ``now_ns`` to every call and asks ``next_deadline_ns`` when to call
again. Both classes share one contract (``ModelScheduler``) so the scheduler process treats
them alike, and the sequence batcher of a later issue slots in beside them.

Semantics (Triton core ``dynamic_batch_scheduler.cc``, docs ``batcher.md``):

- A batch is formed only when an instance is idle; while all are busy the queue grows and
  the next batch is bigger.
- Default scheduler (no ``dynamic_batching``): one request per execution.
- Dynamic batcher (``GetDynamicBatch``): walk the queue from the oldest request, summing
  request batch sizes while the sum stays <= ``max_batch_size`` and every shape-enforced
  input has the same shape as the oldest's (``shape_key``). On the way, mark a *cut*: the
  last sum equal to a preferred size or, when none was reached, the sum just before it
  would pass the largest preferred size. Then:
  * the oldest request's ``max_queue_delay`` has not run out (a delay of 0 never does)
    and there is a cut: send up to the cut now;
  * the walk filled the batch (the next request does not fit, or a shape differs), or the
    sum reached the largest preferred size: send all walked now;
  * the delay has run out, or is 0: send all walked, up to ``max_batch_size``, preferred
    sizes notwithstanding;
  * otherwise wait until the oldest request's delay runs out.
- A request with batch size n counts n toward max_batch_size and is never split.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(slots=True)
class Queued:
    """A request waiting in a model's queue (the scheduler's view of it).

    Attributes:
        key: unique id of the request within the scheduler.
        batch_size: how much of max_batch_size it uses (``max(1, request batch)``).
        shape_key: requests batch together only when equal (shapes of enforced inputs).
        enqueue_ns: when it entered the queue.
        payload: whatever the caller needs back with the batch (the descriptor).
    """

    key: Hashable
    batch_size: int
    shape_key: Hashable
    enqueue_ns: int
    payload: object = None


@dataclass(frozen=True, slots=True)
class Batch:
    """A batch handed to one instance."""

    instance_id: int
    requests: tuple[Queued, ...]
    total_batch_size: int
    reason: str
    """Why it closed: ``single``, ``max``, ``preferred``, ``shape``, ``delay``."""


class ModelScheduler(Protocol):
    """What the scheduler process needs from a per-model scheduler."""

    def offer(self, item: Queued, now_ns: int) -> None:
        """Enqueue a request."""
        ...

    def instance_idle(self, instance_id: int) -> None:
        """An instance finished its batch (or became ready) and can take another."""
        ...

    def instance_gone(self, instance_id: int) -> None:
        """An instance died or stopped: never hand it work until ``instance_idle``."""
        ...

    def pop_ready(self, now_ns: int) -> list[Batch]:
        """Batches to dispatch now, each to one idle instance."""
        ...

    def next_deadline_ns(self) -> int | None:
        """When ``pop_ready`` may produce a batch without any other event; None = never."""
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


class _QueueAndInstances:
    """What every per-model scheduler keeps: a FIFO queue and idle instances in FIFO order
    (so load spreads over all instances)."""

    def __init__(self, instance_ids: Sequence[int] = ()) -> None:
        self._queue: collections.deque[Queued] = collections.deque()
        self._idle: collections.deque[int] = collections.deque(instance_ids)

    def offer(self, item: Queued, now_ns: int) -> None:
        self._queue.append(item)

    def instance_idle(self, instance_id: int) -> None:
        if instance_id not in self._idle:
            self._idle.append(instance_id)

    def instance_gone(self, instance_id: int) -> None:
        with contextlib.suppress(ValueError):
            self._idle.remove(instance_id)

    def next_deadline_ns(self) -> int | None:
        return None

    def drain_queue(self) -> list[Queued]:
        items = list(self._queue)
        self._queue.clear()
        return items

    def cancel(self, key: Hashable) -> Queued | None:
        for item in self._queue:
            if item.key == key:
                self._queue.remove(item)
                return item
        return None

    def queue_depth(self) -> int:
        return len(self._queue)


class DefaultScheduler(_QueueAndInstances):
    """Triton's default scheduler: each request runs alone on the next idle instance."""

    def pop_ready(self, now_ns: int) -> list[Batch]:
        out = []
        idle, queue = self._idle, self._queue
        while idle and queue:
            item = queue.popleft()
            out.append(Batch(idle.popleft(), (item,), item.batch_size, "single"))
        return out


class DynamicBatcher(_QueueAndInstances):
    """Triton's dynamic batcher for one model version (see the module docstring).

    Args:
        max_batch_size: ``max_batch_size`` of the model (>= 1).
        preferred_batch_sizes: ``dynamic_batching.preferred_batch_size`` (normalised: empty
            means ``[max_batch_size]``).
        max_queue_delay_us: ``dynamic_batching.max_queue_delay_microseconds``.
        instance_ids: instances that start idle.
    """

    def __init__(
        self,
        max_batch_size: int,
        preferred_batch_sizes: Sequence[int] = (),
        max_queue_delay_us: int = 0,
        instance_ids: Sequence[int] = (),
    ) -> None:
        if max_batch_size < 1:
            raise ValueError("the dynamic batcher needs max_batch_size >= 1")
        self.max_batch_size = max_batch_size
        self.preferred = frozenset(p for p in preferred_batch_sizes if 0 < p <= max_batch_size)
        self.max_preferred = max(self.preferred, default=max_batch_size)
        self.max_queue_delay_ns = max_queue_delay_us * 1000
        super().__init__(instance_ids)

    def pop_ready(self, now_ns: int) -> list[Batch]:
        out = []
        idle = self._idle
        while idle and self._queue:
            batch = self._form(now_ns)
            if batch is None:
                break
            n, total, reason = batch
            items = tuple(self._queue.popleft() for _ in range(n))
            out.append(Batch(idle.popleft(), items, total, reason))
        return out

    def _form(self, now_ns: int) -> tuple[int, int, str] | None:
        """(request count, total batch size, reason) of the batch to send now, or None."""
        queue = self._queue
        oldest = queue[0]
        key = oldest.shape_key
        total = 0
        count = 0
        # (count, total) at the last preferred size, or just before passing the largest one
        cut: tuple[int, int] | None = None
        stop = ""
        for item in queue:
            if item.shape_key != key:
                stop = "shape"
                break
            grown = total + item.batch_size
            if count and cut is None and grown > self.max_preferred:
                cut = (count, total)
            if grown > self.max_batch_size:
                stop = "max"
                break
            total = grown
            count += 1
            if total in self.preferred:
                cut = (count, total)
            if total >= self.max_batch_size:
                stop = "max"
                break
        if count == 0:
            # NOTE: the oldest request alone exceeds max_batch_size; the frontend rejects
            # such requests, so this only guards against a bad descriptor.
            return 1, oldest.batch_size, "max"
        delay_ns = self.max_queue_delay_ns
        delay_ran_out = delay_ns > 0 and now_ns - oldest.enqueue_ns >= delay_ns
        if cut is not None and not delay_ran_out:
            return cut[0], cut[1], "preferred" if cut[1] in self.preferred else stop or "max"
        if stop:
            return count, total, stop
        if delay_ran_out or delay_ns == 0:
            return count, total, "delay"
        if total >= self.max_preferred:
            return count, total, "max"
        return None

    def next_deadline_ns(self) -> int | None:
        if not self._queue or not self._idle or self.max_queue_delay_ns == 0:
            return None
        return self._queue[0].enqueue_ns + self.max_queue_delay_ns
