"""A batch the scheduler said is due: how long the worker polls its inbox for it.

Imported by ``workers.main``. The scheduler sends ``BatchDue(at_ns)`` to an idle instance
shortly before a batching delay runs out (``scheduler.policies.clock.wait_plan``). Until the batch
arrives, or ``POLL_GRACE_NS`` after the due time, the worker's loop polls its rings
(``ipc.channel.Inbox.poll``) instead of sleeping on its semaphore, so the ``BatchAssign``
finds it running: no futex wake-up by the scheduler, no cold start on a halted vCPU. A
worker without a notice sleeps as before, so an idle one costs nothing.

Only while this instance's batches are small (``POLL_MAX_REQUESTS``): the poll yields the
CPU between looks but, on a quiet machine, spends a core for its whole length, once per
batch; it pays where latency is the goal (a lone request waits for the wake-up), not under
load, where a batch's requests share one wake-up and the 2 cores are what limits.

While it would ignore them, the worker asks the scheduler for no notices at all (``ask``:
the quiet flag of the scheduler's ring to it, ``ipc.memory.ring.Ring.set_quiet``, which
``scheduler.main.Router.send`` reads before it sends a ``BatchDue``): a notice is pushed with
a post, and at c=16 (batches of ~10) the ignored ones woke each worker 0.85 times per batch for
nothing. A notice dropped while the flag changes only costs the poll it would have started.
"""

from __future__ import annotations

from collections.abc import Callable

POLL_GRACE_NS = 100_000
"""How long after the due time the worker goes on polling: the scheduler polls up to the
deadline itself and sends the batch within a few tens of µs of it, unless another event
(a request that fills the batch, another instance freed) changed the plan meanwhile."""

MAX_POLL_NS = 500_000
"""The longest one notice makes the worker poll, however early it came."""

POLL_MAX_REQUESTS = 4
"""The worker polls for a due batch only while its recent batches held at most this many
requests on average (``SIZE_WEIGHT``); otherwise it sleeps until the batch's post.
Measured (add_sub_py, load ~11, instrumented worker): at c=16 (batches of ~10) 67% of the
batches came after a notice and the poll lasted 127 µs per notice (~85 µs per batch, ~8.5 µs
per inference on a quiet machine); at c=1 (batches of 1) it lasts ~110 µs per batch and keeps
p50 at 0.80x Triton's."""

SIZE_WEIGHT = 0.25
"""The weight of the last batch in the running mean of batch sizes that ``POLL_MAX_REQUESTS``
bounds. On the last batch alone, 27% of c=16's batches (sizes spread around ~10) still
followed one of at most 4 requests and polled ~116 µs each (instrumented, load ~7)."""


class DueBatch:
    """The due time of the batch announced to this instance, if any (module docstring).

    Args:
        ask: ``ask(wanted)`` tells the scheduler whether to send notices at all (True: send;
            ``workers.main``); called here with True, then whenever the mean crosses
            ``POLL_MAX_REQUESTS``. None: notices always come.
    """

    def __init__(self, ask: Callable[[bool], None] | None = None) -> None:
        self.at_ns: int | None = None
        self._until_ns = 0
        self.mean_requests = 0.0
        """The running mean of this instance's batch sizes (``SIZE_WEIGHT``; 0 before the
        first batch)."""
        self._ask = ask
        self._asked = True
        """What ``ask`` was last told."""
        if ask is not None:
            # NOTE: a restarted instance's ring may keep its predecessor's flag.
            ask(True)

    def expect(self, at_ns: int, now_ns: int) -> None:
        """A ``BatchDue`` arrived at ``now_ns`` (CLOCK_MONOTONIC ns) for ``at_ns``; ignored
        while the recent batches held more than ``POLL_MAX_REQUESTS`` requests on average."""
        if self.mean_requests > POLL_MAX_REQUESTS:
            return
        self.at_ns = at_ns
        self._until_ns = min(at_ns + POLL_GRACE_NS, now_ns + MAX_POLL_NS)

    def arrived(self, requests: int) -> None:
        """A batch of ``requests`` arrived: nothing is due any more; it joins the mean (and
        the scheduler is asked for notices, or for none, when the mean crossed the bound)."""
        self.at_ns = None
        mean = self.mean_requests + SIZE_WEIGHT * (requests - self.mean_requests)
        self.mean_requests = mean
        if self._ask is not None and (mean <= POLL_MAX_REQUESTS) is not self._asked:
            self._asked = not self._asked
            self._ask(self._asked)

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
