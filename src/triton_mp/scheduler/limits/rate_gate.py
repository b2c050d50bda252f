"""The rate limiter as the scheduler core uses it: formed batches held until the limiter
grants their instance's resources (``--rate-limit execution_count``).

Imported by ``scheduler.core``. Pure: no ipc, no clock. ``scheduler.limits.rate_limiter`` decides
which staged instance runs next; this keeps each staged instance's batch until then.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import Generic, TypeVar

from triton_mp.scheduler.limits.rate_limiter import Limits, RateLimiter

T = TypeVar("T")

log = logging.getLogger(__name__)


class RateGate(Generic[T]):
    """Batches (``T``: the batch message) waiting for resources, per instance.

    Args:
        limiter: the server's rate limiter; None: every batch starts at once (``hold`` is
            never called then).
    """

    def __init__(self, limiter: RateLimiter | None) -> None:
        self.limiter = limiter
        self._held: dict[int, T] = {}

    def register(self, instances: Iterable[tuple[int, Limits]]) -> None:
        """Tell the limiter the limits of every instance it does not know yet."""
        limiter = self.limiter
        if limiter is None:
            return
        for iid, limits in instances:
            if not limiter.known(iid):
                limiter.register(iid, limits)
                if limiter.error:
                    log.error("rate limiter: %s", limiter.error)

    def hold(self, instance_id: int, assign: T) -> None:
        """Keep an instance's formed batch until its resources are granted."""
        assert self.limiter is not None
        self._held[instance_id] = assign
        self.limiter.stage(instance_id)

    def release(self, instance_id: int) -> None:
        """An instance's batch ended: its resources are free (granted on the next pass)."""
        if self.limiter is not None:
            self.limiter.release(instance_id)

    def grants(self) -> Iterator[tuple[int, T | None]]:
        """Every instance the limiter grants resources now, with its held batch (None: it
        holds none any more; the caller releases the resources again)."""
        if self.limiter is None:
            return
        for iid in self.limiter.allocate():
            yield iid, self._held.pop(iid, None)

    def forget(self, instance_id: int) -> None:
        """An instance died: its batch and its stage are gone (it may come back)."""
        if self.limiter is not None:
            self.limiter.forget(instance_id)
            self._held.pop(instance_id, None)

    def remove(self, instance_ids: Iterable[int]) -> None:
        """Instances stopped for good."""
        if self.limiter is not None:
            for iid in instance_ids:
                self.limiter.remove(iid)
                self._held.pop(iid, None)
