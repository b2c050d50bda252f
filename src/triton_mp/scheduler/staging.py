"""Staging: a queued request's ``BatchAssign`` sent behind the batch its instance runs.

Imported by ``scheduler.core`` (its dispatch pass, ``_assign``, a worker's death and a refused
batch) and ``scheduler.batch_end`` (a ``BatchDone`` promotes the staged batch); pure: no I/O
and no clock. Without it, a request queued for a busy instance waits for the running batch's
``BatchDone`` to wake the scheduler, whose pass then sends it: the worker idles for that
round trip, and each such call costs a scheduler pass on its path (#34, id1m_shm: ~127 µs of
the scheduler's CPU per inference, the largest piece left). Staged, the worker finds the
next batch in its ring when it ends the running one and starts it at once; the running
batch's ``BatchDone`` (it always wakes the scheduler: ``done_wakeups`` leaves an instance
with a staged batch out of the quiet ones) promotes the staged batch to running and may
stage the next.

This is Triton's own prefetch (core ``RateLimiter::PayloadSlotAvailable``: a model's
scheduler may enqueue payloads beyond its idle instances), allowed only where Triton allows
it (``PriorityQueue::support_prefetching_``) and where nothing can change the choice after
the batch left the queue (``stageable``):
- one instance: the staged batch cannot be wanted by another instance that frees first;
- the default scheduler (no ``dynamic_batching``): each request runs alone, so the staged
  batch is what would run. A dynamic batcher's prefetched payload keeps growing until an
  instance takes it (core ``GetDynamicBatch``, ``payload_batch_size``), which a batch
  already sent cannot: dynamic batching is not staged;
- no priority levels, no queue timeout (``default_timeout_microseconds``, also per level),
  no ``allow_timeout_override``, no ``max_queue_size`` (``support_prefetching_``'s terms);
- not a sequence, decoupled or ensemble model, no ``preserve_ordering``, no rate limiter
  (``--rate-limit execution_count``: batches wait for resources);
- the instance active (not retiring: an unload or reload finishes what runs and is queued).

Per instance (``Stager.pop``): ready and active, running a batch the scheduler sent (its own
ring, so the worker runs the two in order: a direct batch, ``batch_id`` < 0, comes from a
frontend's ring, which the worker may read after the scheduler's), nothing staged already,
no open decoupled requests, and no frontend holding or offered its lease
(``Handoffs.holds``; ``scheduler.direct``): a frontend's batch goes first.

What a staged request is, by Triton's rules (a prefetched payload's request has left the
queue):
- queued in the statistics until its worker starts it: its queue time ends at the worker's
  ``BatchDone.start_ns``, not at staging (``batch_end``), and it counts as pending in the
  metrics and as waiting in ``triton-mp stat`` (``InstanceStatus.waiting_requests``) until
  promoted;
- a cancellation is forwarded to its worker like a running request's (``running_instance``);
- a worker that dies before it starts it: the staged batch goes back to the front of the
  queue (``on_died``) and runs on the restarted instance, as a queued request would; its
  record in ``triton-mp stat``'s batch log is taken back (``BatchLog.unrecord``), so the
  batch formed again counts once;
- a batch refused for its ring (``core.deliver``'s ``RecordTooLarge``) leaves the running
  one alone (``refused``).
A worker may have re-offered its lease after the running batch (it read its ring's quiet flag
before the pass that staged cleared it): the re-offer is counted at promotion, and a direct
batch a frontend handed meanwhile waits for the staged one (``Handoffs.batch_ended``'s
``start_waiting``).
"""

from __future__ import annotations

import logging
from typing import Protocol

from triton_mp.scheduler.instances import (
    Generation,
    Health,
    InFlight,
    Instance,
    InstanceState,
    InstanceTable,
)
from triton_mp.scheduler.policies.policy import Batch
from triton_mp.scheduler.status import BatchLogs

log = logging.getLogger(__name__)


class LeaseHolders(Protocol):
    """``scheduler.direct.Handoffs``' view of a lease (tests pass a fake)."""

    def holds(self, instance_id: int) -> bool:
        """Whether a frontend holds or may take the instance's next batch."""
        ...


def stageable(gen: Generation, rate_limited: bool) -> bool:
    """Whether a batch of ``gen`` may ever be staged (the module docstring's spec terms)."""
    spec = gen.spec
    b = spec.batching
    policies = (b.default_queue_policy, *b.priority_queue_policy.values())
    return (
        not rate_limited
        and len(spec.instance_ids) == 1
        and b.kind == "default"
        and not b.priority_levels
        and not b.preserve_ordering
        and not any(
            p.default_timeout_us or p.max_queue_size or p.allow_timeout_override for p in policies
        )
        and spec.sequence is None
        and spec.ensemble is None
        and not spec.decoupled
    )


def may_stage_on(inst: Instance, gen: Generation, leases: LeaseHolders) -> bool:
    """Whether ``inst`` (of ``gen``) takes a staged batch now (the module docstring's
    instance terms)."""
    flight = inst.batch
    return (
        flight is not None
        and flight.batch_id > 0
        and inst.behind is None
        and not inst.staged
        and not inst.open
        and not inst.leased
        and inst.generation is gen
        and inst.state is InstanceState.ACTIVE
        and inst.health is Health.READY
        and not leases.holds(inst.instance_id)
    )


class Stager:
    """The scheduler's staged batches (see the module docstring).

    Args:
        instances: the scheduler's instance table.
        leases: who holds each instance's lease (``Handoffs``).
        rate_limited: ``--rate-limit execution_count`` is on (nothing is staged).

    Attributes:
        staged: batches staged since the start (logs, tests).
    """

    def __init__(self, instances: InstanceTable, leases: LeaseHolders, rate_limited: bool):
        self._instances = instances
        self._leases = leases
        self._rate_limited = rate_limited
        self._eligible: dict[int, tuple[Generation, bool]] = {}
        """Per generation (``id``, with the generation: ids are reused): ``stageable``."""
        self._popped: dict[int, Batch] = {}
        """Per instance: its staged batch as the policy formed it (its queue items, for
        ``on_died``)."""
        self.staged = 0

    def eligible(self, gen: Generation) -> bool:
        """``stageable(gen)``, asked once per generation."""
        known = self._eligible.get(id(gen))
        if known is not None and known[0] is gen:
            return known[1]
        ok = stageable(gen, self._rate_limited)
        self._eligible[id(gen)] = (gen, ok)
        return ok

    def pop(self, gen: Generation, now_ns: int) -> list[Batch]:
        """The batch to stage on ``gen``'s instance now, formed by its policy as if the
        instance were idle ([] when nothing may be staged). ``gen`` is active; the caller
        assigns the batch (``place``)."""
        if not gen.policy.queue_depth() or not self.eligible(gen):
            return []
        inst = self._instances.get(gen.spec.instance_ids[0])
        if inst is None or not may_stage_on(inst, gen, self._leases):
            return []
        policy = gen.policy
        policy.instance_idle(inst.instance_id, now_ns)
        batches = policy.pop_ready(now_ns)
        if not batches:
            policy.instance_gone(inst.instance_id)
            return []
        (batch,) = batches
        self._popped[inst.instance_id] = batch
        return batches

    def place(self, inst: Instance, flight: InFlight) -> None:
        """``inst`` is handed ``flight``: it runs it, or, busy, holds it staged."""
        if inst.batch is None:
            inst.batch = flight
            return
        assert inst.behind is None, f"a second batch staged on {inst.label}"
        inst.behind = flight._replace(staged=True)
        self.staged += 1
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "batch %d staged behind batch %d on %s",
                flight.batch_id,
                inst.batch.batch_id,
                inst.label,
                extra={"model": inst.key[0]},
            )

    def promote(self, inst: Instance) -> bool:
        """``inst``'s running batch ended: its staged batch, if any, runs now (True)."""
        behind = inst.behind
        if behind is None:
            return False
        inst.batch, inst.behind = behind, None
        self._popped.pop(inst.instance_id, None)
        return True

    def on_died(self, instance_id: int, now_ns: int, logs: BatchLogs) -> None:
        """``instance_id``'s worker died: a batch staged on it never started (a started one
        was promoted by its predecessor's ``BatchDone``, read first): its requests go back
        to the front of the queue, in order, as if never staged, and its record leaves
        ``logs`` (``triton-mp stat``'s; the batch is recorded when it is formed again)."""
        inst = self._instances.get(instance_id)
        batch = self._popped.pop(instance_id, None)
        if inst is None or inst.behind is None:
            return
        formed_ns = inst.behind.dispatch_ns
        inst.behind = None
        gen = inst.generation
        if gen is None or batch is None:
            return
        logs.get(gen.key).unrecord(batch, inst, formed_ns)
        policy = gen.policy
        rest = policy.drain_queue()
        for item in (*batch.requests, *rest):
            # NOTE: stageable: no max_queue_size, so the queue takes each back.
            policy.offer(item, now_ns)

    def refused(self, inst: Instance, batch_id: int) -> bool:
        """A batch ``batch_id`` of ``inst`` could not be sent (``core.refuse``): True when it
        was the staged one (dropped; the running batch goes on)."""
        behind = inst.behind
        if behind is None or behind.batch_id != batch_id:
            return False
        inst.behind = None
        self._popped.pop(inst.instance_id, None)
        return True
