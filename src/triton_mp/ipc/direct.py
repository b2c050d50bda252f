"""The direct handoff: a frontend hands a request straight to an idle instance.

Imported by the supervisor (which creates each instance's lease and rings and tells the
frontends their ``DirectRoute`` s), the scheduler (which offers and takes back leases) and
the frontends (which take them). When a model version has no batching delay
(``handoff_eligible``), its queue is empty and an instance of it is idle, the scheduler would
send the next request to that instance at once; the frontend does it itself instead, which
takes the scheduler's wake-up and pass off the request's path (about 120 µs of a c=1
request's p50 and as much CPU on this machine: ``bench/README.md``, "Fewer hops at c=1").

The *lease* of an instance is a POSIX semaphore, 0 or 1. Only the scheduler posts it
(``Lease.offer``), and only while the instance is idle, its version eligible and its queue
empty. Whoever takes it (``Lease.take``, ``sem_trywait``: atomic, so one taker wins) owns
the instance's next batch: the scheduler, before it dispatches a queued batch to the instance;
or a frontend, which then leaves a ``DirectSent`` on its ring to the scheduler (without
waking it) and pushes the ``BatchAssign`` onto its own ring into the worker's inbox. The
worker runs it as any batch and reports ``BatchDone``, from which the scheduler counts it.
A frontend's Python side hands the requests it submits (``frontend.dispatch.direct``), its
native gRPC thread the known calls it submits itself (``frontend/native/direct_handoff.h``,
by the same rules, as their REQUEST records): at c=1 such a call crosses the gRPC thread and
the worker only, with no Python on its way in.

After a batch, the worker posts its own lease when the scheduler would have offered it on
reading the ``BatchDone`` (``worker_reoffers``: the scheduler said, through the quiet flag of
the worker's ring, that nothing waits for the instance and nothing is for it to decide), and
sends ``BatchDone(reoffered=True)`` without waking it; the scheduler counts the lease as
offered when it reads the message on a later pass. Otherwise the ``BatchDone`` wakes the
scheduler, which decides. So at c=1 a request crosses the frontend and the worker only: the
scheduler sleeps, and reads the ``DirectSent`` and ``BatchDone`` records (statistics, the
batch log) when something else wakes it (a query, a request it must queue, a full ring).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import posix_ipc

from triton_mp.ipc.memory.shm import create_semaphore
from triton_mp.ipc.protocol.control_messages import DirectRoute as DirectRoute
from triton_mp.ipc.protocol.specs import ModelVersionSpec


def handoff_eligible(spec: ModelVersionSpec, rate_limited: bool) -> bool:
    """Whether requests of ``spec`` may be handed straight to an idle instance: the
    scheduler would dispatch such a request alone and at once (Triton's default scheduler,
    or a dynamic batcher with ``max_queue_delay_microseconds`` 0, the queue empty); not a
    sequence, ensemble or decoupled model, no ``preserve_ordering``, no rate limiter
    (``--rate-limit execution_count``: batches wait for resources), no queue policy with a
    ``default_timeout_microseconds`` on any level: Triton applies the timeout when it forms
    the batch (core ``PriorityQueue::ApplyPolicyAtCursor``), so a request whose timeout ran
    out on its way to an idle instance is refused, which only the scheduler's pass checks."""
    b = spec.batching
    if b.kind == "dynamic":
        if b.max_queue_delay_us or b.preserve_ordering:
            return False
        levels = [b.default_queue_policy, *b.priority_queue_policy.values()]
        if any(level.default_timeout_us for level in levels):
            return False
    elif b.kind != "default":
        return False
    return (
        not rate_limited and not spec.decoupled and spec.sequence is None and spec.ensemble is None
    )


def worker_reoffers(quiet: bool, scheduler_woken: bool, rescheduled: bool) -> bool:
    """Whether a worker whose version is handoff-eligible (it holds a lease) posts its lease
    itself after a batch, instead of waking the scheduler to offer it.

    Args:
        quiet: the quiet flag of the worker's ring to the scheduler, read after its answers
            went out: set, at the end of the scheduler's last pass, only while no request
            is queued for the version, the version is active (not retiring: no unload or
            reload under way), and, server-wide, the scheduler is not stopping, holds no
            deferred request, runs no ensemble request and rate-limits nothing
            (``scheduler.done_wakeups``; ``SchedulerCore.quiet_done``). Sequence,
            decoupled, ensemble and rate-limited versions hold no lease at all.
        scheduler_woken: a post of the scheduler's wake-up is pending (a request, a query,
            a death or a model change is on its way into a pass, whose end may clear the
            flag): it decides then.
        rescheduled: the model released requests with ``RELEASE_RESCHEDULE``: they are
            queued again, so the scheduler decides (that ``BatchDone`` always wakes).

    Returns:
        True: post the lease, then send ``BatchDone(reoffered=True)`` without a wake-up.
        False: send ``BatchDone`` with a wake-up; the scheduler offers the lease or
        dispatches queued work.
    """
    return quiet and not scheduler_woken and not rescheduled


def create_lease(name: str) -> str:
    """Create an instance's lease, not offered (supervisor); returns its name."""
    create_semaphore(name, initial_value=0).close()
    return name


class Lease:
    """One instance's lease (see the module docstring)."""

    __slots__ = ("_sem",)

    def __init__(self, name: str) -> None:
        self._sem = posix_ipc.Semaphore(name)

    def offer(self) -> bool:
        """Make the instance's next batch anyone's: post the lease, unless it is posted
        (False). A lease is 0 or 1: after a claim expired (``scheduler.direct``'s
        ``CLAIM_TIMEOUT_NS``) the scheduler's count of posts may miss one that is up (the
        late ``DirectSent`` of the claim took one off twice), and a second post would let two
        frontends hand the instance a batch each. The read and the post are two steps: its
        two posters, the scheduler and the instance's worker, post at once only then."""
        if self._sem.value:
            return False
        self._sem.release()
        return True

    def offered(self) -> bool:
        """Whether the lease is up for taking (a read: no syscall)."""
        return bool(self._sem.value)

    def take(self) -> bool:
        """Take the lease; False when someone else has it (``sem_trywait``)."""
        if not self._sem.value:
            return False
        try:
            self._sem.acquire(0)
        except posix_ipc.BusyError:
            return False
        return True

    def close(self) -> None:
        """Close the handle."""
        with contextlib.suppress(posix_ipc.Error):
            self._sem.close()


class SelfOffer:
    """A worker's side of ``worker_reoffers``: its lease, and the two reads the rule needs.

    Args:
        lease: the instance's lease name (``WorkerSpec.lease``).
        quiet: reads the quiet flag of the worker's ring to the scheduler
            (``channel.Sender.consumer_quiet``).
        scheduler_woken: whether a post of the scheduler's wake-up is pending
            (``channel.Sender.consumer_woken``).
    """

    __slots__ = ("_lease", "_quiet", "_woken", "reoffered")

    def __init__(
        self, lease: str, quiet: Callable[[], bool], scheduler_woken: Callable[[], bool]
    ) -> None:
        self._lease = Lease(lease)
        self._quiet = quiet
        self._woken = scheduler_woken
        self.reoffered = 0
        """Batches after which this worker posted its lease (tests, logs)."""

    def after_batch(self, rescheduled: bool) -> bool:
        """Post the lease when ``worker_reoffers`` says so; returns whether it did. Call it
        after the batch's answers are posted and before its ``BatchDone`` is pushed: a
        frontend may take the lease (and push its ``DirectSent``) before the scheduler
        reads that ``BatchDone``, which ``scheduler.direct`` allows for; the other order
        could let the scheduler try to take back a lease not posted yet."""
        if not worker_reoffers(self._quiet(), self._woken(), rescheduled):
            return False
        if not self._lease.offer():
            return False  # NOTE: posted already: the scheduler must count no second post
        self.reoffered += 1
        return True

    def close(self) -> None:
        """Close the lease's handle."""
        self._lease.close()
