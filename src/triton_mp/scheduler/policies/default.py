"""Triton's default scheduler: every request runs alone, in priority-then-FIFO order.

The policy of a model without ``dynamic_batching`` or ``sequence_batching`` (registered as
``default`` in ``scheduler.registry.POLICIES``). Pure (``scheduler.policies.policy``). Triton core
``scheduler_utils.cc``: one request per execution on the next idle instance; the queue keeps
its policies (``scheduler.policies.queues``), though such a model has one level and none.
"""

from __future__ import annotations

from triton_mp.common.close_reason import CloseReason
from triton_mp.scheduler.policies.policy import Batch
from triton_mp.scheduler.policies.queues import QueuedInstances


class DefaultScheduler(QueuedInstances):
    """Triton's default scheduler: each request runs alone on the next idle instance."""

    def pop_ready(self, now_ns: int) -> list[Batch]:
        out = []
        idle, queue = self._idle, self._queue
        while idle and queue:
            (item,) = queue.popleft(1)
            out.append(Batch(idle.popleft(), (item,), item.batch_size, CloseReason.SINGLE))
        return out
