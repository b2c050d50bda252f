"""The Python side of the in-process handoff (``handoff.cc``, its twin): ModelInfer and
ModelStreamInfer calls that the native server took on the public port, served by the Python
handlers without grpc.aio.

Imported by ``frontend.native.public_port``. The native completion-queue thread queues each
unary call's request bytes and metadata, and each stream's opening metadata, request
messages and half-close, and makes an eventfd readable; this event loop takes everything
queued per wake-up (``_native.take``), in order:

- a unary call's request comes split by the native side (``request_split.cc``, the twin
  of ``wire._scan``: its raw tensor entries, the message without them and its key), so
  Python only assembles it (``InferenceServicer.parse_split``);
- a unary call whose request the frontend knows (``InferenceServicer.submit_known``: the
  checks passed for its wire key before, no tracing, no forwarded headers) is submitted
  right there, without a task: the ticket's answer ends the call with the serialized
  ModelInferResponse or the status of its error (``_native.reply``), and the requests taken
  at once wake the scheduler once (``Inference.wakes_held``). The same words as the handler's:
  ``ModelInfer`` calls the same ``submit_known`` first;
- any other unary call runs ``InferenceServicer.ModelInfer`` in a task with ``_Context`` in
  place of grpc.aio's context, and is ended with the serialized ModelInferResponse or the
  status it aborted with (``_native.reply``);
- a stream runs ``InferenceServicer.ModelStreamInfer`` in a task on ``_Requests`` (the
  request messages as they arrive, parsed as grpc.aio's stream handler parses them, until
  the half-close); each response it yields is serialized and written (``_native.write``,
  sent in that order), and its end, OK or the status it aborted with (``triton_grpc_error``),
  ends the call (``_native.reply``).

Answers leave once per event-loop pass: ``reply`` and ``write`` only queue them, and one
``_native.kick`` at the end of the pass (the loop's ``PollingSelector.at_pass_end``, before
it polls or waits again; on another loop, ``loop.call_soon``) hands them all to gRPC from
this thread (under the native server's serial lock: a ``grpc::Alarm`` per answer, to wake
the native thread, was most of a stream response's cost).

A call the client abandons (cancel, deadline, server stop) arrives as a cancellation and
cancels the task, as grpc.aio cancels a handler. So the handlers, their checks, their words
and their tracing are the ones ``--grpc-frontend python`` runs; only grpc.aio's per-call and
per-message machinery is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractContextManager
from functools import partial
from typing import Any, Protocol

import grpc
from google.protobuf.message import DecodeError

from triton_mp._proto import grpc_service_pb2 as pb
from triton_mp.common.errors import TritonMPError
from triton_mp.common.process.log import watch_debug
from triton_mp.frontend.dispatch.known_requests import Received
from triton_mp.frontend.dispatch.polling_loop import PollingSelector
from triton_mp.frontend.dispatch.ticket import InferResult, Ticket
from triton_mp.frontend.grpc.wire import MALFORMED, Split, WireInferRequest, tolerant
from triton_mp.frontend.native.known_calls import KnownCalls, Reply
from triton_mp.frontend.native.reply_status import code_of, failed, unexpected

CALL, OPEN, MESSAGE, END, GONE, KNOWN, LOST, ACCEPTED = range(8)
"""What a taken entry is (``handoff.h`` ItemKind): a unary call (data, metadata), a stream's
opening (metadata), its next request message (data), its half-close, a call gone before
Python ended it, a known call the native side submitted itself (data: ``KnownSent``), a
known call whose direct handoff took a lease and then found a ring full past its timeout
(neither: it fails as ``DirectRoutes.hand``'s ``ChannelTimeout`` fails Python's), and, while
DEBUG is on (``known_log``), a known call the native side submitted (data: ``KnownSent``,
owned or not): only its per-request DEBUG line (``KnownCalls.log_accepted``)."""


class Native(Protocol):
    """The extension's handoff functions (``module.cc``)."""

    def handoff_fd(self) -> int: ...
    def take(self) -> list[tuple[int, int, Any, Any, Split | None]]: ...
    def reply(
        self, call_id: int, code: int, details: str, data: bytes | Sequence[bytes | memoryview]
    ) -> bool: ...
    def write(self, call_id: int, data: bytes) -> bool: ...
    def kick(self) -> None: ...
    def known_log(self, on: bool, /) -> bool: ...


class Servicer(Protocol):
    """What the handoff needs of ``frontend.grpc.servicer.InferenceServicer``."""

    def parse_split(self, data: bytes, split: Split | None) -> Any: ...
    def submit_known(self, request: WireInferRequest, in_task: bool = True) -> Ticket | None: ...
    def response_bytes(self, result: InferResult) -> bytes: ...
    def wakes_held(self) -> AbstractContextManager[None]: ...
    async def ModelInfer(self, request: Any, context: Any) -> bytes: ...  # noqa: N802
    def ModelStreamInfer(  # noqa: N802
        self, request_iterator: Any, context: Any
    ) -> AsyncIterator[pb.ModelStreamInferResponse]: ...


class Aborted(Exception):
    """``_Context.abort``: the handler ended the call with a status."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(code, details)
        self.code = code
        self.details = details


class _Context:
    """The part of ``grpc.aio.ServicerContext`` ModelInfer uses: its metadata, abort, and a
    callback once the response is handed to the native server."""

    __slots__ = ("_metadata", "callbacks")

    def __init__(self, metadata: Sequence[tuple[str, str | bytes]]) -> None:
        self._metadata = metadata
        self.callbacks: list[Callable[[Any], None]] = []

    def invocation_metadata(self) -> Sequence[tuple[str, str | bytes]]:
        return self._metadata

    async def abort(self, code: grpc.StatusCode, details: str = "", *_: object) -> None:
        raise Aborted(code, details)

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        self.callbacks.append(callback)


class _Requests:
    """A handed-off stream's request messages, as grpc.aio's ``request_iterator`` gives
    them: each parsed (``MALFORMED`` for one that does not parse), until the half-close.

    Args:
        parse: the stream's request deserializer (``wire.tolerant``).
    """

    __slots__ = ("_ended", "_parse", "_queue", "_waiter")

    def __init__(self, parse: Callable[[bytes], Any]) -> None:
        self._parse = parse
        self._queue: deque[bytes] = deque()
        self._ended = False
        self._waiter: asyncio.Future[None] | None = None

    def put(self, data: bytes) -> None:
        """The next message, as read."""
        self._queue.append(data)
        self._wake()

    def end(self) -> None:
        """The client half-closed: the iteration ends after the queued messages."""
        self._ended = True
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def __aiter__(self) -> _Requests:
        return self

    async def __anext__(self) -> Any:
        while not self._queue:
            if self._ended:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._parse(self._queue.popleft())


class Handoff:
    """Serves the native server's handed-off ModelInfer calls on this event loop.

    Args:
        native: the extension module (its handoff functions).
        servicer: the frontend's InferenceServicer.
        known_calls: builds the known calls' fast lane from this handoff's reply
            (``frontend.native.known_calls``); None: known calls take the ticket's path.
    """

    def __init__(
        self,
        native: Native,
        servicer: Servicer,
        known_calls: Callable[[Reply], KnownCalls] | None = None,
    ) -> None:
        self._native = native
        self._servicer = servicer
        self._known = None if known_calls is None else known_calls(self._reply)
        self._parse_stream = tolerant(pb.ModelInferRequest.FromString)
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._unary: dict[int, Ticket] = {}
        """Calls submitted without a task (``_call``), by id, until their answer."""
        self._streams: dict[int, _Requests] = {}
        self._stash: list[tuple[int, int, Any, Any, Split | None]] = []
        """Entries ``pull_known`` took and left for the next ``on_wakeup`` (every kind but
        KNOWN, in order)."""
        self._fd = -1
        self._loop: asyncio.AbstractEventLoop | None = None
        self._kick_due = False
        self._at_pass_end = False
        """The loop's selector kicks at each pass end (``start``)."""
        self.lost: Callable[[], TritonMPError] | None = None
        """The error a LOST call fails with (``Sender.full_error`` of the ring to the
        scheduler: UNAVAILABLE, the words of Python's own hand when that ring stays full)."""
        self._unwatch: Callable[[], None] | None = None
        """Stops ``watch_debug``'s calls of ``known_log`` (``start``)."""
        self.release_owned: Callable[[], int] | None = None
        """Queues the calls the native side kept (``known_answers.NativeAnswers.release``):
        ``pull_known`` calls it first."""

    @property
    def known_calls(self) -> KnownCalls | None:
        """The known calls' fast lane (None: known calls take the ticket's path)."""
        return self._known

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Watch the native server's eventfd on ``loop`` (after the native server started);
        kick at the end of each pass when its selector offers it (``_answered``)."""
        self._fd = self._native.handoff_fd()
        self._loop = loop
        if self._known is not None:
            # NOTE: an answer read before its call was taken (``pull_known``).
            self._known.pending.on_unknown = self.pull_known
            # NOTE: the known calls' per-request DEBUG line (ACCEPTED) while DEBUG is on.
            self._unwatch = watch_debug(self._native.known_log)
        loop.add_reader(self._fd, self.on_wakeup)
        # NOTE: the frontend's loop (frontend.main) is a SelectorEventLoop on a PollingSelector.
        selector = getattr(loop, "_selector", None)
        if isinstance(selector, PollingSelector) and not self._at_pass_end:
            selector.at_pass_end(self._kick_if_due)
            self._at_pass_end = True

    def stop(self) -> None:
        """Stop watching (after the native server stopped: nothing more is queued)."""
        if self._loop is not None and self._fd >= 0:
            self._loop.remove_reader(self._fd)
        if self._known is not None:
            self._known.pending.on_unknown = None
        if self._unwatch is not None:
            self._unwatch()
            self._unwatch = None
        self._fd = -1

    def answered(self) -> None:
        """Answers were queued outside ``_reply`` (natively): kick at the pass end."""
        if not self._kick_due:
            self._answered()

    def _answered(self) -> None:
        """An answer was queued: kick the native side once, at the end of this pass (the
        selector's pass end, or a ``call_soon`` of its own: a pass more)."""
        if not self._kick_due:
            self._kick_due = True
            if not self._at_pass_end:
                assert self._loop is not None
                self._loop.call_soon(self._kick)

    def _kick(self) -> None:
        self._kick_due = False
        self._native.kick()

    def _kick_if_due(self) -> None:
        """The loop's pass ended: kick if an answer was queued in it."""
        if self._kick_due:
            self._kick()

    def _reply(
        self, call_id: int, code: int, details: str, data: bytes | Sequence[bytes | memoryview]
    ) -> None:
        """End ``call_id`` (``data``: the response, or its parts: copied before this
        returns)."""
        self._native.reply(call_id, code, details, data)
        if not self._kick_due:  # NOTE: ``_answered``, inlined: once per known call
            self._answered()

    def pull_known(self) -> bool:
        """Register the known calls the native side submitted and queued since the last
        take (``PendingTable.on_unknown``: an answer can be read before ``on_wakeup`` took
        its call); the other entries wait for ``on_wakeup``, in order. True when some were
        registered.

        NOTE: the eventfd stays readable for what is left: the first entry taken here was
        queued on an empty queue, which wrote the eventfd after the last take, and only
        ``on_wakeup`` reads it, taking right after."""
        if self.release_owned is not None:
            self.release_owned()
        items = self._native.take()
        if not items or self._known is None:
            self._stash.extend(items)
            return False
        registered = self._known.register(items)
        self._stash.extend(item for item in items if item[1] != KNOWN)
        return registered > 0

    def on_wakeup(self) -> None:
        """Take every queued entry, in order: register the known calls the native side
        submitted (first: an answer of this pass may be theirs), then serve, start, feed or
        cancel the calls."""
        with contextlib.suppress(BlockingIOError):
            os.read(self._fd, 8)
        assert self._loop is not None
        items = self._native.take()
        if self._stash:
            items = self._stash + items
            self._stash = []
        if self._known is not None:
            self._known.register(items)
        # NOTE: the requests taken at once wake the scheduler once, after the last.
        with self._servicer.wakes_held():
            for call_id, kind, data, metadata, split in items:
                if kind == KNOWN:  # NOTE: registered above; nearly every entry at c=16
                    continue
                if kind == ACCEPTED:
                    if self._known is not None:
                        self._known.log_accepted(data)
                    continue
                if kind == CALL:
                    self._call(call_id, data, metadata, split)
                elif kind == MESSAGE:
                    stream = self._streams.get(call_id)
                    if stream is not None:
                        stream.put(data)
                elif kind == OPEN:
                    requests = self._streams[call_id] = _Requests(self._parse_stream)
                    coro = self.serve_stream(call_id, requests, metadata)
                    self._tasks[call_id] = self._loop.create_task(coro)
                elif kind == END:
                    stream = self._streams.get(call_id)
                    if stream is not None:
                        stream.end()
                elif kind == LOST:
                    self._lost(call_id)
                else:  # GONE
                    self._gone(call_id)

    def _lost(self, call_id: int) -> None:
        """A LOST call: failed as Python's hand fails it when a ring stays full."""
        lost = self.lost
        if lost is None:  # NOTE: never: C++ submits known calls only where it is set
            self._reply(call_id, *unexpected(RuntimeError("a direct handoff was lost")), b"")
            return
        self._reply(call_id, *failed(lost()), b"")

    def _gone(self, call_id: int) -> None:
        """The client abandoned the call: cancel its ticket or its task."""
        self._streams.pop(call_id, None)
        if self._known is not None and self._known.cancel(call_id):
            return
        ticket = self._unary.pop(call_id, None)
        if ticket is not None:
            ticket.cancel()
        task = self._tasks.pop(call_id, None)
        if task is not None:
            task.cancel()

    def _call(
        self,
        call_id: int,
        data: bytes | Received,
        metadata: Sequence[tuple[str, str | bytes]],
        split: Split | None = None,
    ) -> None:
        """One unary call (``split``: the native server's split of ``data``, or None): a
        known request submitted now (``_answer`` ends it), any other served by the
        ModelInfer handler in a task."""
        assert self._loop is not None
        try:
            if self._known is not None and self._known.submit(call_id, data, split):
                return
            if not isinstance(data, bytes):  # NOTE: a Received (large entries): parsed as bytes
                data = data.tobytes()
            try:
                request = self._servicer.parse_split(data, split)
            except DecodeError:
                request = MALFORMED  # NOTE: as ``wire.tolerant``
            ticket = (
                self._servicer.submit_known(request, in_task=False)
                if isinstance(request, WireInferRequest)
                else None
            )
        except TritonMPError as e:
            self._reply(call_id, *failed(e), b"")
            return
        except Exception as e:  # noqa: BLE001 - grpc.aio's answer to a handler's exception
            self._reply(call_id, *unexpected(e), b"")
            return
        if ticket is None:
            self._tasks[call_id] = self._loop.create_task(self.serve(call_id, request, metadata))
            return
        self._unary[call_id] = ticket
        ticket.on_answer(partial(self._answer, call_id))

    def _answer(self, call_id: int, ticket: Ticket) -> None:
        """The answer of a call ``_call`` submitted: its response, or its error's status."""
        if self._unary.pop(call_id, None) is None:
            ticket.cancel()  # NOTE: answered already: nothing more is kept
            return
        try:
            data = self._servicer.response_bytes(ticket.take_result())
        except TritonMPError as e:
            self._reply(call_id, *failed(e), b"")
        except Exception as e:  # noqa: BLE001 - grpc.aio's answer to a handler's exception
            self._reply(call_id, *unexpected(e), b"")
        else:
            self._reply(call_id, 0, "", data)

    async def serve(
        self, call_id: int, request: Any, metadata: Sequence[tuple[str, str | bytes]]
    ) -> None:
        """One call: the ModelInfer handler on ``request`` (parsed), its answer replied."""
        context = _Context(metadata)
        try:
            response = await self._servicer.ModelInfer(request, context)
            self._reply(call_id, 0, "", response)
        except Aborted as e:
            self._reply(call_id, code_of(e.code), e.details, b"")
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - grpc.aio's answer to a handler's exception
            self._reply(call_id, *unexpected(e), b"")
        finally:
            self._tasks.pop(call_id, None)
        for callback in context.callbacks:
            callback(context)

    async def serve_stream(
        self, call_id: int, requests: _Requests, metadata: Sequence[tuple[str, str | bytes]]
    ) -> None:
        """One stream: the ModelStreamInfer handler on ``requests``, each response written
        as it comes, then the stream's end."""
        write = self._native.write
        try:
            async for response in self._servicer.ModelStreamInfer(requests, _Context(metadata)):
                write(call_id, response.SerializeToString())
                self._answered()
            self._reply(call_id, 0, "", b"")
        except Aborted as e:
            self._reply(call_id, code_of(e.code), e.details, b"")
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - grpc.aio's answer to a handler's exception
            self._reply(call_id, *unexpected(e), b"")
        finally:
            self._tasks.pop(call_id, None)
            self._streams.pop(call_id, None)
