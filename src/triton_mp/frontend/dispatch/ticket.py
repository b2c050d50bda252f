"""A submitted request's handle: iterate it for responses, cancel it; it owns their blocks.

Imported by the frontend only; no transport. ``frontend.inference.Inference.submit`` returns
a ``Ticket`` for every request, unary or decoupled alike. The pending table hands it the
request's answers (``deliver``, loop thread); ``async for response in ticket`` yields them
as ``Response``s until the final one (a unary request has exactly one), and
``await ticket.result()`` is the one answer of a unary request, raising its error.

Block ownership: the frontend's input block is freed by the pending table after the
request's last answer. Each response's output block (a worker's) belongs to the ticket
until it hands the response out, then to the ``InferResult``, whose ``release`` frees it.
After ``cancel`` (the client went away, or the caller was cancelled while waiting) the
ticket frees every response it still holds and every one that arrives later, and the
scheduler is told to drop the request if it has not run yet (``CancelRequest``; a running
decoupled model sees ``is_cancelled()``).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from dataclasses import dataclass

from triton_mp.common.errors import ErrorCode, TritonMPError
from triton_mp.frontend.classification import Classify, top_k
from triton_mp.frontend.dispatch.pending import Answer, PendingTable
from triton_mp.frontend.tracing.tracer import Trace
from triton_mp.ipc import SegmentCache, TensorRef
from triton_mp.ipc.protocol.messages import QUEUED_ORIGIN, InferResponse, RequestFailed

_LOCAL = "<frontend>"
"""The segment name of an output made in the frontend (no arena has it: a "/" begins those,
and a cache hit's segments are named by the cache)."""


class InferResult:
    """A worker's successful answer: output tensors still in the worker's arena.

    The transport copies each output out (``view``) into its response, then calls
    ``release`` exactly once, which frees the worker's output block.

    Attributes:
        model: the model's name.
        version: the concrete version that ran.
        request_id: the client's request ``id`` ("" when it sent none).
        outputs: one ``TensorRef`` per returned output, in the order they are returned.
        parameters_json: the response's parameters (a JSON object of str -> bool/int/str,
            ``InferResponse.parameters_json``); "" for none.
    """

    __slots__ = (
        "_answer",
        "_cache",
        "_local",
        "_pending",
        "model",
        "outputs",
        "parameters_json",
        "request_id",
        "version",
    )

    def __init__(
        self,
        *,
        model: str,
        version: int,
        request_id: str,
        outputs: tuple[TensorRef, ...],
        answer: InferResponse | None,
        cache: SegmentCache,
        pending: PendingTable,
        parameters_json: str = "",
    ) -> None:
        self.model = model
        self.parameters_json = parameters_json
        self.version = version
        self.request_id = request_id
        self.outputs = outputs
        self._answer = answer
        self._cache = cache
        self._pending = pending
        self._local: dict[str, bytes] = {}
        """Outputs made here (classification), by name: their refs name ``_LOCAL``."""

    def classify(
        self, counts: dict[str, int], batched: bool, labels: dict[str, tuple[str, ...]]
    ) -> None:
        """Replace each output in ``counts`` (name -> ``classification``) by its top-k
        classes (``frontend.classification.top_k``).

        Raises:
            TritonMPError: INVALID_ARG for an output whose datatype has no classes.
        """
        outputs = list(self.outputs)
        for i, ref in enumerate(outputs):
            count = counts.get(ref.name)
            if count is None or ref.region_id:
                continue
            data, shape = top_k(
                self._bytes(ref), ref.datatype, ref.shape, count, batched, labels.get(ref.name, ())
            )
            self._local[ref.name] = data
            outputs[i] = TensorRef(ref.name, "BYTES", shape, _LOCAL, 0, len(data))
        self.outputs = tuple(outputs)

    def _bytes(self, ref: TensorRef) -> memoryview:
        if not ref.nbytes:
            # NOTE: a group whose outputs are all empty names no block (segment "",
            # workers.tensors.answer_batch): nothing to attach. A new view each time: a
            # caller may release it.
            return memoryview(b"")
        return memoryview(self._cache.get(ref.segment).buf)[ref.offset : ref.offset + ref.nbytes]

    def view(self, ref: TensorRef) -> memoryview | None:
        """The bytes of one output without a copy, valid until ``release``; None when the
        worker wrote the output into the client's registered shared memory instead."""
        if ref.region_id:
            return None
        if ref.segment == _LOCAL:
            return memoryview(self._local[ref.name])
        self._pending.copied_bytes["out"] += ref.nbytes
        return self._bytes(ref)

    def data(self, ref: TensorRef) -> bytes:
        """A copy of one output's bytes (``b""`` for an output in the client's shared
        memory, as Triton sends)."""
        if ref.region_id:
            return b""
        if ref.segment == _LOCAL:
            return self._local[ref.name]
        if not ref.nbytes:
            return b""  # NOTE: no block may be named (_bytes)
        self._pending.copied_bytes["out"] += ref.nbytes
        return self._cache.get(ref.segment).buf[ref.offset : ref.offset + ref.nbytes]

    def release(self) -> None:
        """Free the worker's output block(s) (views taken before become invalid); a block
        sibling responses share is freed after the last of them (``PendingTable.release``)."""
        answer, self._answer = self._answer, None
        if answer is not None:
            self._pending.release(answer)


class ResponseError(TritonMPError):
    """An error a response carries: the one the model's backend made for this request
    (``InferResponse.error``), or the scheduler's failure of a queued request (its
    ``QUEUED_ORIGIN``: a queue timeout, a dead instance). Triton's HTTP frontend answers it
    from ``FinalizeResponse``, before it names a ``Content-Type`` (``frontend.http.routes``:
    text/plain)."""


@dataclass(frozen=True, slots=True)
class Response:
    """One response of a ticket: outputs, an error, or (decoupled) the bare end.

    Attributes:
        final: the request's last response.
        version: the model version that answered.
        result: the outputs (release it once copied out); None for an error or the end.
        error: the request's failure (its code and message); None otherwise.
    """

    final: bool
    version: int
    result: InferResult | None = None
    error: TritonMPError | None = None

    @property
    def empty(self) -> bool:
        """A decoupled request's flags-only final response: neither outputs nor error."""
        return self.result is None and self.error is None


class Ticket:
    """One submitted request (``Inference.submit``); iterate it for its responses.

    Args:
        request_id: the frontend's id of the request (``InferRequest.request_id``).
        model: the model's name; ``version``: the concrete version it was sent to.
        client_id: the client's request ``id``, echoed in every response.
        decoupled: the model is decoupled (zero or more responses, then a final one).
        cancel_request: tells the scheduler to drop the request (``CancelRequest``).
        cache: the attached arenas (for ``InferResult``); ``pending``: frees blocks.
        trace: the request's trace, or None (untraced).
        classify: outputs to answer as their top-k classes, or None.
    """

    __slots__ = (
        "_cache",
        "_cancel_request",
        "_classify",
        "_closed",
        "_ended",
        "_finished",
        "_notify",
        "_pending",
        "_queue",
        "_waiter",
        "client_id",
        "decoupled",
        "model",
        "request_id",
        "trace",
        "version",
    )

    def __init__(
        self,
        *,
        request_id: int,
        model: str,
        version: int,
        client_id: str,
        decoupled: bool,
        cancel_request: Callable[[], None],
        cache: SegmentCache,
        pending: PendingTable,
        trace: Trace | None = None,
        classify: Classify | None = None,
    ) -> None:
        self.request_id = request_id
        self._classify = classify
        """The outputs to answer as their top-k classes (the classification extension)."""
        self.trace = trace
        """The request's trace when it was sampled: each answer stamps it."""
        self.model = model
        self.version = version
        self.client_id = client_id
        self.decoupled = decoupled
        self._cancel_request = cancel_request
        self._cache = cache
        self._pending = pending
        self._queue: collections.deque[Response] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._finished = False
        """The final answer arrived: nothing more will."""
        self._ended = False
        """The final response was handed out: iteration stops."""
        self._closed = False
        """Cancelled: answers are freed, not kept."""
        self._notify: Callable[[Ticket], None] | None = None
        """``on_answer``'s callback, or None."""

    @property
    def finished(self) -> bool:
        """Whether the request's final answer has arrived."""
        return self._finished

    def deliver(self, answer: Answer) -> None:
        """The pending table's sink: keep one answer for the iterator (loop thread)."""
        if self._closed:
            if isinstance(answer, InferResponse):
                self._pending.release(answer)
            return
        response = self._response(answer)
        if self.trace is not None:
            self._stamp(answer, response.final)
        if response.final:
            self._finished = True
        self._queue.append(response)
        notify = self._notify
        if notify is not None:
            notify(self)
            return
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def on_answer(self, notify: Callable[[Ticket], None]) -> None:
        """Call ``notify(self)`` on the loop thread as each answer arrives (once already
        if one is waiting), instead of waking an awaiting ``result``: a unary call served
        without a task takes it with ``take_result``. Not after ``cancel``."""
        self._notify = notify
        if self._queue:
            notify(self)

    def _stamp(self, answer: Answer, final: bool) -> None:
        """INFER_RESPONSE_COMPLETE per response, the other processes' events, REQUEST_END
        with the final answer."""
        trace = self.trace
        assert trace is not None
        if isinstance(answer, InferResponse):
            if not answer.empty or not final:
                trace.stamp("INFER_RESPONSE_COMPLETE")
            if answer.trace is not None:
                trace.absorb(answer.trace)
        if final:
            trace.stamp("REQUEST_END")

    def _response(self, answer: Answer) -> Response:
        if isinstance(answer, RequestFailed):
            failure = answer.error
            kind = ResponseError if failure.origin == QUEUED_ORIGIN else TritonMPError
            return Response(
                final=True, version=self.version, error=kind(failure.message, failure.code)
            )
        final = answer.final or not self.decoupled
        if answer.error is not None:
            self._pending.release(answer)
            error = ResponseError(answer.error.message, answer.error.code)
            return Response(final=final, version=answer.version, error=error)
        if answer.empty and self.decoupled:
            self._pending.release(answer)
            return Response(final=final, version=answer.version)
        result = InferResult(
            model=self.model,
            version=answer.version,
            request_id=self.client_id,
            outputs=answer.outputs,
            answer=answer,
            cache=self._cache,
            pending=self._pending,
            parameters_json=answer.parameters_json,
        )
        if self._classify is not None:
            c = self._classify
            try:
                result.classify(c.counts, c.batched, c.labels)
            except TritonMPError as error:
                result.release()
                return Response(final=final, version=answer.version, error=error)
        return Response(final=final, version=answer.version, result=result)

    def __aiter__(self) -> Ticket:
        return self

    async def __anext__(self) -> Response:
        """The next response, waiting for it; StopAsyncIteration after the final one.

        Raises:
            asyncio.CancelledError: the caller was cancelled while waiting: the ticket is
                cancelled (``cancel``) first.
        """
        while not self._queue:
            if self._ended or self._closed:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            except asyncio.CancelledError:
                # NOTE: the client cancelled or its deadline passed: a request still queued
                # is dropped by the scheduler instead of running for nobody.
                self.cancel()
                raise
            finally:
                self._waiter = None
        response = self._queue.popleft()
        if response.final:
            self._ended = True
        return response

    async def result(self) -> InferResult:
        """The answer of a unary request: its outputs (the caller releases them).

        Raises:
            TritonMPError: the worker's or scheduler's error for this request; CANCELLED
                when the ticket was cancelled meanwhile.
            asyncio.CancelledError: as ``__anext__``.
        """
        # NOTE: __anext__ inline (one coroutine less per unary call).
        while not self._queue:
            if self._ended or self._closed:
                raise TritonMPError("the request was cancelled", ErrorCode.CANCELLED)
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            except asyncio.CancelledError:
                self.cancel()
                raise
            finally:
                self._waiter = None
        return self.take_result()

    def take_result(self) -> InferResult:
        """``result`` once an answer is queued (``on_answer`` said so): its outputs (the
        caller releases them).

        Raises:
            TritonMPError: the worker's or scheduler's error for this request.
        """
        response = self._queue.popleft()
        if response.final:
            self._ended = True
        if response.error is not None:
            raise response.error
        assert response.result is not None, "a unary response carries outputs or an error"
        return response.result

    def cancel(self) -> None:
        """Nobody wants the responses any more: free those held and those to come, and,
        unless the final one arrived, ask the scheduler to drop the request. Idempotent."""
        if self._closed:
            return
        self._closed = True
        while self._queue:
            response = self._queue.popleft()
            if response.result is not None:
                response.result.release()
        if not self._finished:
            self._cancel_request()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
