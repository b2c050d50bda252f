"""The scheduler core: each inbound message to outbound messages, through a dispatch table.

``SchedulerCore.handle(msg, now_ns)`` looks the message's type up in ``handlers`` (one
handler per member of ``ipc.protocol.messages.ToScheduler``) and returns what follows from it as
``Outbound`` items (``scheduler.outbox``); ``dispatch(now_ns)`` forms and returns the
batches that are ready. No I/O and no clock: the process shell (``scheduler.main``) reads
the rings, passes the time and sends the items (``deliver``). Requests go to their version's
generation's batching policy (``scheduler.policies.policy``); instances and generations move through
``scheduler.lifecycle``; statistics are ``scheduler.stats``, queue views ``scheduler.status``.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable, Iterable, Sequence
from typing import Any, cast

import msgspec

from triton_mp.common.errors import ErrorCode
from triton_mp.ipc.memory.ring import RecordTooLarge
from triton_mp.ipc.protocol.log_messages import LogSettingsUpdate, apply_update
from triton_mp.ipc.protocol.messages import (
    BatchAssign,
    BatchDone,
    BatchDue,
    CacheOutcome,
    CancelRequest,
    DecoupledDone,
    DirectSent,
    InferRequest,
    InferResponse,
    InstancesAdded,
    InstancesRegrouped,
    InstancesRemoved,
    InstancesRetired,
    QueueQuery,
    ReadyQuery,
    RequestRefused,
    SequenceFlags,
    Shutdown,
    StatsQuery,
    ToScheduler,
    TraceContext,
    VersionsActivated,
    WorkerDied,
    WorkerReady,
)
from triton_mp.ipc.protocol.reports import ModelQueueStatus
from triton_mp.ipc.protocol.specs import ModelVersionSpec
from triton_mp.ipc.recordio.records import (
    Request,
    RequestRecord,
    as_request,
    decode_request,
)
from triton_mp.scheduler.assign_push import batch_forms
from triton_mp.scheduler.batch_end import BatchEnds
from triton_mp.scheduler.cancels import cancel_request
from triton_mp.scheduler.direct import Handoffs
from triton_mp.scheduler.done_wakeups import quiet_instances
from triton_mp.scheduler.ensembles import Ensembles
from triton_mp.scheduler.forming import NOT_FORMING, Forming, forming_state
from triton_mp.scheduler.instances import Generation, InFlight
from triton_mp.scheduler.lifecycle import STOPPING_MESSAGE, Lifecycle
from triton_mp.scheduler.limits.rate_gate import RateGate
from triton_mp.scheduler.limits.rate_limiter import RateLimiter
from triton_mp.scheduler.outbox import Outbound, Outbox, ToInstance
from triton_mp.scheduler.pass_words import PassWords, never_leased, walk_words
from triton_mp.scheduler.plain_requests import queue_records
from triton_mp.scheduler.policies.policy import QUEUE_FULL, TIMED_OUT, Batch, Queued
from triton_mp.scheduler.queries import answer_queue_query, answer_ready_query, answer_stats_query
from triton_mp.scheduler.registry import instance_limits
from triton_mp.scheduler.request_wakeups import quiet_request_mask
from triton_mp.scheduler.rules.admission import queue_start_ns, request_label, unknown_version
from triton_mp.scheduler.staging import Stager
from triton_mp.scheduler.stats import StatsBook
from triton_mp.scheduler.status import BatchLog, BatchLogs, queue_status

log = logging.getLogger(__name__)

QUEUE_FULL_MESSAGE = QUEUE_FULL.message
TIMEOUT_MESSAGE = TIMED_OUT.message
_CHANGES = frozenset(
    (WorkerReady, WorkerDied, Shutdown, InstancesAdded, VersionsActivated, InstancesRetired)
    + (InstancesRegrouped, InstancesRemoved)
)
"""Messages that may change which instances the direct handoff may offer."""
_NONE_QUIET: frozenset[int] = frozenset()
_ARRIVAL = operator.attrgetter("arrival_ns")
_BATCH_SIZE = operator.attrgetter("batch_size")
_START = int(SequenceFlags.START)
_END = int(SequenceFlags.END)


class SchedulerCore:
    """All scheduling state of the server; messages in, ``Outbound`` items out.

    Args:
        models: model versions active from the start (tests; the server starts with none
            and activates every version by ``VersionsActivated``).
        rate_limiter: ``--rate-limit execution_count``: formed batches wait for their
            instance's resources (``scheduler.limits.rate_limiter``); None starts them at once.

    Attributes:
        stats: per-version statistics (``StatsQuery``).
        lifecycle: the instances and generations.
        stopping: a ``Shutdown`` arrived: new requests fail, nothing is re-queued.
        defer_unknown: hold a request for an unknown version until ``retry_deferred``
            instead of failing it (the process loop sets it; see ``scheduler.main``).
        deferred: the requests held so.
        handlers: the dispatch table, message type -> handler.
    """

    def __init__(
        self, models: Iterable[ModelVersionSpec] = (), rate_limiter: RateLimiter | None = None
    ) -> None:
        self.stats = StatsBook(())
        self._logs = BatchLogs()
        self._out = Outbox(self.stats)
        self.lifecycle = Lifecycle(models, self._out, self.stats, self._logs)
        self.handoffs = Handoffs(
            self.lifecycle.instances, self._logs, self._out, bool(rate_limiter)
        )
        """The leases of idle instances a frontend may hand a request to (``scheduler.direct``)."""
        self._stager = Stager(self.lifecycle.instances, self.handoffs, bool(rate_limiter))
        self._next_batch_id = 1
        self.stopping = False
        self.defer_unknown = False
        self.deferred: list[Request] = []
        self.limiter = rate_limiter
        self._gate: RateGate[BatchAssign] = RateGate(rate_limiter)
        """Batches formed but held until the rate limiter grants their resources."""
        self._noticed: dict[int, int] = {}
        """Per instance: the due time its last ``BatchDue`` named (``due_notices``)."""
        life = self.lifecycle
        self.ensembles = Ensembles(
            self._out, self.stats, self._on_request, self._on_cancel, self._latest, life.active.get
        )
        """The ensemble requests running (``scheduler.ensembles``)."""
        self._ends = BatchEnds(
            life.instances, self.handoffs, self.stats, self.ensembles, self._out,
            self._release, self._offer, lambda: self.stopping, self._stager.promote,
        )  # fmt: skip
        """What a ``BatchDone`` moves on (``scheduler.batch_end``)."""
        self.handlers: dict[type, Callable[[Any, int], None]] = {
            InferRequest: self._on_request,
            RequestRecord: self._on_request,
            DirectSent: self._on_direct,
            InferResponse: self.ensembles.on_response,
            CancelRequest: self._on_cancel,
            CacheOutcome: self._on_cache_outcome,
            RequestRefused: lambda m, _: self.stats.record_failure(
                m.model, m.version, 0, m.request_ns, "BACKEND"
            ),
            StatsQuery: self._on_stats_query,
            QueueQuery: self._on_queue_query,
            WorkerReady: life.on_ready,
            ReadyQuery: self._on_ready_query,
            BatchDone: self._ends.on_done,
            DecoupledDone: self._on_decoupled_done,
            WorkerDied: self._on_died,
            Shutdown: self._on_shutdown,
            InstancesAdded: life.on_added,
            VersionsActivated: self._on_activated,
            InstancesRetired: life.on_retired,
            InstancesRegrouped: self._on_regrouped,
            InstancesRemoved: self._on_removed,
            LogSettingsUpdate: self._on_log_settings,
        }
        self._register_limits()

    # ----------------------------------------------------------------- messages
    def handle(self, msg: ToScheduler, now_ns: int) -> Sequence[Outbound]:
        """Apply one message at ``now_ns``; returns what to send, in order."""
        self.ensembles.now_ns = now_ns
        kind = type(msg)
        if kind in _CHANGES:
            self.handoffs.stale = True
        self.handlers[kind](msg, now_ns)
        return self._out.take()

    def handle_all(self, msgs: Iterable[ToScheduler | Request], now_ns: int) -> Sequence[Outbound]:
        """``handle`` each of ``msgs`` in order (one drain), at ``now_ns``; returns what to
        send, in order. Runs of plain generations' request records are queued in one call
        (``scheduler.plain_requests``), any other record goes straight to its handler: no
        table lookup and no ``take`` per request (no handler sends a batch, so nothing a
        later message does depends on what the earlier ones sent)."""
        self.ensembles.now_ns = now_ns
        handlers = self.handlers
        on_request = self._on_request
        msgs = msgs if type(msgs) is list else list(msgs)
        active = self.lifecycle.active
        plain = None if self.stopping else queue_records
        i, n = 0, len(msgs)
        while i < n:
            if plain is not None:
                i = plain(msgs, i, active, now_ns)
                if i == n:
                    break
            msg = msgs[i]
            i += 1
            if type(msg) is RequestRecord:
                on_request(msg, now_ns)
                continue
            kind = type(msg)
            if kind in _CHANGES:
                self.handoffs.stale = True
            handlers[kind](msg, now_ns)
            if self.stopping:
                plain = None
        return self._out.take()

    def _on_log_settings(self, msg: LogSettingsUpdate, now_ns: int) -> None:
        """A client changed the log settings at a frontend: log by them here and pass them on
        to every worker (``Lifecycle.on_ready`` sends them to workers that start later)."""
        apply_update(msg)
        self.lifecycle.log_settings = msg
        for inst in self.lifecycle.instances:
            self._out.to_instance(inst.instance_id, msg)

    def _on_request(self, req: Request, now_ns: int) -> None:
        key = (req.model, req.version)
        gen = self.lifecycle.active.get(key) or self.lifecycle.generation_for(key)
        if gen is None and self.defer_unknown and not self.stopping:
            self.deferred.append(req)
            return
        if self.stopping or gen is None:
            if self.stopping:
                code, text = ErrorCode.UNAVAILABLE, STOPPING_MESSAGE
            else:
                code, text = unknown_version(req.model, req.version, self.lifecycle.active)
            self._out.fail(req, code, text, now_ns)
            return
        if req.trace is not None:
            # NOTE: a traced request only: QUEUE_START travels on to the worker with it.
            req = msgspec.structs.replace(req, trace=TraceContext(req.trace.level, now_ns))
        if gen.spec.ensemble is not None:
            self.ensembles.start(as_request(req), gen, now_ns)
            return
        steps = gen.policy.iterative_steps
        if steps is not None and not req.sequence_id:
            # NOTE: core IterativeSequencer::SetupSequenceRequest: a request of its own
            # sequence (the next ID of the model's counter, from 1) that starts it.
            corrid = steps.new_sequence_id()
            req = msgspec.structs.replace(
                as_request(req), sequence_id=corrid, sequence_flags=req.sequence_flags | _START
            )
        self._offer(gen, req, now_ns)

    def _offer(self, gen: Generation, req: Request, now_ns: int, again: bool = False) -> None:
        """Queue ``req`` in its generation's policy (``again``: a rescheduled request, queued
        first in its iterative sequence); a refusal fails it."""
        # NOTE: most models batch anything with anything: a record's inputs stay undecoded.
        keyed = gen.enforced_inputs or gen.optional_inputs
        flags = req.sequence_flags
        size = req.batch_size
        # NOTE: positional (Queued's field order; a keyword call costs a third more here).
        item = Queued(
            (req.reply_to, req.request_id),
            size if size > 1 else 1,
            gen.batch_key(req.inputs) if keyed else (),
            now_ns if again else queue_start_ns(req.arrival_ns, now_ns),
            req,
            req.priority,
            req.timeout_us,
            0,
            0,
            False,
            req.sequence_id,
            bool(flags & _START),
            bool(flags & _END),
        )
        policy = gen.policy
        steps = policy.iterative_steps
        if again and steps is not None:
            rejection = steps.reschedule(item, now_ns)
        else:
            rejection = policy.offer(item, now_ns)
        if rejection is not None:
            message = (request_label(req) if rejection.prefixed else "") + rejection.message
            self._out.fail(req, rejection.code, message, now_ns, rejection.reason)

    def retry_deferred(self, now_ns: int) -> Sequence[Outbound]:
        """Offer the held requests again; those whose version is still unknown fail."""
        held, self.deferred = self.deferred, []
        defer, self.defer_unknown = self.defer_unknown, False
        try:
            for req in held:
                self._on_request(req, now_ns)
        finally:
            self.defer_unknown = defer
        return self._out.take()

    def _on_direct(self, msg: DirectSent, now_ns: int) -> None:
        done = self.handoffs.on_direct(msg, now_ns)
        if done is not None:
            self._ends.on_done(done, now_ns)

    def _on_cancel(self, msg: CancelRequest, now_ns: int) -> None:
        cancel_request(msg, now_ns, self.lifecycle, self.ensembles, self.handoffs, self._out)

    def _on_ready_query(self, msg: ReadyQuery, now_ns: int) -> None:
        answer_ready_query(msg, self.lifecycle, self._out)

    def _on_cache_outcome(self, msg: CacheOutcome, now_ns: int) -> None:
        self.stats.record_cache(msg.model, msg.version, msg)

    def _on_stats_query(self, msg: StatsQuery, now_ns: int) -> None:
        answer_stats_query(msg, self.stats, self._out)

    def _on_queue_query(self, msg: QueueQuery, now_ns: int) -> None:
        answer_queue_query(msg, self.queue_status(msg.model, now_ns), self._out)

    # ------------------------------------------------------------- rate limiter
    def _on_activated(self, msg: VersionsActivated, now_ns: int) -> None:
        self.lifecycle.on_activated(msg, now_ns)
        self._register_limits()

    def _on_regrouped(self, msg: InstancesRegrouped, now_ns: int) -> None:
        self.lifecycle.on_regrouped(msg, now_ns)
        self._register_limits()

    def _register_limits(self) -> None:
        """Tell the rate limiter every active instance's ``rate_limiter``."""
        if self.limiter is None:
            return
        self._gate.register(
            (iid, instance_limits(gen.spec.rate_limits, i))
            for gen in self.lifecycle.active.values()
            for i, iid in enumerate(gen.spec.instance_ids)
        )

    def _on_died(self, msg: WorkerDied, now_ns: int) -> None:
        self.handoffs.on_died(msg, now_ns)
        self._stager.on_died(msg.instance_id, now_ns, self._logs)
        self._gate.forget(msg.instance_id)
        self.lifecycle.on_died(msg, now_ns)
        if msg.segments:
            # NOTE: the supervisor unlinked them; our mapping alone would keep the pages.
            self._out.unmap(msg.segments)

    def _on_removed(self, msg: InstancesRemoved, now_ns: int) -> None:
        self._gate.remove(msg.instance_ids)
        self.lifecycle.on_removed(msg, now_ns)
        for prefix in msg.segments:
            self._out.unmap(prefix)

    def _release(self, instance_id: int, now_ns: int) -> None:
        """An instance's batch ended: its resources are free. They are granted at the end
        of the next dispatch pass, after the instance had its chance to stage its next
        batch (Triton stages a released instance that has work before it allocates)."""
        self._gate.release(instance_id)

    def _grant(self, now_ns: int) -> None:
        """Send every held batch whose resources the limiter grants now; its requests'
        queue time ends here (``dispatch_ns``)."""
        for iid, assign in self._gate.grants():
            inst = self.lifecycle.instances.get(iid)
            if assign is None or inst is None or inst.batch is None:
                self._gate.release(iid)
                continue
            inst.batch = inst.batch._replace(dispatch_ns=now_ns)
            inst.staged = False
            self._out.to_instance(iid, msgspec.structs.replace(assign, dispatch_ns=now_ns))

    def _on_decoupled_done(self, msg: DecoupledDone, now_ns: int) -> None:
        inst = self.lifecycle.instances.get(msg.instance_id)
        if inst is not None:
            inst.open.pop((msg.reply_to, msg.request_id), None)

    def _on_shutdown(self, msg: Shutdown, now_ns: int) -> None:
        self.stopping = True
        for gen in self.lifecycle.generations():
            for item in gen.policy.drain_queue():
                req = cast(Request, item.payload)
                self._out.fail(req, ErrorCode.UNAVAILABLE, STOPPING_MESSAGE, now_ns)

    # ----------------------------------------------------------------- batching
    def dispatch(self, now_ns: int) -> Sequence[Outbound]:
        """Form every batch that is ready now; returns them (and the failures of requests
        whose queue timeout expired), in order."""
        self.ensembles.now_ns = now_ns
        for gen in self.lifecycle.generations():
            for item, why in gen.policy.expire(now_ns):
                req = cast(Request, item.payload)
                bare = why is TIMED_OUT or not why.prefixed
                message = why.message if bare else request_label(req) + why.message
                self._out.fail(req, why.code, message, now_ns, why.reason)
            if self.handoffs.offered and gen.policy.queue_depth():
                self.handoffs.before_dispatch(gen, now_ns)
            # NOTE: then one staged behind a running batch (scheduler.staging).
            batches = gen.policy.pop_ready(now_ns) or self._stager.pop(gen, now_ns)
            while batches:
                batch_log = self._logs.get(gen.key)
                for batch in batches:
                    self._assign(gen, batch, batch_log, now_ns)
                batches = self._stager.pop(gen, now_ns)
        if self.limiter is not None:
            self._grant(now_ns)
        self.handoffs.after_dispatch(self.lifecycle.active, now_ns, self.stopping)
        if self.lifecycle.retiring or self.lifecycle.leaving:
            self.lifecycle.finish_retirements(now_ns)
        return self._out.take()

    def _assign(self, gen: Generation, batch: Batch, batch_log: BatchLog, now_ns: int) -> None:
        """Hand ``batch`` to its instance: the instance runs it from now on."""
        inst = self.lifecycle.instances.get(batch.instance_id)
        assert inst is not None, f"a policy formed a batch for unknown {batch.instance_id}"
        batch_log.record(batch, inst, now_ns)
        reqs, wires = batch_forms(batch.requests)
        batch_id = self._next_batch_id
        self._next_batch_id += 1
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "batch %d to %s: %d requests, batch size %d, closed by %s",
                batch_id,
                inst.label,
                len(reqs),
                batch.total_batch_size,
                batch.reason,
                extra={"model": gen.key[0]},
            )
        self._stager.place(inst, InFlight(batch_id, reqs, now_ns, batch.total_batch_size))
        if gen.spec.decoupled:
            for r in reqs:
                inst.open[(r.reply_to, r.request_id)] = r
        assign = BatchAssign(
            batch_id=batch_id,
            requests=wires,
            dispatch_ns=now_ns,
            rows=batch.rows,
            slots=batch.slots,
            released=cast(tuple[int | str, ...], batch.released),
        )
        if self.limiter is None:
            self._out.to_instance(batch.instance_id, assign)
            return
        # NOTE: the batch is the instance's from now on (a death fails it), but it starts
        # only once the rate limiter grants its resources.
        inst.staged = True
        self._gate.hold(batch.instance_id, assign)

    def due_notices(self, horizon_ns: int) -> Sequence[Outbound]:
        """``BatchDue`` for every idle instance whose batch a batching delay will send by
        ``horizon_ns`` (``Policy.due_batch``), once per due time: the process loop sends
        them when it wakes shortly before a deadline, so that the worker polls for the
        batch rather than sleeps (``workers.due``)."""
        for gen in self.lifecycle.generations():
            due = gen.policy.due_batch()
            if due is None or due[1] > horizon_ns or self._noticed.get(due[0]) == due[1]:
                continue
            self._noticed[due[0]] = due[1]
            self._out.to_instance(due[0], BatchDue(at_ns=due[1]))
        return self._out.take()

    def refuse(self, item: ToInstance, why: str, now_ns: int) -> Sequence[Outbound]:
        """A ``BatchAssign`` cannot reach its worker (its requests' parameters, together,
        exceed what one ring record holds): fail every request of it; the instance stays
        idle. Returns what to send."""
        assert isinstance(item.msg, BatchAssign)
        batch_id = item.msg.batch_id
        inst = self.lifecycle.instances.get(item.instance_id)
        staged = inst is not None and self._stager.refused(inst, batch_id)
        if inst is not None and inst.batch is not None and inst.batch.batch_id == batch_id:
            inst.batch = None
        requests = [decode_request(r) for r in item.msg.requests]
        for r in requests:
            if inst is not None:
                inst.open.pop((r.reply_to, r.request_id), None)
            self._out.fail(
                r,
                ErrorCode.RESOURCE_EXHAUSTED,
                f"a batch of {len(requests)} requests for model '{r.model}' is too "
                f"large to hand to its instance ({why}): the requests' parameters are too "
                "large to be batched together",
                now_ns,
            )
        log.warning("batch %d refused: %s", batch_id, why)
        self._release(item.instance_id, now_ns)
        if not self.stopping and not staged and inst is not None and inst.generation is not None:
            inst.generation.policy.instance_idle(item.instance_id, now_ns)
        return self._out.take()

    # ----------------------------------------------------------------- queries
    def _latest(self, model: str) -> int | None:
        """The newest active version of ``model`` (an ensemble step's ``model_version: -1``)."""
        versions = [v for m, v in self.lifecycle.active if m == model]
        return max(versions, default=None)

    def queue_status(self, model: str, now_ns: int) -> tuple[ModelQueueStatus, ...]:
        """``triton-mp stat``'s view of one model's versions (all models when empty)."""
        lc = self.lifecycle
        return queue_status(lc.active, lc.instances, self._logs, model, now_ns)

    def next_deadline_ns(self) -> int | None:
        """The nearest time a batch may become ready, or a queue timeout expire, without a
        message."""
        return self._deadline(self.lifecycle.generations())

    def _deadline(self, gens: list[Generation]) -> int | None:
        deadlines = [d for g in gens if (d := g.policy.next_deadline_ns()) is not None]
        return self._beyond_policies(min(deadlines, default=None))

    def _beyond_policies(self, deadline: int | None) -> int | None:
        """The nearest of ``deadline`` (the policies') and the deadlines outside them: a
        direct handoff's claim running out, a retirement that may end."""
        if not self.handoffs.claimed and not self.lifecycle.retiring and not self.lifecycle.leaving:
            return deadline
        deadlines = [] if deadline is None else [deadline]
        if self.handoffs.claimed:
            deadlines.append(self.handoffs.next_deadline_ns() or 0)
        if (self.lifecycle.retiring or self.lifecycle.leaving) and self.lifecycle.retirement_due():
            # NOTE: a retirement may end on the next pass without any message arriving.
            deadlines.append(0)
        return min(deadlines, default=None)

    def quiet_done(self, loud_bits: int = 0) -> frozenset[int]:
        """The instances whose ``BatchDone`` need not wake the scheduler now
        (``scheduler.done_wakeups``); ``loud_bits``: ``quiet_requests``'s mask, whose
        models' ``BatchDone`` always wakes."""
        if self.stopping or self.deferred or self.limiter is not None:
            return _NONE_QUIET
        return self._quiet_done(loud_bits)

    def _quiet_done(self, loud_bits: int) -> frozenset[int]:
        """``quiet_done`` past the conditions ``quiet_requests`` shares."""
        life = self.lifecycle
        if life.retiring or life.leaving or self.ensembles.in_flight():
            return _NONE_QUIET
        # NOTE: a leased version's BatchDone may be quiet too: its worker re-offers the
        # lease itself under that flag, or wakes the scheduler (ipc.direct.worker_reoffers).
        return quiet_instances(life.instances, never_leased, loud_bits)

    def quiet_requests(self) -> int:
        """The frontends' rings' quiet word: the model buckets whose requests need not wake
        the scheduler now (``scheduler.request_wakeups``; 0: every request wakes it)."""
        if self.stopping or self.deferred or self.limiter is not None:
            return 0
        life = self.lifecycle
        return quiet_request_mask(life.instances, life.generations(), self.handoffs.eligible)

    def forming(self, frontends: int) -> Forming:
        """The forming words for the frontends' rings (``frontends`` of them): the requests
        that may join a batch waiting for its delay without a wake-up
        (``scheduler.forming``)."""
        if self.stopping or self.deferred or self.limiter is not None:
            return NOT_FORMING
        return forming_state(self.lifecycle.generations(), self.handoffs.eligible, frontends)

    def pass_words(self, frontends: int) -> PassWords:
        """``next_deadline_ns``, ``quiet_requests``, ``quiet_done`` (of that mask) and
        ``forming`` (``frontends`` rings) at once, the same answers for one walk's cost
        (``scheduler.pass_words``)."""
        life = self.lifecycle
        gens = life.generations()
        if self.stopping or self.deferred or self.limiter is not None:
            return PassWords(self._deadline(gens), 0, _NONE_QUIET, NOT_FORMING)
        done_may_be_quiet = not (life.retiring or self.ensembles.in_flight())
        deadline, requests, quiet, forming = walk_words(
            life.instances, gens, self.handoffs.eligible, frontends, done_may_be_quiet
        )
        # NOTE: tuple.__new__: a NamedTuple's own constructor costs more, every pass.
        return tuple.__new__(PassWords, (self._beyond_policies(deadline), requests, quiet, forming))

    def idle(self) -> bool:
        """Nothing queued and nothing running."""
        lc = self.lifecycle
        return (
            not any(inst.batch is not None for inst in lc.instances)
            and not self.ensembles.in_flight()
            and not lc.retiring
            and all(g.policy.queue_depth() == 0 for g in lc.active.values())
        )


def deliver(
    core: SchedulerCore, items: Sequence[Outbound], send: Callable[[Outbound], None], now_ns: int
) -> None:
    """Send ``items`` in order with ``send``; a batch whose descriptor is too large for its
    worker's ring (``RecordTooLarge``) fails alone (``SchedulerCore.refuse``), and what
    that answers is sent before the items after it."""
    for item in items:
        try:
            send(item)
        except RecordTooLarge as e:
            if not isinstance(item, ToInstance) or not isinstance(item.msg, BatchAssign):
                raise
            deliver(core, core.refuse(item, str(e), now_ns), send, now_ns)
