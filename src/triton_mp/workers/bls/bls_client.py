"""BLS: a python worker submits requests to other models through the scheduler.

Imported by worker processes only (``workers.main`` builds a ``BlsClient`` for python
workers; ``pb_utils.InferenceRequest.exec``/``async_exec`` call it through the hook
``pb_utils.set_bls``). The worker acts as one more client of the scheduler, like a frontend,
answered at its own typed address (``ReplyTo(Requester.BLS, <instance id>)``, never a
frontend's):

- the request's input tensors are written into one block of the worker's own arena (the
  callee's worker reads them there); the caller frees that block when the final answer
  arrives, as a frontend frees its input blocks;
- the descriptor goes to the scheduler through the worker's ring, so the callee's
  dynamic batcher, queue policies and statistics apply as to any request;
- answers (``InferResponse`` from the callee's worker, ``RequestFailed`` from the scheduler)
  arrive in the worker's BLS inbox, which a daemon thread drains (the main thread may be
  inside ``execute`` waiting for exactly those answers); output bytes are copied out of the
  callee's arena and its block freed at once.

The table of models it may call and the rings of its inbox follow the server's model changes
(``--model-control-mode=explicit|poll``), both sent by the supervisor on its own control
rings: ``BlsWorkerUpdate`` (into the worker's main inbox, applied before the batches of the
same drain) replaces the table once a change activated or dropped versions;
``BlsInboxUpdate`` (into this inbox, before any answer can use them) adds the rings of new
instances and removes those of stopped ones.

Errors come back as error responses, never exceptions (unknown model, bad version, the
callee's failure), as in Triton. A call to the caller's own model when it has one instance
would wait forever (Triton deadlocks there); it is answered at once with UNAVAILABLE.
``timeout`` (µs, the request's) also bounds how long ``exec`` waits; past it the request is
cancelled if still queued and the response is a DEADLINE_EXCEEDED error.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable

import posix_ipc

from triton_mp.backends.python import pb_utils
from triton_mp.ipc import ArenaAllocator, Inbox, SegmentCache, free_block
from triton_mp.ipc.protocol.messages import (
    BlockRef,
    BlsInboxUpdate,
    CancelRequest,
    ChildTrace,
    InferRequest,
    InferResponse,
    ReplyTo,
    Requester,
    RequestFailed,
    SequenceFlags,
    TensorTrace,
    ToBlsClient,
    TraceContext,
)
from triton_mp.ipc.protocol.ready_messages import InstanceReadiness, ReadyFanout, ReadyQuery
from triton_mp.ipc.protocol.specs import BlsModel, BlsSpec
from triton_mp.ipc.tensor_pool import SharedBlocks
from triton_mp.workers.bls.bls_readiness import ReadinessQueries
from triton_mp.workers.tensors.tensor_io import (
    free_own_block,
    view_tensor,
    wire_tensor,
    write_block,
)

log = logging.getLogger(__name__)

Answer = Callable[[pb_utils.InferenceResponse, bool], None]
"""``answer(response, final)``: called on the receiver thread for each response."""


class BlsClient:
    """Submits ``pb_utils.InferenceRequest`` objects and delivers their answers.

    Args:
        spec: the worker's BLS spec (inbox, models it may call).
        instance_id: the worker's instance id (its requests' reply address).
        own_model: the caller's model (self-calls with one instance are refused).
        arena: the worker's arena (input blocks are allocated there).
        cache: attached segments (the callees' output arenas).
        send_scheduler: pushes a message to the scheduler (thread-safe, the worker's lock).
        lock: the worker's lock over its arena and rings.
        child_traces: the worker's open traced requests -> their finished child traces
            (``Worker.child_traces``): a request made with ``trace=request.trace()`` of a
            traced request is traced, and its trace lands there.
    """

    def __init__(
        self,
        spec: BlsSpec,
        instance_id: int,
        own_model: str,
        arena: ArenaAllocator,
        cache: SegmentCache,
        send_scheduler: Callable[[object], None],
        lock: threading.RLock,
        child_traces: dict[tuple[ReplyTo, int], list[ChildTrace]] | None = None,
    ) -> None:
        self._spec = spec
        self._reply_to = ReplyTo(Requester.BLS, instance_id)
        self._models = spec.models
        """Replaced whole (``set_models``), never changed in place: readers take it once."""
        self._seq = spec.seq
        self._own = own_model
        self._arena = arena
        self._cache = cache
        self._shared = SharedBlocks()
        """Shared blocks of ensemble responses (the receive thread's only)."""
        self._send = send_scheduler
        self._lock = lock
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[Answer, BlockRef]] = {}
        self._readiness = ReadinessQueries()
        self._child_traces = child_traces if child_traces is not None else {}
        self._traces: dict[int, _OpenChild] = {}
        """Traced BLS requests in flight, by request id."""
        self._inbox: Inbox[ToBlsClient] = Inbox(spec.inbox.wakeup, spec.inbox.rings, ToBlsClient)
        # NOTE: answers meant for a dead predecessor are dropped, ring changes are not.
        for msg in self._inbox.drain():
            if isinstance(msg, BlsInboxUpdate):
                self._rewire(msg)
        self._thread = threading.Thread(target=self._receive, name="triton-mp bls", daemon=True)
        self._thread.start()

    def set_models(self, seq: int, models: dict[str, BlsModel]) -> None:
        """Replace the table of models this client may call (``BlsWorkerUpdate``); a table
        older than the one held (``seq``) is ignored. Thread-safe."""
        with self._lock:
            if seq >= self._seq:
                self._seq = seq
                self._models = models

    def is_model_ready(self, name: str, version: int) -> bool:
        """``pb_utils.is_model_ready``: whether ``name`` serves now (``version``; -1: its
        latest) as this client's table has it and, as core ``ModelIsReady`` asks the model,
        the model's own readiness check (python ``is_ready()``) of every instance says so
        (``workers.bls.bls_readiness``; models without one answer at once)."""
        model = self._models.get(name)
        if model is None or not model.versions:
            return False
        if version < 0:
            version = max(model.versions)
        elif version not in model.versions:
            return False
        query_id = next(self._ids)
        self._readiness.open(query_id)
        self._send(
            ReadyQuery(
                query_id=query_id,
                frontend_id=0,
                model=name,
                version=version,
                bls_client=self._reply_to.id,
            )
        )
        return self._readiness.wait(query_id)

    # ------------------------------------------------------------------ submit
    def submit(
        self, request: pb_utils.InferenceRequest, decoupled: bool, answer: Answer
    ) -> Callable[[], None]:
        """Send ``request``; ``answer(response, final)`` gets its response(s), an error
        response for every failure. Returns a function that cancels it (best effort)."""
        models = self._models
        error = self._check(request, decoupled, models)
        if error is not None:
            answer(_error_response(error[1], error[0]), True)
            return lambda: None
        name = request.model_name()
        model = models[name]
        version = request.model_version()
        if version < 0:
            version = max(model.versions)
        # NOTE: the list as the model named them (requested_output_names() is a set, as 2.51's)
        outputs = tuple(request._requested_output_names) or model.outputs  # noqa: SLF001
        arrays = [(t.name(), pb_utils._tensor_data(t)) for t in request.inputs()]  # noqa: SLF001
        batch = 1
        if model.max_batch_size > 0 and arrays and arrays[0][1].ndim > 0:
            batch = int(arrays[0][1].shape[0])
        rid = next(self._ids)
        with self._lock:
            try:
                block, refs = write_block(self._arena, [wire_tensor(n, a) for n, a in arrays])
            except Exception as exc:  # noqa: BLE001 - an answer, not an exception
                text = f"cannot send the BLS request: {exc}"
                answer(_error_response(text, pb_utils.TritonError.INTERNAL), True)
                return lambda: None
            self._pending[rid] = (answer, block)
            arrival_ns = time.monotonic_ns()
            parent = getattr(request, "_trace", None)
            context = None
            if parent is not None and parent.level and parent.parent in self._child_traces:
                context = TraceContext(parent.level)
                self._traces[rid] = _OpenChild(
                    parent.parent, name, version, request.request_id(), arrival_ns
                )
            desc = InferRequest(
                request_id=rid,
                reply_to=self._reply_to,
                model=name,
                version=version,
                batch_size=batch,
                inputs=refs,
                outputs=outputs,
                block=block,
                arrival_ns=arrival_ns,
                timeout_us=max(0, int(request.timeout())),
                client_id=request.request_id(),
                parameters_json=request.parameters(),
                sequence_id=request.correlation_id(),
                sequence_flags=int(request.flags() & (SequenceFlags.START | SequenceFlags.END)),
                trace=context,
            )
            self._send(desc)

        def cancel() -> None:
            with self._lock:
                self._send(
                    CancelRequest(
                        request_id=rid,
                        reply_to=self._reply_to,
                        model=name,
                        version=version,
                    )
                )

        return cancel

    def _check(
        self, request: pb_utils.InferenceRequest, decoupled: bool, models: dict[str, BlsModel]
    ) -> tuple[int, str] | None:
        name = request.model_name()
        model = models.get(name)
        if model is None:
            return (
                pb_utils.TritonError.NOT_FOUND,
                f"Request for unknown model: '{name}' is not found",
            )
        version = request.model_version()
        # NOTE: core ModelLifeCycle::GetModel's answers, as the frontend gives them.
        if version < 0 and not model.versions:
            return (
                pb_utils.TritonError.NOT_FOUND,
                f"Request for unknown model: '{name}' has no available versions",
            )
        if version >= 0 and version not in model.versions:
            if version in model.unavailable:
                return (
                    pb_utils.TritonError.UNAVAILABLE,
                    f"Request for unknown model: '{name}' version {version} is not at ready state",
                )
            return (
                pb_utils.TritonError.NOT_FOUND,
                f"Request for unknown model: '{name}' version {version} is not found",
            )
        if model.decoupled and not decoupled:
            return (
                pb_utils.TritonError.INVALID_ARG,
                f"model '{name}' is decoupled: call exec(decoupled=True)",
            )
        if name == self._own and model.instance_count == 1:
            return (
                pb_utils.TritonError.UNAVAILABLE,
                f"BLS request to model '{name}' from its only instance would wait for "
                "itself forever: give the model more instances",
            )
        for t in request.inputs():
            if not isinstance(t, pb_utils.Tensor):
                return (
                    pb_utils.TritonError.INVALID_ARG,
                    f"BLS inputs must be pb_utils.Tensor, got {type(t).__name__}",
                )
        for out in request._requested_output_names:  # noqa: SLF001 - in the model's order
            if out not in model.outputs:
                # NOTE: core Model::GetOutput, from InferenceRequest::Normalize.
                return (
                    pb_utils.TritonError.INVALID_ARG,
                    f"unexpected inference output '{out}' for model '{name}'",
                )
        return None

    # ----------------------------------------------------------------- receive
    def _receive(self) -> None:
        while True:
            self._inbox.wait(None)
            rewired = True
            while rewired:
                # NOTE: an answer may sit in a ring that an update of this same drain adds
                # (its wake-up was consumed already): drain again after any update.
                rewired = False
                for msg in self._inbox.drain():
                    if isinstance(msg, BlsInboxUpdate):
                        rewired = True
                        for left in self._rewire(msg):
                            self._deliver_safely(left)
                    else:
                        self._deliver_safely(msg)

    def _deliver_safely(self, msg: object) -> None:
        if isinstance(msg, ReadyFanout | InstanceReadiness):
            self._readiness.deliver(msg)
        elif isinstance(msg, InferResponse | RequestFailed):
            try:
                self._deliver(msg)
            except Exception:  # noqa: BLE001 - the thread must keep receiving
                log.exception("delivering BLS answer %d failed", msg.request_id)

    def _rewire(self, msg: BlsInboxUpdate) -> list[object]:
        """Attach new instances' rings, detach stopped ones'; returns what those still held."""
        for ring in msg.add_rings:
            try:
                self._inbox.add_ring(ring)
            except (posix_ipc.ExistentialError, OSError, ValueError):
                # NOTE: a restarted client may replay an update whose instance is gone.
                log.debug("BLS ring %s is gone; not attaching it", ring)
        left: list[object] = []
        for ring in msg.remove_rings:
            left.extend(self._inbox.remove_ring(ring))
        return left

    def _deliver(self, msg: InferResponse | RequestFailed) -> None:
        final = isinstance(msg, RequestFailed) or msg.final
        with self._lock:
            entry = self._pending.get(msg.request_id)
            if entry is not None and final:
                del self._pending[msg.request_id]
                free_own_block(self._arena, entry[1])
            if self._traces and msg.request_id in self._traces:
                self._trace_answer(msg, final)
        for block in self._shared.arrived(msg):
            free_block(self._cache.get(block.segment), block)
        if isinstance(msg, RequestFailed) or msg.error is not None:
            assert msg.error is not None
            response = _error_response(msg.error.message, int(msg.error.code))
            if isinstance(msg, InferResponse):
                self._release(msg)
        else:
            response = self._read_outputs(msg)
        if entry is None:
            return
        if isinstance(msg, InferResponse) and msg.empty:
            response = pb_utils.InferenceResponse([])
        entry[0](response, final)

    def _trace_answer(self, msg: InferResponse | RequestFailed, final: bool) -> None:
        """A traced BLS request's answer (lock held): its events; the final one finishes
        its child trace into the parent's list (dropped if the parent finished first)."""
        child = self._traces[msg.request_id]
        if isinstance(msg, InferResponse):
            child.stamps.append(("INFER_RESPONSE_COMPLETE", time.monotonic_ns()))
            if msg.trace is not None:
                child.stamps.extend(msg.trace.stamps)
                child.tensors.extend(msg.trace.tensors)
                child.children.extend(msg.trace.children)
        if not final:
            return
        del self._traces[msg.request_id]
        child.stamps.append(("REQUEST_END", time.monotonic_ns()))
        siblings = self._child_traces.get(child.parent)
        if siblings is not None:
            siblings.append(
                ChildTrace(
                    child.model,
                    child.version,
                    child.request_id,
                    tuple(child.stamps),
                    tuple(child.tensors),
                    tuple(child.children),
                )
            )

    def _read_outputs(self, msg: InferResponse) -> pb_utils.InferenceResponse:
        """Copy the outputs out of the callee's arena, then free its block."""
        tensors = []
        try:
            for ref in msg.outputs:
                arr = view_tensor(self._cache, ref)
                if ref.datatype != "BYTES":
                    arr = arr.copy()
                tensors.append(pb_utils.Tensor(ref.name, arr))
        finally:
            self._release(msg)
        return pb_utils.InferenceResponse(tensors, parameters=msg.parameters_json or None)

    def _release(self, msg: InferResponse) -> None:
        """Free a response's blocks (receive thread); a block sibling responses of an
        ensemble share is freed after the last of them (``ipc.tensor_pool.SharedBlocks``)."""
        for block in self._shared.released(msg):
            free_block(self._cache.get(block.segment), block)

    def close(self) -> None:
        """Nothing to join: the receiver is a daemon thread that ends with the process."""


class _OpenChild:
    """A traced BLS request in flight: what its child trace will hold."""

    __slots__ = ("children", "model", "parent", "request_id", "stamps", "tensors", "version")

    def __init__(
        self,
        parent: tuple[ReplyTo, int],
        model: str,
        version: int,
        request_id: str,
        start_ns: int,
    ) -> None:
        self.parent = parent
        self.model = model
        self.version = version
        self.request_id = request_id
        self.stamps: list[tuple[str, int]] = [("REQUEST_START", start_ns)]
        self.tensors: list[TensorTrace] = []
        self.children: list[ChildTrace] = []


def _error_response(message: str, code: int) -> pb_utils.InferenceResponse:
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))
