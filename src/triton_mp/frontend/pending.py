"""Requests and queries a frontend is waiting on, and delivery of their answers.

Imported by the frontend only. The event loop drains the inbox when its FIFO wakes it and
calls ``deliver`` with everything drained, on the loop thread. The frontend frees its own
input block when a request's answer arrives (by then the worker has stopped reading it), and
frees a worker's output block at once when nobody waits for it any more (the client went away).

``preserve_ordering`` (``dynamic_batching.preserve_ordering``): a request sent with an
``order`` key joins that key's stream; its response is held until every earlier request of
the stream has been answered, so responses leave in the order the requests arrived even when
several instances finish out of order. Errors are released at once (Triton answers rejections
and timeouts outside the order too). Ordering is per frontend process: one client connection
is served by one frontend.

Requests of decoupled models (``new_stream_request``) get zero or more responses then a final
one: each is handed to the request's callback as it arrives, and the request (with its input
block) is forgotten after the final one (``InferResponse.final``, or a ``RequestFailed``).
The callback owns each response's output block and must free it (``free``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Hashable, Iterable

from triton_mp.ipc import BlockRef, SegmentCache, free_block
from triton_mp.ipc.messages import InferResponse, QueueReply, RequestFailed, StatsReply

log = logging.getLogger(__name__)


class PendingTable:
    """request id -> (future, input block); query id -> future."""

    def __init__(self, cache: SegmentCache) -> None:
        self._cache = cache
        self._requests: dict[
            int, tuple[asyncio.Future[InferResponse | RequestFailed], BlockRef]
        ] = {}
        self._queries: dict[int, asyncio.Future[StatsReply | QueueReply]] = {}
        self._ids = itertools.count(1)
        self._streams: dict[Hashable, dict[int, None]] = {}
        """order key -> request ids not yet released, in send order (an ordered set)."""
        self._stream_of: dict[int, Hashable] = {}
        self._held: dict[int, InferResponse] = {}
        """Responses waiting for an earlier request of their stream."""
        self._decoupled: dict[
            int, tuple[Callable[[InferResponse | RequestFailed], None], BlockRef]
        ] = {}

    def __len__(self) -> int:
        return len(self._requests) + len(self._decoupled)

    def new_stream_request(
        self, block: BlockRef, on_message: Callable[[InferResponse | RequestFailed], None]
    ) -> int:
        """Register a request of a decoupled model whose inputs are in ``block``; returns
        its id. ``on_message`` gets every response (loop thread), the final one last."""
        rid = next(self._ids)
        self._decoupled[rid] = (on_message, block)
        return rid

    def new_request(
        self, block: BlockRef, order: Hashable = None
    ) -> tuple[int, asyncio.Future[InferResponse | RequestFailed]]:
        """Register a request whose inputs are in ``block``; returns (request id, future).

        Args:
            order: None, or the stream (model, version) whose responses must be released in
                request order (``preserve_ordering``). Register in the order of sending.
        """
        rid = next(self._ids)
        fut: asyncio.Future[InferResponse | RequestFailed] = (
            asyncio.get_running_loop().create_future()
        )
        self._requests[rid] = (fut, block)
        if order is not None:
            self._streams.setdefault(order, {})[rid] = None
            self._stream_of[rid] = order
        return rid, fut

    def forget_request(self, request_id: int) -> None:
        """Drop a request that was never sent, freeing its input block."""
        entry = self._requests.pop(request_id, None)
        if entry is not None:
            self.free(entry[1])
        stream = self._decoupled.pop(request_id, None)
        if stream is not None:
            self.free(stream[1])
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

    def free(self, block: BlockRef | None) -> None:
        """Mark a block FREE in its arena (inputs: ours; outputs: a worker's)."""
        if block is not None:
            free_block(self._cache.get(block.segment).buf, block.offset)

    def deliver(
        self, msgs: Iterable[InferResponse | RequestFailed | StatsReply | QueueReply]
    ) -> None:
        """Resolve the futures of every answer in ``msgs`` (loop thread only)."""
        for msg in msgs:
            if isinstance(msg, StatsReply | QueueReply):
                qfut = self._queries.pop(msg.query_id, None)
                if qfut is not None and not qfut.done():
                    qfut.set_result(msg)
                continue
            stream_entry = self._decoupled.get(msg.request_id)
            if stream_entry is not None:
                if isinstance(msg, RequestFailed) or msg.final:
                    del self._decoupled[msg.request_id]
                    self.free(stream_entry[1])
                try:
                    stream_entry[0](msg)
                except Exception:  # noqa: BLE001 - one stream's fault must not stop delivery
                    log.exception("delivering a response of request %d failed", msg.request_id)
                    if isinstance(msg, InferResponse):
                        self.free(msg.block)
                continue
            order = self._stream_of.get(msg.request_id)
            if order is None:
                self._resolve(msg)
                continue
            stream = self._streams[order]
            if isinstance(msg, InferResponse) and next(iter(stream)) != msg.request_id:
                self._held[msg.request_id] = msg  # an earlier request is still running
                continue
            self._resolve(msg)
            self._leave_stream(msg.request_id)
            # release the responses that were waiting only for this one
            while stream and (held := self._held.pop(next(iter(stream)), None)) is not None:
                self._resolve(held)
                self._leave_stream(held.request_id)

    def _leave_stream(self, request_id: int) -> None:
        order = self._stream_of.pop(request_id, None)
        if order is not None:
            stream = self._streams[order]
            stream.pop(request_id, None)
            if not stream:
                del self._streams[order]

    def _resolve(self, msg: InferResponse | RequestFailed) -> None:
        entry = self._requests.pop(msg.request_id, None)
        out_block = msg.block if isinstance(msg, InferResponse) else None
        if entry is None:
            # NOTE: an answer for a request already failed (e.g. worker restart race).
            self.free(out_block)
            return
        fut, in_block = entry
        self.free(in_block)
        if fut.done():
            self.free(out_block)
        else:
            fut.set_result(msg)
