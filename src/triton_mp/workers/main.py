"""The worker process entry: decode the spec, load the backend, wire the rings, loop.

``run_worker`` is the spawn target of a worker (one model instance); the batch logic is
``workers.worker.Worker``. On start the worker applies its host policy (pinned cores, NUMA
memory binding, nice value), loads the backend and runs the model's warmup before it
reports ready. It drops what a dead predecessor left in its
inbox except BLS updates (``replayed_on_start``); then ``serve`` hands each message to
``handle``: a ``BatchAssign`` runs, a ``CancelRequest`` goes to the worker, a
``BlsWorkerUpdate`` rewires the rings to BLS clients and the table of models a python model
may call (``workers.bls.bls_client``), and ``Shutdown`` stops the loop after its drain.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import time
from collections.abc import Callable, Iterable
from multiprocessing.connection import Connection

import msgspec
import posix_ipc

from triton_mp.backends.base import Backend
from triton_mp.backends.registry import load_backend
from triton_mp.common.errors import ErrorCode, TritonMPError, flatten_exception, status_text
from triton_mp.common.process.log import configure_logging
from triton_mp.common.process.platform import bind_memory_to_node, lower_priority, pin_process
from triton_mp.ipc import ArenaAllocator, Inbox, SegmentCache, Sender, encode
from triton_mp.ipc.direct import SelfOffer
from triton_mp.ipc.handshake import report_ready, report_start_failed
from triton_mp.ipc.memory.topology import process_arena_prefix
from triton_mp.ipc.output_holds import OutputArenas
from triton_mp.ipc.protocol.log_messages import LogSettingsUpdate, apply_update
from triton_mp.ipc.protocol.messages import (
    BatchAssign,
    BatchDue,
    BlsWorkerUpdate,
    CancelRequest,
    DropSegments,
    ReadyCheck,
    Requester,
    Shutdown,
    ToWorker,
    WarmupRun,
    WorkerReady,
)
from triton_mp.ipc.protocol.specs import InstanceSpec, WorkerSpec
from triton_mp.ipc.recordio.codec import Decoder
from triton_mp.workers.due import DueBatch
from triton_mp.workers.execution_watch import ExecutionWatch
from triton_mp.workers.readiness import ReadinessRunner, poll_periodically
from triton_mp.workers.warmup import build_samples, warm_up
from triton_mp.workers.worker import Worker

log = logging.getLogger(__name__)

INBOX_SPIN_S = 0.0
"""How long a worker polls its inbox before it sleeps (``ipc.channel.Inbox.wait``): not at
all. Measured (py-spy --gil, add_sub_py c=16, 500 µs batching delay): with a 50 µs budget a
quarter of the worker's CPU went into spins, since the next batch comes a batching delay
later, and its wake-ups per inference fell only from 0.33 to 0.27."""


def _apply_bls_update(msg: BlsWorkerUpdate, senders: dict[int, Sender]) -> None:
    """Open this worker's rings to new BLS clients and close those to stopped ones."""
    for c in msg.add_clients:
        if c.instance_id in senders:
            continue
        try:
            senders[c.instance_id] = Sender(c.ring, c.wakeup)
        except (posix_ipc.ExistentialError, OSError, ValueError):
            # NOTE: a restarted worker may replay an update whose client is gone already.
            log.debug("BLS client of instance %d is gone; not wiring it", c.instance_id)
    for cid in msg.remove_clients:
        sender = senders.pop(cid, None)
        if sender is not None:
            sender.close()


def _start_failure(exc: BaseException) -> str:
    """Why an instance did not start, as core words a version's load failure
    (``Status::AsString``): "Internal: <why>" for a model that raised, "Invalid argument:
    <why>" for a refused warmup sample."""
    if isinstance(exc, TritonMPError):
        return status_text(exc.code, exc.message)
    return status_text(ErrorCode.INTERNAL, flatten_exception(exc))


def run_worker(spec_bytes: bytes, ready: Connection) -> int:
    """Process entry of a worker.

    Args:
        spec_bytes: a msgpack-encoded ``WorkerSpec``.
        ready: the pipe to the supervisor (``ipc.handshake``: Ready once the backend is
            loaded, StartFailed with the reason when it is not).

    Returns:
        The process exit status: 0 after Shutdown, 1 when the backend failed to load.
    """
    spec: WorkerSpec = Decoder(WorkerSpec).decode(spec_bytes)
    lg, name = spec.log, spec.instance.name
    configure_logging("worker", name, lg.verbose, lg.format, spec.model.model, lg.levels)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    inbox: Inbox[ToWorker] = Inbox(
        spec.inbox.wakeup, spec.inbox.rings, ToWorker, spin_max_s=INBOX_SPIN_S
    )
    rewiring = replayed_on_start(inbox.drain())
    to_scheduler = Sender(spec.to_scheduler.ring, spec.to_scheduler.wakeup)
    to_frontends = {i: Sender(c.ring, c.wakeup) for i, c in spec.to_frontends.items()}
    to_bls = {i: Sender(c.ring, c.wakeup) for i, c in spec.to_bls_clients.items()}
    # NOTE: an ensemble step's request is answered on the ring to the scheduler, which
    # runs the ensemble (``scheduler.ensembles``).
    replies = {
        Requester.FRONTEND: to_frontends,
        Requester.BLS: to_bls,
        Requester.ENSEMBLE: {0: to_scheduler},
    }
    owner_prefix = process_arena_prefix(spec.arena_prefix, os.getpid())
    arena = OutputArenas(owner_prefix, spec.arena_bytes, spec.arena_budget_bytes)
    custom_metrics = None
    if spec.model.capabilities.custom_metrics:
        from triton_mp.backends.python import metrics as python_metrics

        # NOTE: before the backend imports model.py: initialize() may create metrics.
        custom_metrics = python_metrics.install(owner_prefix, spec.model, spec.instance)
    cache = SegmentCache(writable=True)
    try:
        apply_host_policy(spec.instance)
        backend, worker, rewire, warm = _start(spec, arena, cache, to_scheduler, replies, rewiring)
    except Exception as exc:  # noqa: BLE001 - reported to the supervisor, which marks the model
        text = _start_failure(exc)
        log.error("failed to load model '%s': %s", spec.model.model, text)
        report_start_failed(ready, "worker", spec.instance.name, text)
        cache.close()
        if custom_metrics is not None:
            custom_metrics.close()
        return 1
    report_ready(ready, "worker", spec.instance.name)
    to_scheduler.send(
        WorkerReady(
            instance_id=spec.instance.instance_id,
            pid=os.getpid(),
            ready_check=_wire_readiness(spec, backend, worker),
            warmup=warm,
        )
    )
    log.info("instance ready")
    watch = None
    if spec.model.capabilities.cancellation_watch:
        # NOTE: only python models look at is_cancelled() while they execute.
        watch = ExecutionWatch(inbox, cancel_now(worker))
        worker.watch = watch
        if worker.readiness is not None:
            poll_periodically(watch.poll)
    readers_s = 0.0
    try:
        readers_s = serve(inbox, worker, rewire, watch, _ask_notices(inbox, spec))
    finally:
        backend.close()
        worker.close()
        cache.close()
        _leave_arena(arena, readers_s)
        if custom_metrics is not None:
            custom_metrics.close()
    log.info("instance stopped")
    return 0


def _ask_notices(inbox: Inbox[ToWorker], spec: WorkerSpec) -> Callable[[bool], None]:
    """``DueBatch``'s ``ask``: the quiet flag of the scheduler's ring to this worker, set
    while it wants no ``BatchDue`` (``scheduler.main.Router.send`` drops them then). The
    scheduler's ring comes first in the inbox (``supervisor.processes.instances``)."""
    ring = spec.inbox.rings[0]
    return lambda wanted: inbox.set_quiet(ring, not wanted)


def _wake_frontend(to_frontends: dict[int, Sender], frontend_id: int) -> None:
    """Wake one frontend early (``workers.prewake``); an unknown id is skipped (its
    request's answer reports the error)."""
    sender = to_frontends.get(frontend_id)
    if sender is not None:
        sender.wake()


def _leave_arena(arena: ArenaAllocator, readers_s: float) -> None:
    """Unlink this worker's arenas, after waiting up to ``readers_s`` seconds for its last
    answers to be read (``Shutdown.readers_s``: a retired version's worker)."""
    if readers_s:
        left = arena.await_readers(readers_s)
        if left:
            log.warning("%d answers not read after %.0f s; stopping anyway", left, readers_s)
    arena.close_and_unlink()


def _wire_readiness(spec: WorkerSpec, backend: Backend, worker: Worker) -> bool:
    """Give the worker a ``ReadinessRunner`` when the model checks its own readiness
    (python ``is_ready()``); True then (``WorkerReady.ready_check``)."""
    if not getattr(backend, "has_ready_check", False):
        return False
    check = backend.check_ready  # type: ignore[attr-defined]
    instance = spec.instance
    worker.readiness = ReadinessRunner(
        instance.instance_id, check, worker.reply_ready, instance.model, instance.version
    )
    return True


def apply_host_policy(instance: InstanceSpec) -> None:
    """Pin this worker process to its host policy's cores, bind its memory to the policy's
    NUMA node, and lower its priority (``optimization.priority``), before the backend
    starts any thread.

    Raises:
        TritonMPError: the kernel refused the policy (the load fails, as in Triton).
    """
    if instance.cpu_cores:
        log.debug(
            "Thread is binding to one of the CPUs: %s (host policy '%s')",
            list(instance.cpu_cores),
            instance.host_policy,
        )
        pin_process(instance.cpu_cores)
    if instance.numa_node >= 0:
        log.debug("binding memory to NUMA node %d", instance.numa_node)
        bind_memory_to_node(instance.numa_node)
    lower_priority(instance.nice)


def replayed_on_start(left: Iterable[ToWorker]) -> list[BlsWorkerUpdate]:
    """What a starting worker takes from the messages already in its inbox: the BLS updates,
    in order; batches and cancellations are dropped.

    NOTE: a restarted instance must not run batches its dead predecessor left behind: the
    scheduler has already failed them. BLS updates still count (the spec it started from may
    predate them).
    """
    return [m for m in left if isinstance(m, BlsWorkerUpdate)]


def control_first(msgs: list[ToWorker]) -> list[ToWorker]:
    """One drain of the worker's inbox in the order to apply it: the supervisor's BLS updates
    first, then the cancellations, then the scheduler's other messages in their order.

    The inbox drains the scheduler's ring before the supervisor's control ring, so an update
    written before a batch the drain saw is in the same drain (or an earlier one); applying
    updates first means a batch never runs without the wiring or model table it may need.
    A cancellation drained with the batch it cancels is applied before the batch runs, so
    the model's ``is_cancelled()`` is true from the start.
    """
    if len(msgs) < 2:
        return msgs  # NOTE: the common case under load: one batch per drain
    first = [m for m in msgs if isinstance(m, BlsWorkerUpdate | CancelRequest)]
    if not first:
        return msgs
    updates = [m for m in first if isinstance(m, BlsWorkerUpdate)]
    cancels = [m for m in first if isinstance(m, CancelRequest)]
    rest = [m for m in msgs if not isinstance(m, BlsWorkerUpdate | CancelRequest)]
    return [*updates, *cancels, *rest]


def handle(msg: ToWorker, worker: Worker, rewire: Callable[[BlsWorkerUpdate], None]) -> bool:
    """Act on one message of the scheduler; True for ``Shutdown`` (stop after this drain)."""
    if isinstance(msg, Shutdown):
        return True
    if isinstance(msg, BatchAssign):
        worker.run_batch(msg)
    elif isinstance(msg, CancelRequest):
        worker.cancel(msg)
    elif isinstance(msg, ReadyCheck):
        worker.check_ready(msg)
    elif isinstance(msg, BlsWorkerUpdate):
        rewire(msg)
    elif isinstance(msg, LogSettingsUpdate):
        apply_update(msg)
    elif isinstance(msg, DropSegments):
        worker.frontend_gone(msg)
        worker.drop_segments(msg.prefixes, msg.holder)
    return False


def serve(
    inbox: Inbox[ToWorker],
    worker: Worker,
    rewire: Callable[[BlsWorkerUpdate], None],
    watch: ExecutionWatch[ToWorker] | None = None,
    ask_notices: Callable[[bool], None] | None = None,
) -> float:
    """The worker's loop: handle every message until a ``Shutdown``, each drain in the order
    of ``control_first``; the messages drained with the ``Shutdown`` are still handled.
    Returns the ``Shutdown``'s ``readers_s`` (seconds to wait for the last answers to be
    read before the arenas go).

    With ``watch`` (python models), the inbox is also read while a batch executes
    (``workers.execution_watch``): cancellations reach the model at once, the rest is
    handled here after the batch. After a ``BatchDue`` the loop polls the inbox for the
    batch rather than sleeping (``workers.due``); ``ask_notices`` tells the scheduler whether
    this instance wants such notices (``DueBatch``'s ``ask``).
    """
    due = DueBatch(ask_notices)
    while True:
        if watch is None:
            _wait(inbox, due)
            msgs = inbox.drain()
        else:
            msgs = watch.take()
            if not msgs:
                _wait(inbox, due)
                msgs = watch.take(pending=True)
        stop: Shutdown | None = None
        for msg in control_first(msgs):
            if type(msg) is BatchAssign:
                # NOTE: the hot path (one batch per drain under load): ``handle``'s first
                # two tests and its call saved.
                due.arrived(len(msg.requests))
                worker.run_batch(msg)
                continue
            if isinstance(msg, BatchDue):
                due.expect(msg.at_ns, time.monotonic_ns())
                continue
            if handle(msg, worker, rewire) and isinstance(msg, Shutdown):
                stop = msg
        if stop is not None:
            return stop.readers_s


def _wait(inbox: Inbox[ToWorker], due: DueBatch) -> None:
    """Until the inbox holds a record: polled while a batch is due, else asleep."""
    poll_s = due.poll_s(time.monotonic_ns())
    if poll_s and inbox.poll(poll_s):
        return
    inbox.wait(None)


def cancel_now(worker: Worker) -> Callable[[ToWorker], bool]:
    """What the execution watch applies during a batch: cancellations (a dead frontend's
    too: its arenas are unmapped by the loop) and readiness checks (the rest waits for the
    loop)."""

    def apply(msg: ToWorker) -> bool:
        if isinstance(msg, CancelRequest):
            worker.cancel(msg)
            return True
        if isinstance(msg, DropSegments):
            worker.frontend_gone(msg)
            return False
        if isinstance(msg, ReadyCheck):
            worker.check_ready(msg)
            return True
        return False

    return apply


def _start(
    spec: WorkerSpec,
    arena: ArenaAllocator,
    cache: SegmentCache,
    to_scheduler: Sender,
    replies: dict[Requester, dict[int, Sender]],
    rewiring: list[BlsWorkerUpdate],
) -> tuple[Backend, Worker, Callable[[BlsWorkerUpdate], None], tuple[WarmupRun, ...]]:
    """Load the instance, wire its BLS client, then warm it up (``workers.warmup``): a
    python model may call other models from its warmup samples, as in Triton. The backend
    and the worker are closed again when the warmup fails. Returns them, the BLS rewiring
    hook and the warmup's executions (``WorkerReady.warmup``).

    Raises:
        Exception: whatever loading or warming up raised (the caller reports it).
    """
    _early_model_control(spec)
    backend, worker = _load(spec, arena, cache, to_scheduler, replies)
    try:
        rewire = _bls_rewiring(spec, worker, arena, cache, to_scheduler, replies[Requester.BLS])
        for update in rewiring:
            rewire(update)
        warmup: tuple[WarmupRun, ...] = ()
        if spec.model.warmup:
            # NOTE: no message reaches the instance before its Ready: warmup runs alone.
            samples = build_samples(spec.model)
            warmup = warm_up(backend, spec.model, spec.instance.name, samples)
    except BaseException:
        backend.close()
        worker.close()
        raise
    return backend, worker, rewire, warmup


def _early_model_control(spec: WorkerSpec) -> None:
    """Before a python model's ``initialize``: its ``pb_utils.load_model`` / ``unload_model``
    and an ``is_model_ready`` answered from the served models at spawn (the README's model
    loading example runs in ``initialize``; the BLS client, which also asks ``is_ready()``,
    takes over once wired)."""
    if spec.bls is None:
        return
    from triton_mp.backends.python import pb_utils
    from triton_mp.workers.bls.model_control_client import ModelControlClient

    models = spec.bls.models

    def ready(name: str, version: int) -> bool:
        model = models.get(name)
        return (
            model is not None
            and bool(model.versions)
            and (version < 0 or version in model.versions)
        )

    pb_utils.set_bls(None, ready)
    control = ModelControlClient(spec.bls.control_address, spec.bls.control_key)
    pb_utils.set_model_control(control.load, control.unload, spec.instance.name)


def _load(
    spec: WorkerSpec,
    arena: ArenaAllocator,
    cache: SegmentCache,
    to_scheduler: Sender,
    replies: dict[Requester, dict[int, Sender]],
) -> tuple[Backend, Worker]:
    """Load the backend and build the ``Worker`` over it (which reads the initial implicit
    state: part of loading); the backend is closed again when the ``Worker`` fails.

    Raises:
        Exception: whatever the backend raised while loading (the caller reports it).
    """
    log.info(
        "loading model '%s' version %d (%s backend)",
        spec.model.model,
        spec.model.version,
        spec.model.backend,
    )
    backend = load_backend(spec.model, spec.instance)
    # NOTE: the encoder's bound method, as ``ipc.encode`` calls it: one Python frame less per
    # answer and per BatchDone (the same bytes).
    enc = msgspec.msgpack.Encoder().encode
    try:
        worker = Worker(
            spec,
            backend,
            arena,
            cache,
            # NOTE: answers go as msgpack, not as the binary ANSWERS record (ipc.recordio.records):
            # every frontend's answer reader is Python today, and for it msgpack is the cheaper form
            # (per response: encode 0.25 against 12-33 µs in Python, decode 2 against 7-13 µs;
            # measured 2026-12-05 under load). A frontend decodes both forms.
            lambda to, msg: replies[to.kind][to.id].send_bytes(enc(msg)),
            lambda msg: to_scheduler.send_bytes(enc(msg)),
            lambda msg: to_scheduler.send_lazy(enc(msg)),
            # NOTE: a partial, not a lambda: no frame and no enum lookup per early wake.
            functools.partial(_wake_frontend, replies[Requester.FRONTEND]),
            _self_offer(spec, to_scheduler),
            lambda frontend_id, data: replies[Requester.FRONTEND][frontend_id].send_bytes(data),
            replies[Requester.FRONTEND],
        )
    except BaseException:
        backend.close()
        raise
    return backend, worker


def _self_offer(spec: WorkerSpec, to_scheduler: Sender) -> Callable[[bool], bool] | None:
    """The worker's re-offer of its lease after a batch (``ipc.direct.SelfOffer``); None
    when its version holds none. The handle lives as long as the process."""
    if not spec.lease:
        return None
    offer = SelfOffer(spec.lease, to_scheduler.consumer_quiet, to_scheduler.consumer_woken)
    return offer.after_batch


def _bls_rewiring(
    spec: WorkerSpec,
    worker: Worker,
    arena: ArenaAllocator,
    cache: SegmentCache,
    to_scheduler: Sender,
    to_bls: dict[int, Sender],
) -> Callable[[BlsWorkerUpdate], None]:
    """Start the BLS client of a python model that may call others (``spec.bls``) and
    return what applies a ``BlsWorkerUpdate``: the rings to BLS clients, the model table."""
    bls = None
    if spec.bls is not None:
        from triton_mp.backends.python import pb_utils
        from triton_mp.workers.bls.bls_client import BlsClient
        from triton_mp.workers.bls.model_control_client import ModelControlClient

        bls = BlsClient(
            spec.bls,
            spec.instance.instance_id,
            spec.model.model,
            arena,
            cache,
            lambda msg: to_scheduler.send_bytes(encode(msg)),
            worker.post_lock,
            worker.child_traces,
        )
        pb_utils.set_bls(bls.submit, bls.is_model_ready)
        control = ModelControlClient(spec.bls.control_address, spec.bls.control_key)
        pb_utils.set_model_control(control.load, control.unload, spec.instance.name)

    def rewire(msg: BlsWorkerUpdate) -> None:
        with worker.post_lock:
            _apply_bls_update(msg, to_bls)
        if bls is not None and msg.models is not None:
            bls.set_models(msg.seq, msg.models)

    return rewire
