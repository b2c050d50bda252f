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

from triton_mp.config import ModelVersionSpec, QueuePolicySpec, SchedulerSpec
from triton_mp.errors import ErrorCode
from triton_mp.ipc import Inbox, Sender, encode
from triton_mp.ipc.codec import Decoder
from triton_mp.ipc.messages import (
    BatchAssign,
    BatchDone,
    BatchRecord,
    CancelRequest,
    DecoupledDone,
    ErrorInfo,
    InferRequest,
    InstanceStatus,
    LevelStatus,
    ModelAvailability,
    ModelQueueStatus,
    QueueQuery,
    QueueReply,
    RequestFailed,
    ShmRegistered,
    ShmUnregistered,
    Shutdown,
    StatsQuery,
    StatsReply,
    ToScheduler,
    WorkerDied,
    WorkerReady,
)
from triton_mp.log import configure_logging
from triton_mp.scheduler.clock import Clock, MonotonicClock
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
        frontend_ids: every frontend (relays of client shared-memory registrations).
    """

    def __init__(
        self,
        models: tuple[ModelVersionSpec, ...],
        send_worker: Callable[[int, object], None],
        send_frontend: Callable[[int, object], None],
        frontend_ids: tuple[int, ...] = (),
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
        self._open: dict[int, dict[tuple[int, int], InferRequest]] = {}
        """instance id -> requests of a decoupled model dispatched there whose final
        response the worker has not reported yet (``DecoupledDone``)."""
        self._next_batch_id = 1
        self.stats = StatsBook(self._specs)
        self._send_worker = send_worker
        self._send_frontend = send_frontend
        self.stopping = False

    # ----------------------------------------------------------------- messages
    def handle(self, msg: ToScheduler, now_ns: int) -> None:
        """Apply one message."""
        if isinstance(msg, InferRequest):
            self._on_request(msg, now_ns)
        elif isinstance(msg, BatchDone):
            self._on_batch_done(msg, now_ns)
        elif isinstance(msg, DecoupledDone):
            self._open.get(msg.instance_id, {}).pop((msg.frontend_id, msg.request_id), None)
        elif isinstance(msg, CancelRequest):
            self._on_cancel(msg, now_ns)
        elif isinstance(msg, WorkerReady):
            key = self._instance_model.get(msg.instance_id)
            if key is not None:
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
                self._models[key].instance_idle(msg.instance_id, now_ns)
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
        elif isinstance(msg, ShmRegistered | ShmUnregistered):
            # NOTE: relayed so that every frontend knows every client region.
            for fid in self._frontend_ids:
                if fid != msg.frontend_id:
                    self._send_frontend(fid, msg)

    def _fail(
        self,
        req: InferRequest,
        code: ErrorCode,
        message: str,
        now_ns: int,
        reason: str = "OTHER",
    ) -> None:
        self.stats.record_failure(req.model, req.version, req.arrival_ns, now_ns, reason)
        self._send_frontend(
            req.frontend_id,
            RequestFailed(
                request_id=req.request_id,
                error=ErrorInfo(code=code, message=message, origin="scheduler"),
            ),
        )

    def _on_request(self, req: InferRequest, now_ns: int) -> None:
        key = (req.model, req.version)
        sched = self._models.get(key)
        if self.stopping or sched is None:
            text = (
                STOPPING_MESSAGE
                if self.stopping
                else f"Request for unknown model: '{req.model}' version {req.version} is not found"
            )
            code = ErrorCode.UNAVAILABLE if self.stopping else ErrorCode.NOT_FOUND
            self._fail(req, code, text, now_ns)
            return
        enforced = self._enforced[key]
        shape_key = tuple(t.shape[1:] for t in req.inputs if t.name in enforced) if enforced else ()
        item = Queued(
            (req.frontend_id, req.request_id),
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

    def _on_cancel(self, msg: CancelRequest, now_ns: int) -> None:
        """Drop a request whose client went away, if it has not been dispatched yet."""
        sched = self._models.get((msg.model, msg.version))
        item = sched.cancel((msg.frontend_id, msg.request_id)) if sched else None
        if item is None and (msg.model, msg.version) in self._decoupled:
            # NOTE: a decoupled request already running: its model may stop early when it
            # sees ``is_cancelled()``; the worker answers it as the model decides.
            key = (msg.frontend_id, msg.request_id)
            for instance_id, requests in self._open.items():
                if key in requests:
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
        if not self.stopping:
            self._models[key].instance_idle(msg.instance_id, now_ns)

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
        self._models[key].instance_gone(msg.instance_id)
        self._set_live(key, msg.instance_id, False)
        self._died.add(msg.instance_id)
        batch_id = self._busy.pop(msg.instance_id, None)
        flight = self._inflight.pop(batch_id, None) if batch_id is not None else None
        name = self._instance_names.get(msg.instance_id, str(msg.instance_id))
        open_requests = self._open.pop(msg.instance_id, {})
        if flight is not None:
            for r in flight.requests:
                open_requests.pop((r.frontend_id, r.request_id), None)
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
                self._send_frontend(
                    r.frontend_id,
                    RequestFailed(
                        request_id=r.request_id,
                        error=ErrorInfo(ErrorCode.UNAVAILABLE, text, "scheduler"),
                    ),
                )

    def _on_shutdown(self, now_ns: int) -> None:
        self.stopping = True
        for sched in self._models.values():
            for item in sched.drain_queue():
                req = item.payload
                assert isinstance(req, InferRequest)
                self._fail(req, ErrorCode.UNAVAILABLE, STOPPING_MESSAGE, now_ns)

    # ----------------------------------------------------------------- batching
    def dispatch(self, now_ns: int) -> int:
        """Form and send every batch that is ready now; returns how many."""
        sent = 0
        for key, sched in self._models.items():
            for item, why in sched.expire(now_ns):
                req = cast(InferRequest, item.payload)
                message = why.message if why is TIMED_OUT else request_label(req) + why.message
                self._fail(req, why.code, message, now_ns, why.reason)
            batch_log = self._batch_log[key]
            for batch in sched.pop_ready(now_ns):
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
                        opened[(r.frontend_id, r.request_id)] = r
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
                sent += 1
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
        deadlines = [d for s in self._models.values() if (d := s.next_deadline_ns()) is not None]
        return min(deadlines, default=None)

    def idle(self) -> bool:
        """Nothing queued and nothing running."""
        return not self._inflight and all(s.queue_depth() == 0 for s in self._models.values())


def run_scheduler(spec_bytes: bytes, ready: Connection) -> int:
    """Process entry of the scheduler.

    Args:
        spec_bytes: a msgpack-encoded ``SchedulerSpec``.
        ready: the supervisor's end receives ``b"ready"`` once the channels are attached.

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
    # NOTE: python workers' BLS clients get answers like a frontend, but no broadcasts.
    frontends.update({i: Sender(c.ring, c.wakeup) for i, c in spec.to_clients.items()})

    def send_worker(instance_id: int, msg: object) -> None:
        workers[instance_id].send_bytes(encode(msg))

    def send_frontend(frontend_id: int, msg: object) -> None:
        sender = frontends.get(frontend_id)
        if sender is not None:
            sender.send_bytes(encode(msg))

    core = SchedulerCore(spec.models, send_worker, send_frontend, broadcast)
    clock: Clock = MonotonicClock()
    ready.send_bytes(b"ready")
    log.info("scheduler ready: %d model versions", len(spec.models))
    while True:
        deadline = core.next_deadline_ns()
        timeout_s = None if deadline is None else max(0.0, (deadline - clock.now_ns()) / 1e9)
        inbox.wait(timeout_s)
        msgs = inbox.drain()
        now = clock.now_ns()
        for msg in msgs:
            core.handle(msg, now)
        if core.stopping:
            break
        core.dispatch(clock.now_ns())
    for i in workers:
        send_worker(i, Shutdown())
    log.info("scheduler stopped")
    inbox.close()
    return 0
