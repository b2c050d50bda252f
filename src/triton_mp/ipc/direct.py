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
"""

from __future__ import annotations

import contextlib

import posix_ipc

from triton_mp.ipc.memory.shm import create_semaphore
from triton_mp.ipc.protocol.control_messages import DirectRoute as DirectRoute
from triton_mp.ipc.protocol.specs import ModelVersionSpec


def handoff_eligible(spec: ModelVersionSpec, rate_limited: bool) -> bool:
    """Whether requests of ``spec`` may be handed straight to an idle instance: the
    scheduler would dispatch such a request alone and at once (Triton's default scheduler,
    or a dynamic batcher with ``max_queue_delay_microseconds`` 0, the queue empty); not a
    sequence, ensemble or decoupled model, no ``preserve_ordering``, no rate limiter
    (``--rate-limit execution_count``: batches wait for resources)."""
    b = spec.batching
    if b.kind == "dynamic":
        if b.max_queue_delay_us or b.preserve_ordering:
            return False
    elif b.kind != "default":
        return False
    return (
        not rate_limited and not spec.decoupled and spec.sequence is None and spec.ensemble is None
    )


def create_lease(name: str) -> str:
    """Create an instance's lease, not offered (supervisor); returns its name."""
    create_semaphore(name, initial_value=0).close()
    return name


class Lease:
    """One instance's lease (see the module docstring)."""

    __slots__ = ("_sem",)

    def __init__(self, name: str) -> None:
        self._sem = posix_ipc.Semaphore(name)

    def offer(self) -> None:
        """Make the instance's next batch anyone's (scheduler only; from 0)."""
        self._sem.release()

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
