"""A batch the scheduler said is due: how long the worker polls its inbox for it.

Imported by ``workers.main``. The scheduler sends ``BatchDue(at_ns)`` to an idle instance
shortly before a batching delay runs out (``scheduler.policies.clock.wait_plan``). Until the batch
arrives, or ``POLL_GRACE_NS`` after the due time, the worker's loop polls its rings
(``ipc.channel.Inbox.poll``) instead of sleeping on its semaphore, so the ``BatchAssign``
finds it running: no futex wake-up by the scheduler, no cold start on a halted vCPU. A
worker without a notice sleeps as before, so an idle one costs nothing.

Only while this instance's batches are small: the scheduler decides that alone, and sends
no notice to an instance whose recent batches were large (``scheduler.due_sizes``, where the
rule and its measurements live); this loop polls after every notice it gets.
"""

from __future__ import annotations

POLL_GRACE_NS = 100_000
"""How long after the due time the worker goes on polling: the scheduler polls up to the
deadline itself and sends the batch within a few tens of µs of it, unless another event
(a request that fills the batch, another instance freed) changed the plan meanwhile."""

MAX_POLL_NS = 500_000
"""The longest one notice makes the worker poll, however early it came."""


class DueBatch:
    """The due time of the batch announced to this instance, if any (module docstring)."""

    def __init__(self) -> None:
        self.at_ns: int | None = None
        self._until_ns = 0

    def expect(self, at_ns: int, now_ns: int) -> None:
        """A ``BatchDue`` arrived at ``now_ns`` (CLOCK_MONOTONIC ns) for ``at_ns``."""
        self.at_ns = at_ns
        self._until_ns = min(at_ns + POLL_GRACE_NS, now_ns + MAX_POLL_NS)

    def arrived(self) -> None:
        """A batch arrived: nothing is due any more."""
        self.at_ns = None

    def poll_s(self, now_ns: int) -> float:
        """Seconds to poll the inbox before sleeping on it (0: sleep at once). A notice
        whose window has passed is dropped."""
        if self.at_ns is None:
            return 0.0
        left = self._until_ns - now_ns
        if left <= 0:
            self.at_ns = None
            return 0.0
        return left / 1e9
