"""Triton's dynamic batcher for one model version.

The policy of a model with ``dynamic_batching`` (registered as ``dynamic`` in
``scheduler.registry.POLICIES``); its ``walk`` and ``decide`` also form the Oldest strategy's
batches in ``scheduler.policies.sequence``. Pure (``scheduler.policies.policy``). Semantics (Triton
core ``dynamic_batch_scheduler.cc``, docs ``batcher.md``, ``model_configuration.md``):

- A batch is formed only when an instance is idle; while all are busy the queue grows and
  the next batch is bigger.
- ``GetDynamicBatch``: walk the queue (``scheduler.policies.queues``) in service order, summing
  request batch sizes while the sum stays <= ``max_batch_size`` and every shape-enforced
  input has the same shape as the first request's (``shape_key``). On the way, mark a
  *cut*: the last sum equal to a preferred size or, when none was reached, the sum just
  before it would pass the largest preferred size. The *oldest* request is the one with the
  earliest enqueue time among those walked.
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

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

from triton_mp.common.close_reason import CloseReason
from triton_mp.scheduler.policies.policy import Batch, Queued
from triton_mp.scheduler.policies.queues import PriorityQueue, QueuedInstances


@dataclass(frozen=True, slots=True)
class Walk:
    """What walking the queue from its head found (see the module docstring)."""

    count: int
    total: int
    cut: tuple[int, int] | None
    stop: CloseReason | None
    """Why the walk stopped early (``MAX``: full or the next does not fit, ``SHAPE``)."""
    oldest_ns: int


class DynamicBatcher(QueuedInstances):
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
        self._walked: Walk | None = None
        self._walked_at = -1
        """The last walk and the queue ``version`` it walked: ``pop_ready`` and
        ``next_deadline_ns`` run on every pass of the scheduler's loop, and the queue
        changes far less often than that."""
        self._room: tuple[Walk | None, tuple[int, int] | None] = (None, None)
        """The last walk ``forming_room`` saw and its answer (it runs on every pass too)."""

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

    def _walk(self) -> Walk:
        queue = self._queue
        if self._walked is None or self._walked_at != queue.version:
            self._walked = walk(queue, self.max_batch_size, self.preferred, self.max_preferred)
            self._walked_at = queue.version
        return self._walked

    def _form(self, now_ns: int) -> tuple[int, int, CloseReason] | None:
        """(request count, total batch size, reason) of the batch to send now, or None."""
        if self.max_batch_size == 0:
            head = next(iter(self._queue))
            return 1, head.batch_size, CloseReason.SINGLE
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

    def due_batch(self) -> tuple[int, int] | None:
        if not (self._queue and self._idle and self.max_queue_delay_ns and self.max_batch_size):
            return None
        w = self._walk()
        if w.cut or w.stop or w.total >= self.max_preferred:
            return None  # NOTE: due now: the next dispatch pass sends it.
        return self._idle[0], w.oldest_ns + self.max_queue_delay_ns

    def forming_room(self) -> tuple[int, int] | None:
        queue = self._queue
        if not (queue and self._idle and self.max_queue_delay_ns and self.max_batch_size):
            return None
        if queue.priority_levels > 1:
            return None
        w = self._walk()
        room = self._room
        if room[0] is not w:
            room = self._room = (w, self._room_after(w))
        return room[1]

    def _room_after(self, w: Walk) -> tuple[int, int] | None:
        """``forming_room`` of walk ``w`` (an idle instance, a delay, one level)."""
        if w.cut or w.stop or w.total >= self.max_preferred:
            return None  # NOTE: due now, as in due_batch
        rows = room_before_cut(w.total, self.preferred, self.max_preferred, self.max_batch_size)
        return (rows, w.oldest_ns) if rows > 0 else None


def walk(
    items: Iterable[Queued],
    max_batch_size: int,
    preferred: frozenset[int],
    max_preferred: int,
) -> Walk:
    """Walk ``items`` (in service order) as far as one batch can reach (module docstring)."""
    total = 0
    count = 0
    cut: tuple[int, int] | None = None
    stop: CloseReason | None = None
    key: Hashable = None
    oldest = 0
    for item in items:
        if count == 0:
            key = item.shape_key
            oldest = item.enqueue_ns
        elif item.shape_key != key:
            stop = CloseReason.SHAPE
            break
        grown = total + item.batch_size
        if count and cut is None and grown > max_preferred:
            cut = (count, total)
        if grown > max_batch_size:
            stop = CloseReason.MAX
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
            stop = CloseReason.MAX
            break
    return Walk(count, total, cut, stop, oldest)


def room_before_cut(
    total: int, preferred: frozenset[int], max_preferred: int, max_batch_size: int
) -> int:
    """The rows that may join a walk of ``total`` rows that found no cut and no stop while
    it still finds none: the sums on the way stay below the smallest preferred size above
    ``total``, ``max_preferred`` and ``max_batch_size`` (``walk``: reaching any of them
    cuts or stops it; passing ``max_preferred`` cuts it). 0 when none may."""
    limit = min(max_preferred, max_batch_size)
    for p in preferred:
        if total < p < limit:
            limit = p
    return max(0, limit - 1 - total)


def decide(
    w: Walk,
    now_ns: int,
    delay_ns: int,
    preferred: frozenset[int],
    max_preferred: int,
    idle_since_ns: int,
) -> tuple[int, int, CloseReason] | None:
    """(request count, total batch size, reason) to send now after walk ``w``, or None to
    wait for the delay (module docstring). ``idle_since_ns``: when the instance that would
    take the batch became idle."""
    delay_ran_out = delay_ns > 0 and now_ns - w.oldest_ns >= delay_ns
    if w.cut is not None and not delay_ran_out:
        reason = CloseReason.PREFERRED if w.cut[1] in preferred else w.stop or CloseReason.MAX
        return w.cut[0], w.cut[1], reason
    if w.stop:
        return w.count, w.total, w.stop
    if delay_ran_out:
        # NOTE: when the delay ran out while every instance was busy, the batch closed
        # because an instance became free, not because of the delay.
        waited_for_instance = idle_since_ns > w.oldest_ns + delay_ns
        return w.count, w.total, CloseReason.IDLE if waited_for_instance else CloseReason.DELAY
    if delay_ns == 0:
        return w.count, w.total, CloseReason.IDLE
    if w.total >= max_preferred:
        return w.count, w.total, CloseReason.MAX
    return None
