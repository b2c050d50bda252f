"""Requests and queries a frontend is waiting on, and delivery of their answers.

Imported by the frontend only. The event loop drains the inbox when its FIFO wakes it and
calls ``deliver`` with everything drained, on the loop thread. Each request has a *sink*
(its ``Ticket``'s ``deliver``) that gets its answers; the frontend frees its own input block
when a request's last answer arrives (by then the worker has stopped reading it), and frees
a worker's output block at once when nobody waits for it any more. An answer whose output
names the request's own input block (the worker answered it from there without a copy:
``TensorRef``'s rule in ``ipc.protocol.messages``) keeps that block until the response is
released (``release``), as its output block would be.

A unary request gets one answer. ``preserve_ordering`` (``dynamic_batching.preserve_ordering``):
a unary request registered with an ``order`` key joins that key's stream; its response is
held until every earlier request of the stream has been answered, so responses leave in the
order the requests arrived even when several instances finish out of order. Errors are
released at once (Triton answers rejections and timeouts outside the order too). Ordering is
per frontend process: one client connection is served by one frontend.

A request of a decoupled model (``streaming``) gets zero or more responses then a final one,
each handed to its sink as it arrives; the request (with its input block) is forgotten after
the final one (``InferResponse.final``, or a ``RequestFailed``).

``wait_idle`` lets the drain await the moment no request is pending any more.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass

from triton_mp.ipc import BlockRef, SegmentCache, free_block
from triton_mp.ipc.protocol.messages import (
    AnswerBatch,
    InferResponse,
    QueueReply,
    RequestFailed,
    StatsReply,
)
from triton_mp.ipc.tensor_pool import SegmentGone, SharedBlocks

log = logging.getLogger(__name__)

Answer = InferResponse | RequestFailed
"""What a request's sink receives."""
Sink = Callable[[Answer], None]
"""Gets a request's answers on the loop thread; owns each ``InferResponse.block``."""
_QUERY_REPLIES = (StatsReply, QueueReply)
"""``isinstance``'s tuple: a ``StatsReply | QueueReply`` union is built anew each time it
is evaluated (~0.4 µs per answer in ``deliver``)."""


def holding_sink(sink: Sink, release: Callable[[], None], streaming: bool) -> Sink:
    """``sink``, calling ``release`` first when the request's final answer passes (the one
    answer of a unary request; a ``RequestFailed`` or a ``final`` response when
    ``streaming``): what keeps a request's client regions in use until it is answered."""

    def deliver(answer: Answer) -> None:
        if not streaming or isinstance(answer, RequestFailed) or answer.final:
            release()
        sink(answer)

    return deliver


@dataclass(slots=True)
class _Request:
    """A registered request (never changed: not frozen only because a frozen dataclass's
    ``__init__`` sets each field through ``object.__setattr__``, slower per request)."""

    sink: Sink
    block: BlockRef | None
    """The request's input block (ours), freed after its last answer."""
    streaming: bool
    """A decoupled model's request: answers until a final one."""


class PendingTable:
    """request id -> (sink, input block); query id -> future.

    Args:
        cache: the attached arenas, to free blocks in.
        first_id: the first request or query id (``FrontendSpec.first_request_id``).
    """

    def __init__(self, cache: SegmentCache, first_id: int = 1) -> None:
        self._cache = cache
        self._requests: dict[int, _Request] = {}
        self._queries: dict[int, asyncio.Future[StatsReply | QueueReply]] = {}
        self._ids = itertools.count(first_id)
        self._streams: dict[Hashable, dict[int, None]] = {}
        """order key -> request ids not yet released, in send order (an ordered set)."""
        self._stream_of: dict[int, Hashable] = {}
        self._held: dict[int, InferResponse] = {}
        """Responses waiting for an earlier request of their stream."""
        self._idle = asyncio.Event()
        self._idle.set()
        self._inputs_held: dict[int, BlockRef] = {}
        """request id -> its input block, which its answer's outputs name (``_free_input``):
        freed when that response is released."""
        self.shared = SharedBlocks()
        """Blocks several responses of an ensemble request share (``release``)."""
        self.on_unknown: Callable[[], bool] | None = None
        """Called when an answer names a request id not registered: registers what another
        producer submitted and has not registered yet (the native known path: the gRPC
        thread sends a request and queues its registration, which the event loop may not
        have taken when the answer is read, ``frontend.native.handoff``); True when it
        registered some (the lookup is tried again). None: such an answer is an orphan."""
        self.copied_bytes = {"in": 0, "out": 0, "out_in_place": 0}
        """Tensor bytes this frontend copied into its arena (``in``) and out of arenas into
        answers (``out``), and output bytes its native answers sent from the workers' arenas,
        or from the request's own input block, without a copy (``out_in_place``,
        ``frontend/native/held_block.h``):
        ``triton_mp_frontend_tensor_bytes_total``. An ensemble's intermediate tensors never
        count here."""

    def __len__(self) -> int:
        return len(self._requests)

    def new_id(self) -> int:
        """A fresh request or query id (unique within this frontend)."""
        return next(self._ids)

    def reserve(self, n: int) -> int:
        """``n`` consecutive fresh ids for a producer that registers its requests later
        (``add_request``, or ``on_unknown`` before an answer): the first of them.
        ``new_id`` and ``new_query`` never give any of ``first .. first + n - 1``."""
        if n < 1:
            raise ValueError(f"reserve needs n >= 1, got {n}")
        first = next(self._ids)
        self._ids = itertools.count(first + n)
        return first

    def add_request(
        self,
        request_id: int,
        block: BlockRef | None,
        sink: Sink,
        *,
        order: Hashable = None,
        streaming: bool = False,
    ) -> None:
        """Register a request (``new_id``) whose inputs are in ``block``.

        Args:
            sink: gets the request's answers (loop thread), the final one last.
            order: None, or the stream (model, version) whose responses must be released in
                request order (``preserve_ordering``; unary requests only). Register in the
                order of sending.
            streaming: a decoupled model's request (zero or more responses, then a final).
        """
        self._requests[request_id] = _Request(sink, block, streaming)
        self._idle.clear()
        if order is not None and not streaming:
            self._streams.setdefault(order, {})[request_id] = None
            self._stream_of[request_id] = order

    def forget_request(self, request_id: int) -> None:
        """Drop a request that was never sent, freeing its input block."""
        entry = self._pop(request_id)
        if entry is not None:
            self.free(entry.block)
        self._leave_stream(request_id)

    def new_query(self) -> tuple[int, asyncio.Future[StatsReply | QueueReply]]:
        """Register a query to the scheduler (statistics, queues); returns (query id, future)."""
        qid = next(self._ids)
        fut: asyncio.Future[StatsReply | QueueReply] = asyncio.get_running_loop().create_future()
        self._queries[qid] = fut
        return qid, fut

    def forget_query(self, query_id: int) -> None:
        """Drop a query nobody waits for any more (timed out, client gone)."""
        self._queries.pop(query_id, None)

    def free(self, block: BlockRef | tuple[BlockRef, ...] | None) -> None:
        """Mark a block FREE in its arena (inputs: ours; outputs: a worker's), or each of
        a response's blocks (``InferResponse.blocks``: an ensemble's come from its steps)."""
        if block is None:
            return
        for b in block if isinstance(block, tuple) else (block,):
            self._free_one(b)

    def _free_one(self, b: BlockRef) -> None:
        try:
            seg = self._cache.get(b.segment)
        except SegmentGone:
            return  # NOTE: its owner died and its arenas went with it: nothing to free.
        free_block(seg, b)

    def release(self, msg: InferResponse) -> None:
        """Free a response's blocks: we are done with it (copied out, failed, dropped).
        Call once per response; a block it shares with other responses is freed after the
        last of them and its handoff (``ipc.tensor_pool.SharedBlocks``); an input block
        its outputs name (``_free_input``) with it."""
        for b in self.shared.released(msg):
            self._free_one(b)
        if self._inputs_held:
            block = self._inputs_held.pop(msg.request_id, None)
            if block is not None:
                self._free_one(block)

    def _free_input(self, block: BlockRef | None, msg: Answer) -> None:
        """Free a request's input ``block`` as its (last) answer ``msg`` arrives, or, when an
        output of ``msg`` names the block's segment (the worker answered it from the
        request's own input block: only that request's block of this process's arena can
        be named there), when ``msg`` is released (``release``)."""
        if block is not None and type(msg) is InferResponse:
            segment = block.segment
            for ref in msg.outputs:
                if ref.segment == segment and not ref.region_id:
                    self._inputs_held[msg.request_id] = block
                    return
        self.free(block)

    async def wait_idle(self) -> None:
        """Return once no request is pending (at once when none is)."""
        await self._idle.wait()

    def deliver(self, msgs: Iterable[Answer | AnswerBatch | StatsReply | QueueReply]) -> None:
        """Hand every answer in ``msgs`` to its request or query (loop thread only). An
        ``AnswerBatch`` hands its block over first (``SharedBlocks``: freed after the last of
        its responses is released), then its responses one by one."""
        for msg in msgs:
            if isinstance(msg, AnswerBatch):
                self.free(tuple(self.shared.arrived(msg)))
                self.deliver(msg.responses)
                continue
            if isinstance(msg, _QUERY_REPLIES):
                qfut = self._queries.pop(msg.query_id, None)
                if qfut is not None and not qfut.done():
                    qfut.set_result(msg)
                continue
            if msg.handoffs:
                self.free(tuple(self.shared.arrived(msg)))
            entry = self._requests.get(msg.request_id)
            if entry is not None and entry.streaming:
                if isinstance(msg, RequestFailed) or msg.final:
                    self._pop(msg.request_id)
                    self._free_input(entry.block, msg)
                self._hand(entry.sink, msg)
                continue
            self._deliver_unary(msg)

    def _deliver_unary(self, msg: Answer) -> None:
        order = self._stream_of.get(msg.request_id)
        if order is None:
            self._resolve(msg)
            return
        stream = self._streams[order]
        if isinstance(msg, InferResponse) and next(iter(stream)) != msg.request_id:
            self._held[msg.request_id] = msg  # an earlier request is still running
            return
        self._resolve(msg)
        self._leave_stream(msg.request_id)
        # release the responses that were waiting only for this one
        while stream and (held := self._held.pop(next(iter(stream)), None)) is not None:
            self._resolve(held)
            self._leave_stream(held.request_id)

    def _pop(self, request_id: int) -> _Request | None:
        entry = self._requests.pop(request_id, None)
        if not self._requests:
            self._idle.set()
        return entry

    def _leave_stream(self, request_id: int) -> None:
        order = self._stream_of.pop(request_id, None)
        if order is not None:
            stream = self._streams[order]
            stream.pop(request_id, None)
            if not stream:
                del self._streams[order]

    def _resolve(self, msg: Answer) -> None:
        entry = self._pop(msg.request_id)
        if entry is None and self.on_unknown is not None and self.on_unknown():
            entry = self._pop(msg.request_id)
        if entry is None:
            # NOTE: an answer for a request already failed (e.g. worker restart race), or
            # for a request of the dead frontend this one replaced: its blocks are freed.
            if isinstance(msg, InferResponse):
                self.release(msg)
            return
        self._free_input(entry.block, msg)
        self._hand(entry.sink, msg)

    def _hand(self, sink: Sink, msg: Answer) -> None:
        try:
            sink(msg)
        except Exception:  # noqa: BLE001 - one request's fault must not stop delivery
            log.exception("delivering an answer of request %d failed", msg.request_id)
            if isinstance(msg, InferResponse):
                self.release(msg)
