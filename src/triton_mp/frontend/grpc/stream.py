"""Triton's bidirectional ``ModelStreamInfer``: many requests, their responses as they come.

Imported by ``frontend.grpc.servicer``. Per request, one response (or ``error_message``), or
for a decoupled model zero or more responses then the end of the request; both come from the
request's ``Ticket`` (``Inference.submit``), which one task per request iterates.

Requests are submitted in the order they arrive, so the requests of a sequence reach the
sequence batcher in order. Responses of a non-decoupled model (and refusals at submit, but
those of a decoupled model's requests) leave in request order, as Triton's stream handler
writes them (``grpc/infer_handler``: each such request waits until the one before it was
written); a decoupled model's responses leave as they complete. An invalid request gets an
``error_message`` with its id alone and the stream goes on, as in Triton. Every other
response carries ``triton_final_response``; a decoupled request's flags-only end is sent as
an empty response only when the request set ``triton_enable_empty_final_response``; the
responses the frontend builds itself (that one, a model's error) carry the request's
``model_name`` and ``model_version`` strings as sent. With the call's ``triton_grpc_error:
true`` metadata, a model's error ends the whole stream with its status instead
(``StreamAborted``; refusals stay in the stream). When the client closes its side, or sends
a message that does not parse (Triton stops reading there), the stream ends after every
request's last response; when it cancels, every open ticket is cancelled (queued requests
are dropped, running decoupled ones see ``is_cancelled()``) and their remaining responses
are freed unsent.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterable, AsyncIterator, Coroutine, Sequence
from dataclasses import replace
from typing import Any

from triton_mp._proto import grpc_service_pb2 as pb
from triton_mp.common.errors import TritonMPError
from triton_mp.frontend.dispatch.ticket import Response, Ticket
from triton_mp.frontend.grpc.messages import (
    request_from_proto,
    stream_end,
    stream_error,
    stream_refusal,
    stream_response,
)
from triton_mp.frontend.grpc.wire import Malformed
from triton_mp.frontend.inference import Inference
from triton_mp.frontend.request import InferenceRequest, ParameterType
from triton_mp.frontend.tracing.tracer import Trace, Tracer
from triton_mp.frontend.validation.parameters import EMPTY_FINAL_PARAMETER


def wants_empty_final(request: InferenceRequest) -> bool:
    """Whether the request set ``triton_enable_empty_final_response`` to true."""
    p = request.parameters.get(EMPTY_FINAL_PARAMETER)
    return p is not None and p.type is ParameterType.BOOL and bool(p.value)


GRPC_ERROR_METADATA = "triton_grpc_error"
"""Call metadata: "true" makes a model's error end the stream with its gRPC status (server
``infer_handler.h`` ExtractStateFromHeaders; the exact value "true", nothing else)."""


def wants_grpc_error(metadata: Sequence[tuple[str, str | bytes]]) -> bool:
    """Whether a call's metadata sets ``triton_grpc_error`` to "true"."""
    return any(k == GRPC_ERROR_METADATA and v == "true" for k, v in metadata)


class StreamAborted(TritonMPError):
    """A model's error that ends the stream (``triton_grpc_error`` mode): the servicer ends
    the call with its code's gRPC status and its message (server
    ``stream_infer_handler.cc`` StreamInferResponseComplete, WriteGRPCErrorResponse)."""


class _Origin:
    """What a request sent that the frontend's own responses echo: its ``model_name``,
    ``model_version`` (as strings, "" when absent) and ``id``."""

    __slots__ = ("id", "model", "version")

    def __init__(self, request: InferenceRequest) -> None:
        self.model = request.model_name
        self.version = request.model_version
        self.id = request.id


def _stream_item(
    origin: _Origin, response: Response, empty_final: bool
) -> pb.ModelStreamInferResponse | None:
    """What the stream sends for one response of a request (None: nothing)."""
    if response.error is not None:
        return stream_error(
            response.error.message, origin.model, origin.version, origin.id, response.final
        )
    if response.result is not None:
        return stream_response(response.result, response.final)
    return stream_end(origin.model, origin.version, origin.id) if empty_final else None


class _Item:
    """A traced request's message for the stream (None: nothing to send, only the end of
    the trace), with its trace and whether it is that request's last message."""

    __slots__ = ("last", "message", "trace")

    def __init__(
        self, message: pb.ModelStreamInferResponse | None, trace: Trace, last: bool
    ) -> None:
        self.message = message
        self.trace = trace
        self.last = last


class StreamSession:
    """One ``ModelStreamInfer`` call.

    Args:
        inference: the frontend's submit path.
        requests: the client's ``ModelInferRequest`` stream (``wire.MALFORMED`` for a message
            that does not parse: the stream stops reading there).
        tracer: samples the stream's requests; each traced response is stamped
            GRPC_SEND_START when queued and GRPC_SEND_END once written.
        parent_context: the call's W3C ``traceparent`` ("" when absent).
        headers: the call's metadata ``--grpc-header-forward-pattern`` selected, forwarded
            with each request of the stream.
        grpc_error: the call set ``triton_grpc_error: true`` (``wants_grpc_error``).
    """

    def __init__(
        self,
        inference: Inference,
        requests: AsyncIterable[pb.ModelInferRequest | Malformed],
        tracer: Tracer | None = None,
        parent_context: str = "",
        headers: Sequence[tuple[str, str]] = (),
        grpc_error: bool = False,
    ) -> None:
        self._inference = inference
        self._grpc_error = grpc_error
        self._headers = tuple(headers)
        self._requests = requests
        self._tracer = tracer if tracer is not None else Tracer.off()
        self._parent_context = parent_context
        self._out: asyncio.Queue[pb.ModelStreamInferResponse | _Item | StreamAborted | None] = (
            asyncio.Queue()
        )
        """Untraced messages as they are, traced ones wrapped in ``_Item``; a
        ``StreamAborted`` ends the stream."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._open: set[Ticket] = set()
        self._turn: asyncio.Future[None] | None = None
        """Done once the last ordered (non-decoupled or refused) request's messages are
        queued; the next ordered request waits for it."""

    async def responses(self) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """The stream's responses, until the client's side ended and every request's last
        response was sent; cancels what is still open when the call ends.

        Raises:
            StreamAborted: a model's error in ``triton_grpc_error`` mode (nothing more is
                sent; what is open is cancelled).
        """
        reader = asyncio.create_task(self._read())
        try:
            while (item := await self._out.get()) is not None:
                if type(item) is StreamAborted:
                    raise item
                if type(item) is not _Item:
                    yield item  # type: ignore[misc]
                    continue
                if item.message is not None:
                    yield item.message
                    item.trace.stamp("GRPC_SEND_END")
                if item.last:
                    self._tracer.finish(item.trace)
            await reader
        finally:
            reader.cancel()
            for task in list(self._tasks):
                task.cancel()
            # NOTE: directly, not only through the tasks: a task cancelled before it first
            # ran never enters its ``finally``.
            for ticket in list(self._open):
                ticket.cancel()

    async def _read(self) -> None:
        async for message in self._requests:
            if isinstance(message, Malformed):
                break  # NOTE: Triton stops reading at a message that does not parse
            read_ns = time.monotonic_ns() if self._tracer.active else 0
            self._submit(message, read_ns)
        while self._tasks:
            await asyncio.gather(*list(self._tasks))
        self._out.put_nowait(None)

    def _submit(self, message: pb.ModelInferRequest, read_ns: int = 0) -> None:
        """Submit one request; its refusal is sent at once, its answers by a task."""
        request = request_from_proto(message)
        if self._headers:
            request = replace(request, headers=self._headers)
        trace: Trace | None = None
        if read_ns:
            trace = self._tracer.sample(
                request.model_name, request.id, parent_context=self._parent_context
            )
            if trace is not None:
                trace.stamp("GRPC_WAITREAD_START", read_ns)
                trace.stamp("GRPC_WAITREAD_END")
        try:
            ticket = self._inference.submit(request, trace=trace)
        except TritonMPError as e:
            error = stream_refusal(e.message, message.id)
            if trace is not None:
                trace.stamp("GRPC_SEND_START")
            item = error if trace is None else _Item(error, trace, True)
            if self._turn is None or self._turn.done() or self._for_decoupled(request):
                self._out.put_nowait(item)
                return
            self._start(self._refuse(item, *self._take_turn()))
            return
        self._open.add(ticket)
        turn = (None, None) if ticket.decoupled else self._take_turn()
        self._start(self._answer(ticket, _Origin(request), wants_empty_final(request), *turn))

    def _for_decoupled(self, request: InferenceRequest) -> bool:
        """Whether a refused request names a decoupled model that serves: its refusal
        leaves at once, not in request order (``stream_infer_handler.cc`` Process queues
        only a non-decoupled request's response, and a request whose model it cannot
        find counts as non-decoupled)."""
        try:
            target = self._inference.admit(request.model_name, request.model_version)
        except TritonMPError:
            return False
        return target.model.decoupled

    def _start(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _take_turn(self) -> tuple[asyncio.Future[None] | None, asyncio.Future[None]]:
        """(the previous ordered request's turn, this one's) for an ordered request."""
        before, mine = self._turn, asyncio.get_running_loop().create_future()
        self._turn = mine
        return before, mine

    async def _refuse(
        self,
        item: pb.ModelStreamInferResponse | _Item,
        before: asyncio.Future[None] | None,
        mine: asyncio.Future[None],
    ) -> None:
        """Queue a refusal once the ordered requests before it were queued."""
        try:
            if before is not None:
                await before
            self._out.put_nowait(item)
        finally:
            if not mine.done():
                mine.set_result(None)

    async def _answer(
        self,
        ticket: Ticket,
        origin: _Origin,
        empty_final: bool,
        before: asyncio.Future[None] | None = None,
        mine: asyncio.Future[None] | None = None,
    ) -> None:
        """Send every response of one request; an ordered one (``mine`` given) holds its
        messages until ``before`` is done, then marks ``mine`` done."""
        held: list[pb.ModelStreamInferResponse | _Item] = []
        put = self._out.put_nowait if mine is None else held.append
        try:
            async for response in ticket:
                if response.error is not None and self._grpc_error:
                    # NOTE: at once, ahead of any held response (Triton finishes the call
                    # from the response callback).
                    error = response.error
                    self._out.put_nowait(StreamAborted(error.message, error.code))
                    return
                item = _stream_item(origin, response, empty_final)
                trace = ticket.trace
                if item is not None:
                    if trace is None:
                        put(item)
                    else:
                        trace.stamp("GRPC_SEND_START")
                        put(_Item(item, trace, response.final))
                elif response.final and trace is not None:
                    # NOTE: through the queue: the trace ends after its last message left.
                    put(_Item(None, trace, True))
            if before is not None:
                await before
            for message in held:
                self._out.put_nowait(message)
        finally:
            ticket.cancel()  # NOTE: after the final response, this only closes the ticket
            self._open.discard(ticket)
            if mine is not None and not mine.done():
                mine.set_result(None)
