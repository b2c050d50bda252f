"""The scheduler's side of the direct handoff (``ipc.direct``): offering idle instances'
leases to the frontends, taking them back, and a frontend's ``DirectSent`` as a batch.

Imported by ``scheduler.core``; no I/O of its own: the leases are behind the ``Leases``
protocol (the process shell's semaphores, a fake in tests). At the end of every dispatch
pass (``after_dispatch``) each idle, ready, active instance of an eligible version
(``ipc.direct.handoff_eligible``) whose queue is empty has its lease offered; an offer whose
conditions no longer hold (the instance retires, dies, the server stops) is taken back.
Before the policy of a version with queued requests forms batches (``before_dispatch``) its
offers are taken back, so it never hands a batch to an instance a frontend holds: a take
that fails means a frontend won the lease, and the instance is busy until its ``DirectSent``
(read on a later pass) and then its ``BatchDone``.

A worker may post its own lease after a batch (``ipc.direct.worker_reoffers``: only while
the quiet flag of its ring says the scheduler has nothing to decide for it) and say so in
its ``BatchDone`` (``reoffered``), which then reaches the scheduler without a wake-up
(``batch_ended``: the lease counts as offered, as if this pass had posted it). A frontend can
take that lease before the scheduler reads the ``BatchDone``, so a ``DirectSent`` may name an
instance still running a batch here: it waits (``_after``) and starts when that batch ends.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Protocol

import msgspec

from triton_mp.common.close_reason import CloseReason
from triton_mp.common.errors import ErrorCode
from triton_mp.ipc.direct import handoff_eligible
from triton_mp.ipc.protocol.messages import (
    BatchDone,
    DirectSent,
    InferRequest,
    ReplyTo,
    WorkerDied,
)
from triton_mp.ipc.recordio.records import decode_request
from triton_mp.scheduler.instances import (
    Generation,
    Health,
    InFlight,
    Instance,
    InstanceState,
    InstanceTable,
)
from triton_mp.scheduler.lifecycle import died_running
from triton_mp.scheduler.outbox import Outbox
from triton_mp.scheduler.status import BatchLogs

log = logging.getLogger(__name__)

CLAIM_TIMEOUT_NS = 1_000_000_000
"""How long a lease a frontend took may go without its ``DirectSent`` before the scheduler
gives the instance back to its policy: the frontend sends it microseconds after the take, so
only a frontend that died in between leaves a claim this old (and it pushed no batch)."""


class Leases(Protocol):
    """The instances' lease semaphores (``ipc.direct.Lease``), by instance id."""

    def offer(self, instance_id: int) -> None:
        """Post the lease, unless it is posted (``ipc.direct.Lease.offer``: after a claim
        expired, the count of posts may miss one)."""
        ...

    def take(self, instance_id: int) -> bool:
        """``sem_trywait`` the lease: False when a frontend took it first."""
        ...


class Handoffs:
    """Which leases are offered, and which a frontend holds (see the module docstring).

    Args:
        instances: the scheduler's instance table.
        logs: the batch logs a direct batch is recorded in (``triton-mp stat``).
        out: where a direct request that cannot run is failed.
        rate_limited: ``--rate-limit execution_count`` is on (nothing is eligible).

    Attributes:
        leases: the lease semaphores; None (tests of other things, a scheduler without
            them) offers nothing.
    """

    def __init__(
        self, instances: InstanceTable, logs: BatchLogs, out: Outbox, rate_limited: bool
    ) -> None:
        self.leases: Leases | None = None
        self._instances = instances
        self._logs = logs
        self._out = out
        self._rate_limited = rate_limited
        self.offered: set[int] = set()
        """Instances whose lease is posted (as far as this scheduler knows): ``_posts`` > 0,
        unless a take back failed (``claimed``)."""
        self._posts: dict[int, int] = {}
        """Per instance: the posts of its lease this scheduler has read (its own offers, its
        worker's re-offers, ``BatchDone.reoffered``) less the takes it has read (frontends'
        ``DirectSent`` s, its own take backs). Below 0 while a re-offering ``BatchDone`` is
        unread after the ``DirectSent`` that took its post; a set would count a post twice
        once this scheduler took back a post whose ``BatchDone`` it had not read."""
        self.claimed: dict[int, int] = {}
        """Instance -> when a take back failed: a frontend holds the lease, its
        ``DirectSent`` not read yet."""
        self._early: dict[tuple[int, int], BatchDone] = {}
        """``BatchDone`` s of direct batches read before their ``DirectSent``."""
        self._eligible: dict[int, tuple[Generation, bool]] = {}
        """Per generation (``id``, with the generation itself: an id is reused once its
        object is gone, and a reloaded version's new generation may get the old one's):
        ``handoff_eligible`` of its spec."""
        self._after: dict[int, deque[DirectSent]] = {}
        """Per instance: the ``DirectSent`` s read while it ran a batch whose worker
        re-offered its lease (its ``BatchDone`` not read yet), in the order read."""
        self._deaths: dict[int, WorkerDied] = {}
        """Per instance: how its last worker died (a request handed to it before, read
        after, fails with the same words as the batch it ran)."""
        self.stale = True
        """Something may have changed which instances may be offered since the last
        ``after_dispatch`` (set by the core on instance and model changes, by an eligible
        instance's ``BatchDone``, and here); a pass without changes costs one test."""

    def touch(self, gen: Generation | None) -> None:
        """An instance of ``gen`` finished a batch: it may be offered again."""
        if gen is not None and self.eligible(gen):
            self.stale = True

    def eligible(self, gen: Generation) -> bool:
        """Whether ``gen``'s requests may be handed straight to its instances."""
        key = id(gen)
        known = self._eligible.get(key)
        if known is not None and known[0] is gen:
            return known[1]
        ok = handoff_eligible(gen.spec, self._rate_limited)
        self._eligible[key] = (gen, ok)
        return ok

    def next_deadline_ns(self) -> int | None:
        """When the oldest claim expires (``CLAIM_TIMEOUT_NS``), if one is held."""
        if not self.claimed:
            return None
        return min(self.claimed.values()) + CLAIM_TIMEOUT_NS

    # ------------------------------------------------------------ the passes
    def before_dispatch(self, gen: Generation, now_ns: int) -> None:
        """``gen`` has queued requests: take back its instances' offers before its policy
        forms batches."""
        if not self.offered:
            return
        for inst in self._instances.members(gen):
            if inst.instance_id in self.offered:
                self._take_back(inst, now_ns)
                self.stale = True

    def after_dispatch(
        self, active: dict[tuple[str, int], Generation], now_ns: int, stopping: bool
    ) -> None:
        """End of a pass: take back offers that no longer hold, give up expired claims,
        offer every instance that may now be handed a request."""
        leases = self.leases
        if leases is None or not (self.stale or self.claimed):
            return
        self.stale = False
        for iid in [i for i in self.offered if not self._may_offer(i, active, stopping)]:
            inst = self._instances.get(iid)
            if inst is None:
                self.offered.discard(iid)
                self._posts.pop(iid, None)
            else:
                self._take_back(inst, now_ns)
        if self.claimed:
            self._expire_claims(now_ns)
        if stopping:
            return
        for gen in active.values():
            if not self.eligible(gen) or gen.policy.queue_depth():
                continue
            for inst in self._instances.members(gen):
                iid = inst.instance_id
                if iid in self.offered or iid in self.claimed or not _idle(inst, gen):
                    continue
                leases.offer(iid)
                # NOTE: idle, so no re-offering BatchDone is unread: a count below 0 came
                # from a DirectSent read after its claim expired, and then the lease may be
                # up already (Lease.offer leaves it so): either way, one post is up now.
                self._posts[iid] = 1
                self.offered.add(iid)

    def _may_offer(
        self, iid: int, active: dict[tuple[str, int], Generation], stopping: bool
    ) -> bool:
        inst = self._instances.get(iid)
        if inst is None or stopping or inst.generation is None:
            return False
        gen = inst.generation
        return active.get(gen.key) is gen and not gen.policy.queue_depth() and _idle(inst, gen)

    def _take_back(self, inst: Instance, now_ns: int) -> None:
        """Take ``inst``'s offered lease back; when a frontend holds it, the instance is busy
        (its policy hands it nothing) until the frontend's batch is done."""
        iid = inst.instance_id
        self.offered.discard(iid)
        assert self.leases is not None
        if self.leases.take(iid):
            self._count(iid, -1)
            return
        self.claimed[iid] = now_ns
        inst.leased = True
        if inst.generation is not None:
            inst.generation.policy.instance_gone(iid)

    def _expire_claims(self, now_ns: int) -> None:
        for iid, since in list(self.claimed.items()):
            if now_ns - since < CLAIM_TIMEOUT_NS:
                continue
            del self.claimed[iid]
            self._posts.pop(iid, None)
            self.stale = True
            inst = self._instances.get(iid)
            if inst is not None:
                inst.leased = False
            log.warning("instance %d: a frontend took its lease and sent nothing; freed", iid)
            if inst is not None and inst.generation is not None and inst.health is Health.READY:
                inst.generation.policy.instance_idle(iid, now_ns)

    # ------------------------------------------------------------ messages
    def on_died(self, msg: WorkerDied, now_ns: int) -> None:
        """A worker died: remember how, for its direct requests read later; fail those
        waiting for its batch to end, and take back a lease it may have posted after a
        batch whose ``BatchDone`` is lost with it (a frontend that took it first hands a
        request that fails in ``on_direct``)."""
        iid = msg.instance_id
        self._deaths[iid] = msg
        waiting = self._after.pop(iid, ())
        inst = self._instances.get(iid)
        for sent in waiting:
            label = inst.label if inst is not None else str(iid)
            text = died_running(label, _request(sent).model, msg)
            self._out.fail(_request(sent), ErrorCode.UNAVAILABLE, text, now_ns)
        if self.leases is not None and iid not in self.offered:
            self.leases.take(iid)

    def on_direct(self, msg: DirectSent, now_ns: int) -> BatchDone | None:
        """A frontend handed ``msg.request`` to ``msg.instance_id``: the instance runs it as
        its batch from ``msg.dispatch_ns``. Returns the batch's ``BatchDone`` when it was
        read first (the caller applies it now). A request whose instance is gone or dead
        fails here (its worker never answers it)."""
        wire = msg.request
        req = decode_request(wire) if type(wire) is bytes else wire
        assert not isinstance(req, bytes)
        iid = msg.instance_id
        self.stale = True
        # NOTE: the count alone says whether a post is left: it is never above 1 here
        # (tests/unit/test_reoffer_interleavings.py), so the lease this batch took was it.
        self._count(iid, -1)
        self.claimed.pop(iid, None)
        inst = self._instances.get(iid)
        if inst is not None:
            inst.leased = False
        gen = None if inst is None else inst.generation
        if inst is None or gen is None or inst.health is not Health.READY:
            death = self._deaths.get(iid)
            if inst is not None and inst.health is Health.DEAD and death is not None:
                text = died_running(inst.label, req.model, death)
            else:
                text = _stopped(iid, req.model)
            self._out.fail(req, ErrorCode.UNAVAILABLE, text, now_ns)
            return None
        if inst.batch is not None:
            # NOTE: its worker re-offered the lease after that batch (ipc.direct
            # worker_reoffers), whose BatchDone this scheduler has not read yet.
            if req is not wire:
                msg = msgspec.structs.replace(msg, request=req)
            self._after.setdefault(iid, deque()).append(msg)
            return None
        return self._start(inst, gen, msg, req, now_ns)

    def _start(
        self, inst: Instance, gen: Generation, msg: DirectSent, req: InferRequest, now_ns: int
    ) -> BatchDone | None:
        """``inst`` runs ``req`` (``msg``'s request, decoded) as its batch: in flight, gone
        from its policy, in the batch log; returns its ``BatchDone`` when it was read first."""
        iid = inst.instance_id
        done = self._early.pop((iid, msg.batch_id), None)
        size = max(1, req.batch_size)
        inst.batch = InFlight(msg.batch_id, (req,), msg.dispatch_ns, size)
        gen.policy.instance_gone(iid)
        reason = CloseReason.SINGLE if gen.spec.batching.kind == "default" else CloseReason.IDLE
        self._logs.get(gen.key).record_sizes(size, 1, reason, inst, now_ns)
        return done

    def batch_ended(
        self, inst: Instance, reoffered: bool, now_ns: int, start_waiting: bool = True
    ) -> BatchDone | None:
        """``inst`` ended a batch (its ``BatchDone`` is applied): start the first direct
        batch waiting for it, returning that batch's ``BatchDone`` when it was read first
        (the caller applies it too). A post by its worker (``BatchDone.reoffered``) is
        counted first (``_posts``): a waiting batch's ``DirectSent`` already counted the take
        of it; else the lease counts as offered (``after_dispatch`` takes it back if the pass
        finds work or a change). ``start_waiting`` False: a staged batch runs next
        (``scheduler.staging``), so a waiting direct batch waits for that one to end."""
        iid = inst.instance_id
        if reoffered and self.leases is not None:
            self._count(iid, 1)
            self.stale = True
        waiting = self._after.get(iid)
        if waiting and start_waiting:
            sent = waiting.popleft()
            if not waiting:
                del self._after[iid]
            gen = inst.generation
            if gen is None or inst.health is not Health.READY:
                text = _stopped(iid, _request(sent).model)
                self._out.fail(_request(sent), ErrorCode.UNAVAILABLE, text, now_ns)
                return None
            return self._start(inst, gen, sent, _request(sent), now_ns)
        return None

    def _count(self, iid: int, change: int) -> None:
        """``_posts[iid]`` += ``change``; ``iid`` is offered while it is above 0."""
        n = self._posts.get(iid, 0) + change
        if n:
            self._posts[iid] = n
        else:
            del self._posts[iid]
        if n > 0:
            self.offered.add(iid)
        else:
            self.offered.discard(iid)

    def holds(self, instance_id: int) -> bool:
        """Whether a frontend holds or may take ``instance_id``'s next batch: its lease is
        offered or claimed, or a ``DirectSent`` read while it ran waits for it
        (``scheduler.staging`` stages nothing then)."""
        return (
            instance_id in self.offered or instance_id in self.claimed or instance_id in self._after
        )

    def waiting_instance(self, key: tuple[ReplyTo, int]) -> int | None:
        """The instance a direct request ``key`` (reply address, request id) was handed to
        while it waits here for the batch its worker re-offered after (``_after``): it runs
        there next, so a cancellation goes to it as to a running request's."""
        for iid, waiting in self._after.items():
            for sent in waiting:
                req = _request(sent)
                if req.request_id == key[1] and req.reply_to == key[0]:
                    return iid
        return None

    def early_done(self, msg: BatchDone) -> bool:
        """Keep the ``BatchDone`` of a direct batch whose ``DirectSent`` was not read yet
        (``on_direct`` returns it); False for any other batch."""
        if msg.batch_id >= 0:
            return False
        self.stale = True
        self._early[(msg.instance_id, msg.batch_id)] = msg
        return True


def _request(msg: DirectSent) -> InferRequest:
    """``msg``'s request, decoded by ``on_direct`` (every ``DirectSent`` kept here is)."""
    req = msg.request
    assert not isinstance(req, bytes)
    return req


def _stopped(instance_id: int, model: str) -> str:
    """Why a request handed to an instance that stopped (not died) failed."""
    return f"model instance {instance_id} of '{model}' stopped before it ran the request"


def _idle(inst: Instance, gen: Generation) -> bool:
    """Ready, active, serving ``gen`` and running nothing."""
    return (
        inst.generation is gen
        and inst.state is InstanceState.ACTIVE
        and inst.health is Health.READY
        and inst.batch is None
        and not inst.staged
        and not inst.open
    )
