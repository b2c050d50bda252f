"""The batching policy contract: what every per-model scheduling policy takes and gives.

A *policy* forms the batches of one model version's generation: Triton's default scheduler,
dynamic batcher and sequence batcher are the ones served (``scheduler.policies``; which spec
gets which: ``scheduler.registry.POLICIES``). Policies are pure state machines: no ipc, no
clock, no I/O (``tests/unit/test_layering.py``). The caller passes ``now_ns`` (monotonic
nanoseconds) to every call and asks ``next_deadline_ns`` when to call again; it hands a
policy ``Queued`` items and gets back ``Batch`` es for idle instances, ``Rejection`` s for
requests it refuses or fails, and per-level ``LevelSnapshot`` s for ``triton-mp stat``.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol

from triton_mp.common.close_reason import CloseReason
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
        starts: the first request of its sequence (``SequenceFlags.START``).
        ends: the last request of its sequence (``SequenceFlags.END``).
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
    starts: bool = False
    ends: bool = False


@dataclass(frozen=True, slots=True)
class Batch:
    """A batch handed to one instance."""

    instance_id: int
    requests: tuple[Queued, ...]
    total_batch_size: int
    reason: CloseReason
    """Why it closed."""
    rows: int = 0
    """Batch rows the backend sees (sequence batcher, Direct); 0 = one per request."""
    slots: tuple[int, ...] = ()
    """Row of each request when ``rows`` is set."""
    released: tuple[Hashable, ...] = ()
    """Correlation IDs whose sequences on this instance ended idle since its last batch."""


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a request is refused or failed by its model's policy.

    The caller prefixes the message with Triton's ``[request id: <id>] `` unless
    ``prefixed`` is False (Triton's sequence batcher words its refusals without it).
    """

    code: ErrorCode
    message: str
    reason: str | None = "REJECTED"
    """Failure reason for ``nv_inference_request_failure``: REJECTED, CANCELED, OTHER; None
    for a refusal Triton's queue answers at enqueue, which no statistic or metric counts."""
    prefixed: bool = True
    """Whether the message gets the ``[request id: <id>] `` prefix."""


QUEUE_FULL = Rejection(ErrorCode.UNAVAILABLE, "Exceeds maximum queue size", None)
"""Triton's refusal when a priority level holds ``max_queue_size`` requests (core
``PolicyQueue::Enqueue``: the request never enters the queue, and 2.51 counts it nowhere:
not in the model's ``fail`` nor in ``nv_inference_request_failure``; a queue timeout is
counted, REJECTED)."""
TIMED_OUT = Rejection(ErrorCode.UNAVAILABLE, "Request timeout expired")
"""Triton's error for a request whose queue timeout expired under ``REJECT``."""


def arrived_ns(item: Queued) -> int:
    """When a queued request reached the server: its ``arrival_ns`` (the frontend's
    CLOCK_MONOTONIC stamp) when its payload has one, else its ``enqueue_ns``. Every request
    the scheduler reads in one pass is enqueued at that pass's time, so ``triton-mp stat``
    ages by arrival: by enqueue time a status query read in the same pass saw 0 µs."""
    arrival = getattr(item.payload, "arrival_ns", None)
    return min(arrival, item.enqueue_ns) if isinstance(arrival, int) else item.enqueue_ns


@dataclass(frozen=True, slots=True)
class LevelSnapshot:
    """One priority level at a point in time (for ``triton-mp stat``)."""

    level: int
    depth: int
    delayed: int
    oldest_arrival_ns: int | None
    """When its oldest request reached the server (``arrived_ns``); None when empty."""
    rejected: int
    timed_out: int
    delayed_total: int


class IterativeSteps(Protocol):
    """The steps of an iterative sequence batcher (``iterative_sequence: true``; core
    ``IterativeSequencer``) that the core takes besides ``Policy``'s."""

    def new_sequence_id(self) -> int:
        """The correlation ID of the next request that comes without one (its own
        sequence, which it starts)."""
        ...

    def reschedule(self, item: Queued, now_ns: int) -> Rejection | None:
        """Queue a request the model released with ``RELEASE_RESCHEDULE``, first in its
        sequence."""
        ...

    def finish(self, corrid: Hashable, now_ns: int) -> None:
        """A request of sequence ``corrid`` was released for good: the sequence ends."""
        ...


class Policy(Protocol):
    """What the scheduler core needs from a per-model batching policy."""

    iterative_steps: IterativeSteps | None
    """The iterative sequence batcher's own steps; None for every other policy."""

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

    def regroup(self, added: Sequence[int], leaving: Sequence[int]) -> None:
        """The version's instance group changed in place (core
        ``TritonModel::UpdateInstanceGroup``): ``added`` instances join (idle once
        ``instance_idle`` says so); ``leaving`` ones take no new request or sequence, only
        what they hold (``holds``), and an ``instance_idle`` of one adds it to nothing else."""
        ...

    def holds(self, instance_id: int) -> bool:
        """Whether a leaving instance still has work of its own: a sequence batcher's live
        sequences bound to it (core ``pending_removal_seq_slots_``); False for the others."""
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

    def due_batch(self) -> tuple[int, int] | None:
        """(instance id, ns) of the batch ``pop_ready`` will send when a batching delay runs
        out, if no other event comes first: an idle instance and the delay's end (the
        scheduler's ``BatchDue`` notice); None when no such batch waits."""
        ...

    def forming_room(self) -> tuple[int, int] | None:
        """(rows, oldest arrival ns) while a batch waits for its delay and requests with
        up to ``rows`` rows in all, none arrived before the oldest, would change no decision
        if read only when it runs out (``scheduler.forming``); None when any request may."""
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
