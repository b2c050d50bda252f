"""One model instance's batch execution: run a batch on its backend and answer each request.

``Worker`` is the logic of a worker process (``workers.main`` is the process entry), and is
constructible in-process with any ``Backend`` (tests). Per batch: view each request's inputs
in the frontend's arena (no copy), let the backend gather/run/scatter, write each request's
outputs into this worker's arena (one copy; ``workers.tensors.tensor_io``), post the answers
straight to each request's frontend (``workers.answering``: several requests of one frontend
in one ``AnswerBatch`` with one output block, the others one ``InferResponse`` each) and a
``BatchDone`` to the scheduler.

Sequence models (``model.sequence`` set; see ``workers.sequence_state``): the backend also
gets a ``SequenceBatch`` (the batch rows of the Direct strategy, with null rows, and the
control tensors), and the worker keeps each sequence's implicit state between its requests:
it adds the state inputs to a request and asks for the state outputs, stores them after the
run, and forgets a sequence's state after its END request or when the scheduler releases it
as idle (``BatchAssign.released``). Other models take exactly the path they took before.

Decoupled models (``model.decoupled``): the backend answers requests itself through
``Worker.respond``, from any thread and after ``execute`` returned, zero or more responses
then a final one per request. Each response is one output block, posted as it is sent; the
instance is idle for the scheduler when ``execute`` returns (``BatchDone``), as in Triton,
and each final response is also reported to the scheduler (``DecoupledDone``), which keeps
the request open until then (cancellation, instance death). Writing and posting responses
is serialised by one lock: the arena allocator and each ring have one producer.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from triton_mp.backends.base import (
    Backend,
    BackendRequest,
    Result,
    SequenceBatch,
)
from triton_mp.common.errors import ErrorCode, TritonMPError, flatten_exception
from triton_mp.ipc import ArenaAllocator, SegmentCache, Sender
from triton_mp.ipc.output_holds import OutputArenas
from triton_mp.ipc.protocol.messages import (
    BatchAssign,
    BatchDone,
    CancelRequest,
    DropSegments,
    ErrorInfo,
    InferRequest,
    InferResponse,
    ReplyTo,
    Requester,
    SequenceFlags,
)
from triton_mp.ipc.protocol.ready_messages import InstanceReadiness, ReadyCheck
from triton_mp.ipc.protocol.specs import WorkerSpec
from triton_mp.workers.answering import Answers
from triton_mp.workers.execution_watch import ExecutionWatch
from triton_mp.workers.prewake import EarlyWakes
from triton_mp.workers.readiness import ReadinessRunner
from triton_mp.workers.sequence_state import SequenceStates, sequence_batch
from triton_mp.workers.tensors.batch_requests import BatchRequests
from triton_mp.workers.tensors.tensor_io import (
    ClientRegions,
    view_tensor,
    write_outputs,
)
from triton_mp.workers.traces import Traces
from triton_mp.workers.warmup import WarmupToken

log = logging.getLogger(__name__)

CANCELLED_KEPT = 4096
"""Most cancelled request keys a worker keeps (a bound for those that raced their end)."""


class Worker:
    """Runs batches on one backend and writes responses (process-agnostic logic).

    Args:
        spec: this instance's spec.
        backend: the loaded backend.
        arena: this worker's output arena allocator.
        cache: attached input arenas of the frontends.
        send_reply: ``send_reply(reply_to, message)``: to a request's frontend or BLS client.
        send_scheduler: ``send_scheduler(message)``.
        send_done: how a ``BatchDone`` whose requests the model all answered goes to the
            scheduler (``channel.Sender.send_lazy``: no wake-up when the scheduler does not
            ask for one); default ``send_scheduler``.
        wake_frontend: wakes frontend ``id`` before a short batch's answers
            (``workers.prewake``); None: never early.
        reoffer: posts this instance's lease after a batch when the scheduler would
            (``ipc.direct.SelfOffer.after_batch``, given whether requests were
            rescheduled; True when posted); None: the version holds no lease.
        send_answer: ``send_answer(frontend_id, data)``: an ``AnswerBatch`` already encoded
            (``workers.tensors.answer_batch``'s C writer); None: every answer goes to
            ``send_reply`` as a message.
        frontends: the senders to each frontend, by id: one frontend's plain batch is
            pushed into its ring by the C writer itself (``workers.answering``); None: by
            ``send_answer``.

    Raises (from the constructor):
        ConfigError: the model's initial implicit state cannot be made (an unreadable or
            wrongly sized ``initial_state`` data file).
    """

    def __init__(
        self,
        spec: WorkerSpec,
        backend: Backend,
        arena: ArenaAllocator,
        cache: SegmentCache,
        send_reply: Callable[[ReplyTo, object], None],
        send_scheduler: Callable[[object], None],
        send_done: Callable[[object], object] | None = None,
        wake_frontend: Callable[[int], None] | None = None,
        reoffer: Callable[[bool], bool] | None = None,
        send_answer: Callable[[int, bytes], None] | None = None,
        frontends: Mapping[int, Sender] | None = None,
    ) -> None:
        self._spec = spec
        self._backend = backend
        self._arena = arena
        self._cache = cache
        self._send_reply = send_reply
        self._send_scheduler = send_scheduler
        self._send_done = send_done or send_scheduler
        self._reoffer = reoffer
        self._origin = f"worker {spec.instance.name}"
        # NOTE: a backend that never writes its inputs needs no copy of a window two
        # requests of one batch read (``ClientRegions``' copy_overlaps).
        self._regions = ClientRegions(copy_overlaps=getattr(backend, "writes_inputs", True))
        self._sequence = spec.model.sequence
        self._states = SequenceStates.for_model(spec.model)
        self._gather = BatchRequests(cache, self._regions, self._states, self._origin)
        self._decoupled = spec.model.decoupled
        self._early = (
            None if wake_frontend is None or self._decoupled else EarlyWakes(wake_frontend)
        )
        self._post_lock = threading.RLock()
        self.post_lock = self._post_lock
        """Serialises this process's arena allocations and ring pushes (BLS shares it)."""
        self._traces = Traces(self._decoupled, lambda ref: view_tensor(cache, ref, self._regions))
        self._cancelled: set[tuple[ReplyTo, int]] = set()
        """(reply address, request id) of running or open (decoupled) requests whose client
        went away; also written by a model thread polling the execution watch."""
        self._gone_below: dict[int, int] = {}
        """Frontend id -> request ids below this came from its dead processes: their
        requests count as cancelled (``frontend_gone``)."""
        self._answers = Answers(
            spec.instance.instance_id,
            arena,
            self._regions,
            self._origin,
            self._decoupled,
            self._post_lock,
            self._traces,
            self._cancelled,
            send_reply,
            send_scheduler,
            send_answer,
            frontends,
            lambda segment: cache.get(segment).buf,
        )
        self.child_traces = self._traces.children
        """Traced requests in execution: their BLS child traces (``workers.bls.bls_client``)."""
        self.readiness: ReadinessRunner | None = None
        """Runs the model's own readiness check (python ``is_ready()``; ``workers.main``)."""
        self.watch: ExecutionWatch[Any] | None = None
        """Reads the inbox on ``is_cancelled`` while a batch executes (python models;
        ``workers.main``)."""
        bind = getattr(backend, "bind_responder", None)
        if bind is not None:
            bind(self.respond, self.is_cancelled)

    def respond(
        self, token: object, result: dict[str, np.ndarray] | ErrorInfo | None, final: bool
    ) -> None:
        """Send one response of a request now (``backends.base.Responder``); thread-safe.

        Args:
            token: the request's ``InferRequest`` (``BackendRequest.token``).
            result: outputs, an error, or None for a flags-only final response.
            final: no more responses follow for the request.

        Raises:
            TritonMPError: the outputs cannot be written (nothing was sent; the request is
                still open).
        """
        if isinstance(token, WarmupToken):
            token.record(result, final)
            return
        req = token
        assert isinstance(req, InferRequest)
        with self._post_lock:
            if isinstance(result, dict):
                msg = write_outputs(self._arena, self._regions, req, result, final)
            elif result is None:
                msg = InferResponse(
                    request_id=req.request_id, version=req.version, final=final, empty=True
                )
            else:
                msg = InferResponse(
                    request_id=req.request_id, version=req.version, error=result, final=final
                )
            if req.trace is not None and final:
                stamps = self._traces.open.pop((req.reply_to, req.request_id), [])
                outputs = result if isinstance(result, dict) else None
                msg = self._traces.record(msg, req, stamps, outputs)
            self._answers.post(req, msg)

    def is_cancelled(self, token: object) -> bool:
        """Whether the client of a running or open decoupled request cancelled it (cheap;
        thread-safe): the model's ``request.is_cancelled()``. Inside a batch it first looks
        at the inbox (``workers.execution_watch``): a cancellation posted during the
        execute is seen at once."""
        if isinstance(token, WarmupToken):
            return False
        req = token
        assert isinstance(req, InferRequest)
        watch = self.watch
        if watch is not None:
            watch.poll()
        if (req.reply_to, req.request_id) in self._cancelled:
            return True
        gone = self._gone_below
        return (
            bool(gone)
            and req.reply_to.kind == Requester.FRONTEND
            and req.request_id < gone.get(req.reply_to.id, 0)
        )

    def check_ready(self, msg: ReadyCheck) -> None:
        """Answer a readiness check: through the model's ``is_ready()`` (off this thread),
        or ready at once for a model without one."""
        if self.readiness is not None:
            self.readiness.ask(msg)
            return
        answer = InstanceReadiness(
            query_id=msg.query_id, instance_id=self._spec.instance.instance_id, ready=True
        )
        self.reply_frontend(msg.frontend_id, answer)

    def reply_frontend(self, frontend_id: int, msg: object) -> None:
        """Send ``msg`` to frontend ``frontend_id`` (a readiness answer); thread-safe."""
        with self._post_lock:
            self._send_reply(ReplyTo(Requester.FRONTEND, frontend_id), msg)

    def reply_ready(self, check: ReadyCheck, msg: object) -> None:
        """Send a readiness answer to whoever asked ``check``: a frontend, or a python
        model's BLS client (``pb_utils.is_model_ready``); thread-safe."""
        if check.bls_client < 0:
            self.reply_frontend(check.frontend_id, msg)
            return
        with self._post_lock:
            self._send_reply(ReplyTo(Requester.BLS, check.bls_client), msg)

    def cancel(self, msg: CancelRequest) -> None:
        """The scheduler forwarded the cancellation of a request running here (or about
        to: the batch may still be in the inbox), or of an open decoupled one."""
        if len(self._cancelled) >= CANCELLED_KEPT:
            # NOTE: a cancellation that raced its request's end is never discarded.
            self._cancelled.clear()
        self._cancelled.add((msg.reply_to, msg.request_id))

    def frontend_gone(self, msg: DropSegments) -> None:
        """A frontend process died (``DropSegments``): from now on every request of frontend
        ``msg.frontend_id`` with an id below ``msg.requests_below`` counts as cancelled,
        running or still to come (its client's connection went with the process; without
        this a decoupled model went on answering into a ring nobody would read once the
        frontends stopped, and held the server's shutdown until its exit timeout)."""
        if msg.frontend_id >= 0 and msg.requests_below > self._gone_below.get(msg.frontend_id, 0):
            self._gone_below[msg.frontend_id] = msg.requests_below

    def run_batch(self, batch: BatchAssign) -> None:
        """Execute one batch, answer every request in it, then report ``BatchDone``
        (phase times in ns: ``compute_output_ns`` covers writing and posting responses)."""
        start_ns = time.monotonic_ns()
        reqs = self._gather.decoded(batch.requests)
        early = self._early
        if early is not None:
            early.batch_starts(reqs)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("batch %d started: %d requests", batch.batch_id, len(reqs))
        if self._states is not None and batch.released:
            # NOTE: before this batch's requests take their state: one of them may START a
            # new sequence under a released ID.
            self._states.drop(batch.released)
        traced = [r for r in reqs if r.trace is not None]
        if traced:
            self._traces.begin(traced, start_ns)
        watch = self.watch
        if watch is not None:
            watch.begin()
        regions = self._regions
        regions.batch_begins()
        try:
            results, t_input, t_infer = self._execute(batch, reqs)
        finally:
            if watch is not None:
                watch.end()
        if self._cancelled and not self._decoupled:
            for r in reqs:
                self._cancelled.discard((r.reply_to, r.request_id))
        if self._states is not None:
            self._keep_states(reqs, results)
        if early is not None:
            early.batch_executed(reqs)
        if traced:
            # NOTE: anchored where execute returned (absolute, this process's clock): the
            # infer phase ended there after t_infer; what came before is the input phase
            # (the worker's request set-up and the backend's own input time).
            exec_end = time.monotonic_ns()
            self._traces.computed(traced, exec_end - t_infer, exec_end)
        t0 = time.perf_counter_ns()
        try:
            failed, rescheduled = self._answers.answer(reqs, results)
        finally:
            regions.batch_ends()
        t_output = time.perf_counter_ns() - t0
        if early is not None:
            early.batch_ended(time.monotonic_ns() - start_ns)
        send, reoffered = self._done_route(bool(rescheduled))
        # NOTE: under the lock: response threads of decoupled models share the ring.
        with self._post_lock:
            send(
                BatchDone(
                    instance_id=self._spec.instance.instance_id,
                    batch_id=batch.batch_id,
                    start_ns=start_ns,
                    compute_input_ns=t_input,
                    compute_infer_ns=t_infer,
                    compute_output_ns=t_output,
                    end_ns=time.monotonic_ns(),
                    failed=failed,
                    rescheduled=rescheduled,
                    reoffered=reoffered,
                )
            )

    def _done_route(self, rescheduled: bool) -> tuple[Callable[[object], object], bool]:
        """How this batch's ``BatchDone`` goes, and whether this worker re-offered its
        lease first (``ipc.direct.worker_reoffers``): a rescheduled request must be queued
        again at once, and a lease the worker did not post is the scheduler's to offer,
        so both wake it; otherwise lazily (``scheduler.done_wakeups``)."""
        reoffer = self._reoffer
        if reoffer is not None:
            if reoffer(rescheduled):
                return self._send_done, True
            return self._send_scheduler, False
        return (self._send_scheduler if rescheduled else self._send_done), False

    def _execute(
        self, batch: BatchAssign, reqs: tuple[InferRequest, ...]
    ) -> tuple[list[Result | None], int, int]:
        """Run the batch's readable requests (``reqs``: ``batch``'s, decoded) on the backend.

        Returns:
            ``(results, compute_input_ns, compute_infer_ns)``: one result per request (an
            ``ErrorInfo`` for a request whose inputs could not be read, and for every request
            when the backend raised or miscounted its results).
        """
        results: list[Result | None] = [None] * len(reqs)
        runnable, backend_reqs = self._gather.backend_requests(reqs, results)
        t_input = t_infer = 0
        if not backend_reqs:
            return results, t_input, t_infer
        try:
            if self._sequence is None:
                ran, times = self._backend.execute(backend_reqs)
            else:
                ran, times = self._backend.execute(
                    backend_reqs, self._sequence_batch(batch, runnable, backend_reqs)
                )
            t_input, t_infer = times.compute_input_ns, times.compute_infer_ns
            if len(ran) != len(backend_reqs):
                raise TritonMPError(
                    f"backend returned {len(ran)} results for a batch of "
                    f"{len(backend_reqs)} requests"
                )
            if len(runnable) == len(results):
                # NOTE: every request reached the backend (the common batch): its results
                # in batch order, one copy, no loop.
                results = list(ran)
            else:
                for i, res in zip(runnable, ran, strict=True):
                    results[i] = res
        except Exception as exc:  # noqa: BLE001 - one failed batch must not stop the worker
            if isinstance(exc, TritonMPError):
                # NOTE: the backend's own words and status (e.g. "PyTorch execute failure:
                # ...", "onnx runtime error 2: ..."), as Triton's backends answer each request.
                log.debug("batch %d failed: %s", batch.batch_id, exc.message)
                info = ErrorInfo(exc.code, exc.message, self._origin)
            else:
                log.exception("batch %d failed", batch.batch_id)
                info = ErrorInfo(ErrorCode.INTERNAL, flatten_exception(exc), self._origin)
            for i in runnable:
                results[i] = info
        return results, t_input, t_infer

    def close(self) -> None:
        """Unmap the clients' regions."""
        self._regions.close()

    def drop_segments(self, prefixes: tuple[str, ...], holder: int = 0) -> None:
        """Unmap the input arenas of a frontend process that died and free the output
        blocks its replies held in place (``DropSegments``; ``ipc.output_holds``)."""
        for prefix in prefixes:
            self._cache.drop(prefix)
        if holder and isinstance(self._arena, OutputArenas):
            with self._post_lock:
                freed = self._arena.free_held_by(holder)
            if freed:
                log.info("freed %d output blocks held by frontend process %d", freed, holder)

    def _sequence_batch(
        self, batch: BatchAssign, runnable: list[int], backend_reqs: list[BackendRequest]
    ) -> SequenceBatch:
        """The batch rows of the requests that reach the backend (a request that failed
        before leaves a null row in the Direct strategy) and the control tensors.

        Raises:
            TritonMPError (INTERNAL): ``batch.slots`` does not fit ``batch.requests``.
        """
        slots: tuple[int, ...] = ()
        if batch.rows:
            if len(batch.slots) != len(batch.requests):
                raise TritonMPError(
                    f"batch {batch.batch_id} has {len(batch.requests)} requests but "
                    f"{len(batch.slots)} slots"
                )
            slots = tuple(batch.slots[i] for i in runnable)
        return sequence_batch(self._spec.model, backend_reqs, batch.rows, slots)

    def _keep_states(self, reqs: tuple[InferRequest, ...], results: list[Result | None]) -> None:
        """After a run: store each request's state outputs as its sequence's next state
        inputs; forget the sequence after an END request (whether it succeeded or not).
        A request whose state outputs are missing fails."""
        assert self._states is not None
        for i, req in enumerate(reqs):
            res = results[i]
            if req.sequence_flags & SequenceFlags.END:
                self._states.drop((req.sequence_id,))
            elif isinstance(res, dict):
                try:
                    self._states.update(req.sequence_id, res)
                except TritonMPError as e:
                    results[i] = ErrorInfo(e.code, e.message, self._origin)
