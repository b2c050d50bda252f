"""The scheduler process: turns request descriptors into batches for idle instances.

``run_scheduler`` is the process entry; ``SchedulerCore`` is the logic, constructible
in-process for tests. This is the only scheduler module that imports ``triton_mp.ipc``; the
batching rules live in ``scheduler.dynamic`` and see no messages, no clock and no I/O.

The loop: block on the inbox semaphore until a message arrives or the nearest batching
deadline passes, drain every ring, apply every message, form batches, send them.
NOTE: the loop is synchronous on purpose: its only blocking point is one semaphore wait
with a timeout, which asyncio cannot await without a thread hop per wake-up.
"""

from __future__ import annotations

import collections
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import cast

from triton_mp.common.errors import ErrorCode
from triton_mp.common.log import configure_logging
from triton_mp.common.platform import set_timer_slack_ns
from triton_mp.ipc import Inbox, Sender, encode
from triton_mp.ipc.codec import Decoder
from triton_mp.ipc.handshake import report_ready
from triton_mp.ipc.messages import (
    BatchAssign,
    BatchDone,
    BatchRecord,
    CancelRequest,
    DecoupledDone,
    ErrorInfo,
    InferRequest,
    InstancesAdded,
    InstancesRemoved,
    InstancesRetired,
    InstanceStatus,
    InstanceWiring,
    LevelStatus,
    ModelAvailability,
    ModelQueueStatus,
    QueueQuery,
    QueueReply,
    ReplyTo,
    Requester,
    RequestFailed,
    Shutdown,
    StatsQuery,
    StatsReply,
    ToScheduler,
    VersionsActivated,
    WorkerDied,
    WorkerReady,
)
from triton_mp.ipc.ring import RecordTooLarge
from triton_mp.ipc.specs import ModelVersionSpec, QueuePolicySpec, SchedulerSpec
from triton_mp.scheduler.clock import SCHEDULER_TIMER_SLACK_NS, Clock, MonotonicClock
from triton_mp.scheduler.dynamic import (
    QUEUE_FULL,
    TIMED_OUT,
    DefaultScheduler,
    DynamicBatcher,
    ModelScheduler,
    PriorityQueue,
    Queued,
    QueuePolicy,
)
from triton_mp.scheduler.sequence import SequenceBatcher
from triton_mp.scheduler.stats import StatsBook

log = logging.getLogger(__name__)

STOPPING_MESSAGE = (
    "Server is stopping, scheduler for model has stopped accepting new inference requests"
)
QUEUE_FULL_MESSAGE = QUEUE_FULL.message
TIMEOUT_MESSAGE = TIMED_OUT.message
RECENT_BATCHES = 32
"""Formed batches kept per model for ``triton-mp stat``."""


@dataclass(slots=True)
class _InFlight:
    instance_id: int
    requests: tuple[InferRequest, ...]
    dispatch_ns: int
    total_batch_size: int


def _policy(p: QueuePolicySpec) -> QueuePolicy:
    return QueuePolicy(
        p.timeout_action, p.default_timeout_us, p.allow_timeout_override, p.max_queue_size
    )


def make_model_scheduler(spec: ModelVersionSpec) -> ModelScheduler:
    """The per-model scheduler for a model's scheduling choice (no instance idle yet).

    ``dynamic_batching`` gives the dynamic batcher with the model's priority levels and
    queue policies (also with max_batch_size 0: requests then run alone); otherwise
    Triton's default scheduler (FIFO, priorities ignored).
    """
    b = spec.batching
    if b.kind == "sequence" and spec.sequence is not None:
        seq = spec.sequence
        corrid = next((c for c in seq.controls if c.kind == "CORRID"), None)
        kind: type | None = None
        if corrid is not None:
            kind = str if corrid.datatype == "BYTES" else int
        return SequenceBatcher(
            spec.model,
            seq.strategy,
            max(0, spec.max_batch_size),
            spec.instance_ids,
            max_sequence_idle_us=seq.max_sequence_idle_us,
            max_queue_delay_us=seq.max_queue_delay_us,
            minimum_slot_utilization=seq.minimum_slot_utilization,
            max_candidate_sequences=seq.max_candidate_sequences,
            preferred_batch_sizes=seq.preferred_batch_sizes,
            corrid_kind=kind,
        )
    if b.kind != "dynamic":
        return DefaultScheduler()
    queue = PriorityQueue(
        b.priority_levels,
        b.default_priority_level,
        _policy(b.default_queue_policy),
        {level: _policy(p) for level, p in b.priority_queue_policy.items()},
    )
    return DynamicBatcher(
        max(0, spec.max_batch_size), b.preferred_batch_sizes, b.max_queue_delay_us, queue=queue
    )


def request_label(req: InferRequest) -> str:
    """Triton's ``[request id: <id>] `` prefix of request errors."""
    return f"[request id: {req.client_id or '<id_unknown>'}] "


@dataclass(slots=True)
class _Retiring:
    """A model version's scheduler that takes no new requests (its version was unloaded,
    or replaced by a reload): it finishes its queue on its instances, then stops them."""

    key: tuple[str, int]
    sched: ModelScheduler
    instance_ids: set[int]
    armed: bool = False
    """Set after the first dispatch pass that saw the retirement; a request a frontend sent
    before it dropped the version is drained by the next pass, so only then may it end."""


@dataclass(slots=True)
class _BatchLog:
    """What ``triton-mp stat`` shows of the batches one model version formed."""

    sizes: collections.Counter[int] = field(default_factory=collections.Counter)
    reasons: collections.Counter[str] = field(default_factory=collections.Counter)
    recent: collections.deque[tuple[int, int, int, str, int]] = field(
        default_factory=lambda: collections.deque(maxlen=RECENT_BATCHES)
    )
    """(formed at ns, total batch size, requests, reason, instance id), oldest first."""


class SchedulerCore:
    """All scheduling state of the server; messages in, (destination, message) out.

    Args:
        models: every loaded model version.
        send_worker: ``send_worker(instance_id, msg)`` pushes to that worker.
        send_frontend: ``send_frontend(frontend_id, msg)`` pushes to that frontend.
        frontend_ids: every frontend (``ModelAvailability`` goes to each).
        send_bls: ``send_bls(instance_id, msg)`` pushes to that python worker's BLS client.
    """

    def __init__(
        self,
        models: tuple[ModelVersionSpec, ...],
        send_worker: Callable[[int, object], None],
        send_frontend: Callable[[int, object], None],
        frontend_ids: tuple[int, ...] = (),
        attach_instance: Callable[[InstanceWiring], None] | None = None,
        detach_instance: Callable[[int], None] | None = None,
        send_bls: Callable[[int, object], None] | None = None,
    ) -> None:
        self._frontend_ids = frontend_ids
        self._live: dict[tuple[str, int], set[int]] = {}
        self._specs = {(m.model, m.version): m for m in models}
        self._models: dict[tuple[str, int], ModelScheduler] = {
            k: make_model_scheduler(s) for k, s in self._specs.items()
        }
        self._enforced = {k: s.enforced_inputs for k, s in self._specs.items()}
        self._instance_model: dict[int, tuple[str, int]] = {
            i: (m.model, m.version) for m in models for i in m.instance_ids
        }
        self._instance_sched: dict[int, ModelScheduler] = {
            i: self._models[(m.model, m.version)] for m in models for i in m.instance_ids
        }
        self._staged: set[int] = set()
        """Instances added but whose version is not activated yet."""
        self._staged_live: set[int] = set()
        self._retiring: list[_Retiring] = []
        self._inflight: dict[int, _InFlight] = {}
        self._batch_log = {k: _BatchLog() for k in self._specs}
        self._executions: collections.Counter[int] = collections.Counter()
        self._restarts: collections.Counter[int] = collections.Counter()
        self._died: set[int] = set()
        self._instance_names = {
            i: name
            for m in models
            for i, name in zip(m.instance_ids, m.instance_names, strict=False)
        }
        self._busy: dict[int, int] = {}  # instance_id -> batch_id
        self._decoupled = {k for k, s in self._specs.items() if s.decoupled}
        self._open: dict[int, dict[tuple[ReplyTo, int], InferRequest]] = {}
        """instance id -> requests of a decoupled model dispatched there whose final
        response the worker has not reported yet (``DecoupledDone``)."""
        self._next_batch_id = 1
        self.stats = StatsBook(self._specs)
        self._send_worker = send_worker
        self._send_frontend = send_frontend
        self._send_bls = send_bls or (lambda i, m: None)
        self._attach = attach_instance
        self._detach = detach_instance
        self.stopping = False
        self.defer_unknown = False
        """Hold a request for an unknown version until ``retry_deferred`` instead of failing
        it (the process loop sets it; see ``run_scheduler``)."""
        self.deferred: list[InferRequest] = []

    # ----------------------------------------------------------------- messages
    def handle(self, msg: ToScheduler, now_ns: int) -> None:
        """Apply one message."""
        if isinstance(msg, InferRequest):
            self._on_request(msg, now_ns)
        elif isinstance(msg, BatchDone):
            self._on_batch_done(msg, now_ns)
        elif isinstance(msg, DecoupledDone):
            self._open.get(msg.instance_id, {}).pop((msg.reply_to, msg.request_id), None)
        elif isinstance(msg, CancelRequest):
            self._on_cancel(msg, now_ns)
        elif isinstance(msg, WorkerReady):
            key = self._instance_model.get(msg.instance_id)
            if msg.instance_id in self._staged:
                self._staged_live.add(msg.instance_id)
            elif key is not None:
                log.info(
                    "instance %s ready (pid %d)",
                    self._instance_names.get(msg.instance_id, msg.instance_id),
                    msg.pid,
                    extra={
                        "model": key[0],
                        "instance": self._instance_names.get(msg.instance_id, ""),
                    },
                )
                if msg.instance_id in self._died:
                    self._restarts[msg.instance_id] += 1
                    self._died.discard(msg.instance_id)
                self._instance_sched[msg.instance_id].instance_idle(msg.instance_id, now_ns)
                self._set_live(key, msg.instance_id, True)
        elif isinstance(msg, WorkerDied):
            self._on_worker_died(msg, now_ns)
        elif isinstance(msg, StatsQuery):
            self._send_frontend(
                msg.frontend_id,
                StatsReply(
                    query_id=msg.query_id, stats=self.stats.snapshot(msg.model, msg.version)
                ),
            )
        elif isinstance(msg, QueueQuery):
            self._send_frontend(
                msg.frontend_id,
                QueueReply(query_id=msg.query_id, models=self.queue_status(msg.model, now_ns)),
            )
        elif isinstance(msg, Shutdown):
            self._on_shutdown(now_ns)
        elif isinstance(msg, InstancesAdded):
            self._on_instances_added(msg)
        elif isinstance(msg, VersionsActivated):
            self._on_versions_activated(msg, now_ns)
        elif isinstance(msg, InstancesRetired):
            self._on_instances_retired(msg)
        elif isinstance(msg, InstancesRemoved):
            self._on_instances_removed(msg)

    def _fail(
        self,
        req: InferRequest,
        code: ErrorCode,
        message: str,
        now_ns: int,
        reason: str = "OTHER",
    ) -> None:
        self.stats.record_failure(req.model, req.version, req.arrival_ns, now_ns, reason)
        self._reply(
            req.reply_to,
            RequestFailed(
                request_id=req.request_id,
                error=ErrorInfo(code=code, message=message, origin="scheduler"),
            ),
        )

    def _reply(self, to: ReplyTo, msg: object) -> None:
        """Answer a request at its reply address (a frontend or a BLS client)."""
        if to.kind is Requester.FRONTEND:
            self._send_frontend(to.id, msg)
        else:
            self._send_bls(to.id, msg)

    def _on_request(self, req: InferRequest, now_ns: int) -> None:
        key = (req.model, req.version)
        sched = self._models.get(key)
        if sched is None:
            # NOTE: a request a frontend sent just before it dropped the version.
            sched = next((r.sched for r in reversed(self._retiring) if r.key == key), None)
        if sched is None and self.defer_unknown and not self.stopping:
            self.deferred.append(req)
            return
        if self.stopping or sched is None:
            text = (
                STOPPING_MESSAGE
                if self.stopping
                else f"Request for unknown model: '{req.model}' version {req.version} is not found"
            )
            code = ErrorCode.UNAVAILABLE if self.stopping else ErrorCode.NOT_FOUND
            self._fail(req, code, text, now_ns)
            return
        enforced = self._enforced.get(key, ())
        shape_key = tuple(t.shape[1:] for t in req.inputs if t.name in enforced) if enforced else ()
        item = Queued(
            (req.reply_to, req.request_id),
            max(1, req.batch_size),
            shape_key,
            now_ns,
            req,
            priority=req.priority,
            timeout_us=req.timeout_us,
            corrid=req.sequence_id,
            flags=req.sequence_flags,
        )
        rejection = sched.offer(item, now_ns)
        if rejection is not None:
            self._fail(
                req,
                rejection.code,
                request_label(req) + rejection.message,
                now_ns,
                rejection.reason,
            )

    def retry_deferred(self, now_ns: int) -> None:
        """Offer the held requests again; those whose version is still unknown fail."""
        held, self.deferred = self.deferred, []
        defer, self.defer_unknown = self.defer_unknown, False
        try:
            for req in held:
                self._on_request(req, now_ns)
        finally:
            self.defer_unknown = defer

    def _on_cancel(self, msg: CancelRequest, now_ns: int) -> None:
        """Drop a request whose client went away, if it has not been dispatched yet."""
        key = (msg.model, msg.version)
        scheds = [self._models[key]] if key in self._models else []
        scheds += [r.sched for r in self._retiring if r.key == key]
        item = None
        for sched in scheds:
            item = sched.cancel((msg.reply_to, msg.request_id))
            if item is not None:
                break
        if item is None and key in self._decoupled:
            # NOTE: a decoupled request already running: its model may stop early when it
            # sees ``is_cancelled()``; the worker answers it as the model decides.
            rkey = (msg.reply_to, msg.request_id)
            for instance_id, requests in self._open.items():
                if rkey in requests:
                    self._send_worker(instance_id, msg)
                    break
            return
        if item is not None:
            # NOTE: the answer lets the frontend free the request's input block.
            self._fail(
                cast(InferRequest, item.payload),
                ErrorCode.CANCELLED,
                "Request was cancelled before it was scheduled",
                now_ns,
                "CANCELED",
            )

    def _refuse_batch(self, batch_id: int, instance_id: int, why: str, now_ns: int) -> None:
        """Fail every request of a batch whose descriptor cannot reach the worker (their
        parameters, together, exceed what one ring record holds); the instance stays idle."""
        flight = self._inflight.pop(batch_id)
        self._busy.pop(instance_id, None)
        opened = self._open.get(instance_id, {})
        for r in flight.requests:
            opened.pop((r.reply_to, r.request_id), None)
            self._fail(
                r,
                ErrorCode.RESOURCE_EXHAUSTED,
                f"a batch of {len(flight.requests)} requests for model '{r.model}' is too "
                f"large to hand to its instance ({why}): the requests' parameters are too "
                "large to be batched together",
                now_ns,
            )
        log.warning("batch %d refused: %s", batch_id, why)
        sched = self._instance_sched.get(instance_id)
        if not self.stopping and sched is not None:
            sched.instance_idle(instance_id, now_ns)

    def _on_batch_done(self, msg: BatchDone, now_ns: int) -> None:
        flight = self._inflight.pop(msg.batch_id, None)
        self._busy.pop(msg.instance_id, None)
        key = self._instance_model.get(msg.instance_id)
        if flight is None or key is None:
            return
        failed = set(msg.failed)
        ok = [
            (r.arrival_ns, flight.dispatch_ns, r.batch_size)
            for i, r in enumerate(flight.requests)
            if i not in failed
        ]
        self._executions[msg.instance_id] += 1
        self.stats.record_execution(
            key[0],
            key[1],
            requests=ok,
            total_batch_size=flight.total_batch_size,
            compute_input_ns=msg.compute_input_ns,
            compute_infer_ns=msg.compute_infer_ns,
            compute_output_ns=msg.compute_output_ns,
            end_ns=msg.end_ns,
        )
        for i in failed:
            r = flight.requests[i]
            self.stats.record_failure(r.model, r.version, r.arrival_ns, msg.end_ns, "BACKEND")
        sched = self._instance_sched.get(msg.instance_id)
        if not self.stopping and sched is not None:
            sched.instance_idle(msg.instance_id, now_ns)

    def _set_live(self, key: tuple[str, int], instance_id: int, alive: bool) -> None:
        """Track live instances; tell every frontend when a version gains its first live
        instance or loses its last one (ModelReady and ServerReady follow)."""
        live = self._live.setdefault(key, set())
        before = bool(live)
        if alive:
            live.add(instance_id)
        else:
            live.discard(instance_id)
        if bool(live) != before:
            msg = ModelAvailability(model=key[0], version=key[1], ready=bool(live))
            for fid in self._frontend_ids:
                self._send_frontend(fid, msg)

    def _on_worker_died(self, msg: WorkerDied, now_ns: int) -> None:
        key = self._instance_model.get(msg.instance_id)
        if key is None:
            return
        if msg.instance_id in self._staged:
            self._staged_live.discard(msg.instance_id)
            return
        sched = self._instance_sched.get(msg.instance_id)
        if sched is not None:
            sched.instance_gone(msg.instance_id)
        self._set_live(key, msg.instance_id, False)
        self._died.add(msg.instance_id)
        batch_id = self._busy.pop(msg.instance_id, None)
        flight = self._inflight.pop(batch_id, None) if batch_id is not None else None
        name = self._instance_names.get(msg.instance_id, str(msg.instance_id))
        open_requests = self._open.pop(msg.instance_id, {})
        if flight is not None:
            for r in flight.requests:
                open_requests.pop((r.reply_to, r.request_id), None)
        log.warning(
            "instance %s of model '%s' died with exit code %d; failing %d in-flight requests",
            name,
            key[0],
            msg.exitcode,
            len(flight.requests) if flight else 0,
            extra={"model": key[0], "instance": name},
        )
        if flight is not None:
            how = (
                f"{msg.reason} (exit code {msg.exitcode})"
                if msg.reason
                else (f"died with exit code {msg.exitcode}")
            )
            text = f"model instance '{name}' of '{key[0]}' {how} while running the request"
            for r in flight.requests:
                self._fail(r, ErrorCode.UNAVAILABLE, text, now_ns)
        if open_requests:
            # NOTE: decoupled requests whose execute had returned: counted already, so only
            # their streams are ended here.
            text = (
                f"model instance '{name}' of '{key[0]}' died with exit code {msg.exitcode} "
                "before the final response of the request"
            )
            for r in open_requests.values():
                self._reply(
                    r.reply_to,
                    RequestFailed(
                        request_id=r.request_id,
                        error=ErrorInfo(ErrorCode.UNAVAILABLE, text, "scheduler"),
                    ),
                )

    # ------------------------------------------------------------ model changes
    def _on_instances_added(self, msg: InstancesAdded) -> None:
        for w in msg.instances:
            if self._attach is not None:
                self._attach(w)
            self._instance_model[w.instance_id] = (w.model, w.version)
            self._instance_names[w.instance_id] = w.name
            self._staged.add(w.instance_id)

    def _on_versions_activated(self, msg: VersionsActivated, now_ns: int) -> None:
        """New versions (or new generations of loaded ones) take the version's requests
        from now on; a generation they replace finishes its queue, then stops."""
        decoder: Decoder[ModelVersionSpec] = Decoder(ModelVersionSpec)
        for raw in msg.specs:
            spec = decoder.decode(raw)
            key = (spec.model, spec.version)
            sched = make_model_scheduler(spec)
            old = self._models.get(key)
            if old is not None:
                old_ids = {i for i, s in self._instance_sched.items() if s is old}
                self._retiring.append(_Retiring(key, old, old_ids))
            self._models[key] = sched
            self._specs[key] = spec
            self._enforced[key] = spec.enforced_inputs
            if spec.decoupled:
                self._decoupled.add(key)
            else:
                self._decoupled.discard(key)
            self._batch_log.setdefault(key, _BatchLog())
            self.stats.add(*key)
            for i, name in zip(spec.instance_ids, spec.instance_names, strict=False):
                self._instance_names[i] = name
            for i in spec.instance_ids:
                self._staged.discard(i)
                self._instance_sched[i] = sched
                self._instance_model[i] = key
                if i in self._staged_live:
                    self._staged_live.discard(i)
                    sched.instance_idle(i, now_ns)
                    self._set_live(key, i, True)
            log.info(
                "model '%s' version %d active on %d instances",
                key[0],
                key[1],
                len(spec.instance_ids),
                extra={"model": key[0]},
            )

    def _on_instances_retired(self, msg: InstancesRetired) -> None:
        by_sched: dict[int, _Retiring] = {}
        for i in msg.instance_ids:
            sched = self._instance_sched.get(i)
            key = self._instance_model.get(i)
            if sched is None or key is None:
                continue
            entry = next((r for r in self._retiring if r.sched is sched), None)
            if entry is None:
                entry = by_sched.get(id(sched))
            if entry is None:
                entry = _Retiring(key, sched, set())
                by_sched[id(sched)] = entry
                self._retiring.append(entry)
                if self._models.get(key) is sched:
                    del self._models[key]
            entry.instance_ids.add(i)

    def _on_instances_removed(self, msg: InstancesRemoved) -> None:
        for i in msg.instance_ids:
            key = self._instance_model.pop(i, None)
            sched = self._instance_sched.pop(i, None)
            if sched is not None:
                sched.instance_gone(i)
            self._staged.discard(i)
            self._staged_live.discard(i)
            if key is not None:
                self._live.get(key, set()).discard(i)
            batch_id = self._busy.pop(i, None)
            if batch_id is not None:
                self._inflight.pop(batch_id, None)
            self._open.pop(i, None)
            self._died.discard(i)
            if self._detach is not None:
                self._detach(i)

    def _finish_retirements(self, now_ns: int) -> None:
        """Stop the instances of retired versions whose queues ran dry (see ``_Retiring``)."""
        keep = []
        for r in self._retiring:
            busy = any(i in self._busy or self._open.get(i) for i in r.instance_ids)
            live = [i for i in r.instance_ids if i not in self._died]
            if not live and r.sched.queue_depth():
                for item in r.sched.drain_queue():
                    req = cast(InferRequest, item.payload)
                    self._fail(req, ErrorCode.UNAVAILABLE, STOPPING_MESSAGE, now_ns)
            if not r.armed or busy or r.sched.queue_depth():
                r.armed = True
                keep.append(r)
                continue
            for i in r.instance_ids:
                r.sched.instance_gone(i)
                self._live.get(r.key, set()).discard(i)
                if i not in self._died:
                    self._send_worker(i, Shutdown())
            if r.key not in self._models:
                self._decoupled.discard(r.key)
                self._specs.pop(r.key, None)
                self._enforced.pop(r.key, None)
                self._batch_log.pop(r.key, None)
                self.stats.remove(*r.key)
                self._live.pop(r.key, None)
            log.info(
                "model '%s' version %d: %d retired instances stopping",
                r.key[0],
                r.key[1],
                len(live),
                extra={"model": r.key[0]},
            )
        self._retiring = keep

    def _on_shutdown(self, now_ns: int) -> None:
        self.stopping = True
        for sched in [*self._models.values(), *(r.sched for r in self._retiring)]:
            for item in sched.drain_queue():
                req = item.payload
                assert isinstance(req, InferRequest)
                self._fail(req, ErrorCode.UNAVAILABLE, STOPPING_MESSAGE, now_ns)

    # ----------------------------------------------------------------- batching
    def dispatch(self, now_ns: int) -> int:
        """Form and send every batch that is ready now; returns how many."""
        sent = 0
        every = [*self._models.items(), *((r.key, r.sched) for r in self._retiring)]
        for key, sched in every:
            for item, why in sched.expire(now_ns):
                req = cast(InferRequest, item.payload)
                message = why.message if why is TIMED_OUT else request_label(req) + why.message
                self._fail(req, why.code, message, now_ns, why.reason)
            batch_log = self._batch_log.get(key)
            for batch in sched.pop_ready(now_ns):
                if batch_log is None:
                    # NOTE: not setdefault(): that would build a _BatchLog per model per pass.
                    batch_log = self._batch_log[key] = _BatchLog()
                batch_log.sizes[batch.total_batch_size] += 1
                batch_log.reasons[batch.reason] += 1
                batch_log.recent.append(
                    (
                        now_ns,
                        batch.total_batch_size,
                        len(batch.requests),
                        batch.reason,
                        batch.instance_id,
                    )
                )
                reqs = tuple(cast(InferRequest, q.payload) for q in batch.requests)
                if log.isEnabledFor(logging.DEBUG):
                    log.debug(
                        "batch %d to %s: %d requests, batch size %d, closed by %s",
                        self._next_batch_id,
                        self._instance_names.get(batch.instance_id, batch.instance_id),
                        len(reqs),
                        batch.total_batch_size,
                        batch.reason,
                        extra={"model": key[0]},
                    )
                batch_id = self._next_batch_id
                self._next_batch_id += 1
                self._inflight[batch_id] = _InFlight(
                    batch.instance_id, reqs, now_ns, batch.total_batch_size
                )
                self._busy[batch.instance_id] = batch_id
                if key in self._decoupled:
                    opened = self._open.setdefault(batch.instance_id, {})
                    for r in reqs:
                        opened[(r.reply_to, r.request_id)] = r
                try:
                    self._send_worker(
                        batch.instance_id,
                        BatchAssign(
                            batch_id=batch_id,
                            requests=reqs,
                            dispatch_ns=now_ns,
                            rows=batch.rows,
                            slots=batch.slots,
                            released=cast(tuple[int | str, ...], batch.released),
                        ),
                    )
                except RecordTooLarge as e:
                    self._refuse_batch(batch_id, batch.instance_id, str(e), now_ns)
                    continue
                sent += 1
        if self._retiring:
            self._finish_retirements(now_ns)
        return sent

    def queue_status(self, model: str, now_ns: int) -> tuple[ModelQueueStatus, ...]:
        """``triton-mp stat``'s view of one model's versions (all models when empty)."""
        out = []
        for key, sched in sorted(self._models.items()):
            if model and key[0] != model:
                continue
            spec = self._specs[key]
            levels = tuple(
                LevelStatus(
                    level=lv.level,
                    depth=lv.depth,
                    delayed=lv.delayed,
                    oldest_age_us=(
                        0
                        if lv.oldest_enqueue_ns is None
                        else (now_ns - lv.oldest_enqueue_ns) // 1000
                    ),
                    rejected=lv.rejected,
                    timed_out=lv.timed_out,
                    delayed_total=lv.delayed_total,
                )
                for lv in sched.levels()
            )
            instances = []
            live = self._live.get(key, set())
            for i in spec.instance_ids:
                batch_id = self._busy.get(i)
                flight = self._inflight.get(batch_id) if batch_id is not None else None
                instances.append(
                    InstanceStatus(
                        instance_id=i,
                        name=self._instance_names.get(i, str(i)),
                        live=i in live,
                        batches_in_flight=int(flight is not None),
                        requests_in_flight=len(flight.requests) if flight else 0,
                        batch_size_in_flight=flight.total_batch_size if flight else 0,
                        executions=self._executions[i],
                        restarts=self._restarts[i],
                    )
                )
            blog = self._batch_log[key]
            out.append(
                ModelQueueStatus(
                    model=key[0],
                    version=key[1],
                    scheduler=spec.batching.kind,
                    max_batch_size=spec.max_batch_size,
                    preferred_batch_sizes=spec.batching.preferred_batch_sizes,
                    max_queue_delay_us=spec.batching.max_queue_delay_us,
                    levels=levels,
                    instances=tuple(instances),
                    batch_sizes=dict(sorted(blog.sizes.items())),
                    close_reasons=dict(sorted(blog.reasons.items())),
                    recent_batches=tuple(
                        BatchRecord(
                            age_us=max(0, now_ns - at) // 1000,
                            batch_size=size,
                            requests=n,
                            reason=reason,
                            instance=self._instance_names.get(inst, str(inst)),
                        )
                        for at, size, n, reason, inst in reversed(blog.recent)
                    ),
                )
            )
        return tuple(out)

    def next_deadline_ns(self) -> int | None:
        """The nearest time a batch may become ready, or a queue timeout expire, without a
        message."""
        scheds = [*self._models.values(), *(r.sched for r in self._retiring)]
        deadlines = [d for s in scheds if (d := s.next_deadline_ns()) is not None]
        if any(
            not r.sched.queue_depth()
            and not any(i in self._busy or self._open.get(i) for i in r.instance_ids)
            for r in self._retiring
        ):
            # NOTE: a retirement may end on the next pass without any message arriving.
            deadlines.append(0)
        return min(deadlines, default=None)

    def idle(self) -> bool:
        """Nothing queued and nothing running."""
        return (
            not self._inflight
            and not self._retiring
            and all(s.queue_depth() == 0 for s in self._models.values())
        )


def run_scheduler(spec_bytes: bytes, ready: Connection) -> int:
    """Process entry of the scheduler.

    Args:
        spec_bytes: a msgpack-encoded ``SchedulerSpec``.
        ready: the pipe to the supervisor (``ipc.handshake``: Ready once the channels are
            attached).

    Returns:
        The process exit status (0 after a Shutdown message).
    """
    spec: SchedulerSpec = Decoder(SchedulerSpec).decode(spec_bytes)
    configure_logging("scheduler", "", spec.log.verbose, spec.log.format)
    # NOTE: Ctrl-C reaches the whole process group; the supervisor orders the shutdown.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    inbox: Inbox[ToScheduler] = Inbox(spec.inbox.wakeup, spec.inbox.rings, ToScheduler)
    workers = {i: Sender(c.ring, c.wakeup) for i, c in spec.to_workers.items()}
    frontends = {i: Sender(c.ring, c.wakeup) for i, c in spec.to_frontends.items()}
    broadcast = tuple(frontends)
    bls_clients: dict[int, Sender] = {}
    """Per python worker instance id: the ring into its BLS client's inbox."""

    def send_worker(instance_id: int, msg: object) -> None:
        sender = workers.get(instance_id)
        if sender is not None:
            sender.send_bytes(encode(msg))

    def send_frontend(frontend_id: int, msg: object) -> None:
        sender = frontends.get(frontend_id)
        if sender is not None:
            sender.send_bytes(encode(msg))

    def send_bls(instance_id: int, msg: object) -> None:
        sender = bls_clients.get(instance_id)
        if sender is not None:
            sender.send_bytes(encode(msg))

    from_workers: dict[int, str] = {}

    def attach(w: InstanceWiring) -> None:
        workers[w.instance_id] = Sender(w.to_worker_ring, w.to_worker_wakeup)
        inbox.add_ring(w.from_worker_ring)
        from_workers[w.instance_id] = w.from_worker_ring
        if w.bls_client is not None:
            bls_clients[w.instance_id] = Sender(w.bls_client.ring, w.bls_client.wakeup)

    def detach(instance_id: int) -> None:
        sender = workers.pop(instance_id, None)
        if sender is not None:
            sender.close()
        client = bls_clients.pop(instance_id, None)
        if client is not None:
            client.close()
        ring = from_workers.pop(instance_id, None)
        if ring is not None:
            # NOTE: what a stopped worker left behind (its last BatchDone) no longer matters.
            inbox.remove_ring(ring)

    core = SchedulerCore(
        spec.models, send_worker, send_frontend, broadcast, attach, detach, send_bls
    )
    core.defer_unknown = True
    # NOTE: the loop sleeps until batch deadlines; see set_timer_slack_ns for why.
    set_timer_slack_ns(SCHEDULER_TIMER_SLACK_NS)
    clock: Clock = MonotonicClock()
    report_ready(ready, "scheduler", "scheduler")
    log.info("scheduler ready: %d model versions", len(spec.models))
    while True:
        deadline = core.next_deadline_ns()
        timeout_s = None if deadline is None else max(0.0, (deadline - clock.now_ns()) / 1e9)
        inbox.wait(timeout_s)
        msgs = inbox.drain()
        now = clock.now_ns()
        for msg in msgs:
            core.handle(msg, now)
        if core.deferred:
            # NOTE: a request for a version the scheduler does not know yet may have been
            # sent right after its activation, which this drain missed; drain once more.
            for msg in inbox.drain():
                core.handle(msg, now)
            core.retry_deferred(now)
        if core.stopping:
            break
        core.dispatch(clock.now_ns())
    for i in workers:
        send_worker(i, Shutdown())
    log.info("scheduler stopped")
    inbox.close()
    return 0
